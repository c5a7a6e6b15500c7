"""`uerl submit`: from this machine, run `uerl train` (or `uerl eval`) on a stack's
cluster as a Ray job, through the Kubernetes API (no `kubectl port-forward` to keep up).

    uerl submit [--stack NAME | --endpoints FILE] [--kubeconfig PATH] [--context NAME]
                [--submission-id ID] [--no-wait] -- train|eval [flags...]
    uerl submit [--stack NAME | --endpoints FILE] ... --supervise [--max-restarts N]
                -- train --run-name RUN [flags...]

It finds the stack's Ray head pod (Running and Ready), forwards a local port to its job
API (found again when the head pod is replaced), submits the command, prints the job's
log as it grows and exits with the job's end: 0 SUCCEEDED, 1 FAILED, 130 STOPPED. Ctrl-C
stops the job (a training writes a final checkpoint) and exits 130; a second Ctrl-C
leaves at once. Bad input exits 2, a cluster it cannot use 1, each with one line.

With --supervise it makes a Kubernetes Job in the stack's namespace running
`uerl supervise` for the run (training.submit.supervisor_job): the run is submitted
from there, and again from its last stored checkpoint whenever the head (or the job) is
lost, until it ends; `uerl submit` exits 0 once the Job is made.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from training import exit_status
from training.commands.arg_types import (
    SUBMISSION_ID_LIMITS,
    ArgumentsRefused,
    non_negative_int,
    parse_for,
    submission_id,
)
from training.supervise.supervisor import MAX_RESTARTS

PROG = "uerl submit"
SUBCOMMANDS = ("train", "eval")
USAGE = (
    f"{PROG} [--stack NAME | --endpoints FILE] [--kubeconfig PATH] [--context NAME] "
    "[--submission-id ID] [--no-wait] [--supervise [--max-restarts N]] -- train|eval [flags...]"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=USAGE,
        description="Run `uerl train` or `uerl eval` as a Ray job on a stack's cluster, "
        "through the Kubernetes API; stream its log, exit with its status (0 SUCCEEDED, "
        "1 FAILED, 130 STOPPED). Ctrl-C stops the job (a training writes a final "
        "checkpoint); a second Ctrl-C leaves it running. The command and its flags go "
        "after `--`; they run on the Ray head, whose endpoints ConfigMap they read.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--stack",
        metavar="NAME",
        help="read the endpoints with `pulumi stack output endpoints --json --stack NAME` "
        "(in the current directory, the Pulumi project)",
    )
    source.add_argument(
        "--endpoints",
        metavar="FILE",
        type=Path,
        help="the endpoints: `pulumi stack output endpoints --json > FILE`",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        type=Path,
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")
    parser.add_argument(
        "--submission-id",
        metavar="ID",
        type=submission_id,
        help=f"the job's submission id (default: Ray picks one): {SUBMISSION_ID_LIMITS}; "
        "not with --supervise, which names each attempt's job uerl-RUN-N",
    )
    parser.add_argument(
        "--supervise",
        action="store_true",
        help="keep the training going across a lost Ray head or learner: a Job in the "
        "stack's namespace submits it, and resubmits it from its last stored checkpoint "
        "whenever it is lost (train only; the run goes to the stack's run storage)",
    )
    parser.add_argument(
        "--max-restarts",
        type=non_negative_int,
        metavar="N",
        help="with --supervise only: restarts in a row without a new checkpoint before "
        f"giving up, 0 or more (default {MAX_RESTARTS})",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="submit, print the submission id and how to follow the job, exit 0",
    )
    return parser


def _split(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`uerl submit`'s own options, and the command after the first `--` (None: none)."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def _check_command(command: list[str] | None) -> str | None:
    """Why the command cannot be submitted (None: it can). Its flags are parsed here with
    the command's own parser, so a typo is refused before anything is submitted."""
    if command is None:
        return "no command: end the options with `--`, then `train ...` or `eval ...`"
    if not command:
        return "no command after `--`: `train ...` or `eval ...`"
    if command[0] not in SUBCOMMANDS:
        return f"unknown command {command[0]!r} after `--`: `train` or `eval`"
    if command[0] == "train":
        from training.commands.train import build_parser as command_parser
    else:
        from training.commands.eval import build_parser as command_parser
    try:
        parsed = parse_for(command_parser(), command[1:])
        if command[0] == "train":
            _check_hyperparameters(parsed)
    except ArgumentsRefused as exc:
        return f"{command[0]} (after `--`): {exc}"
    return None


def _check_hyperparameters(parsed: argparse.Namespace) -> None:
    """The train flags' hyperparameters (--hp, --lr, ...) as `uerl train` will merge them;
    an --hparams file is on the head, where the job runs, and is read there."""
    from training.commands.training_options import merged_hparams
    from training.rllib.hparams import HyperparameterError

    try:
        merged_hparams(argparse.Namespace(**{**vars(parsed), "hparams": None}))
    except HyperparameterError as exc:
        raise ArgumentsRefused(str(exc)) from None


def main(argv: Sequence[str]) -> int:
    options, command = _split(list(argv))
    parser = build_parser()
    # Without `--`, `train` among the options is the likely mistake: say that, not
    # argparse's "unrecognized arguments".
    args = (
        parser.parse_args(options) if command is not None else parser.parse_known_args(options)[0]
    )
    # Options that do not go together first: the command's check may load RLlib (seconds).
    problem = _check_options(args) if command is not None else None
    problem = problem or _check_command(command)
    if problem is not None:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return exit_status.BAD_INPUT
    assert command is not None
    if args.supervise:
        problem = _check_supervised(command)
        problem = problem and f"--supervise: {problem}"
    if problem is not None:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return exit_status.BAD_INPUT
    from training.submit.submit_error import SubmitError

    try:
        return _supervise(args, command) if args.supervise else _submit(args, command)
    except SubmitError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return exit_status.INTERRUPTED


def _check_options(args: argparse.Namespace) -> str | None:
    """Why `uerl submit`'s own options do not go together (None: they do): an option of
    the other mode would be dropped without a word."""
    if args.max_restarts is not None and not args.supervise:
        return "--max-restarts counts a supervisor's restarts: give it with --supervise"
    if args.submission_id is not None and args.supervise:
        return (
            "--submission-id: a supervised run's attempts are jobs uerl-RUN-N, named by the "
            "supervisor; leave it out (or submit without --supervise)"
        )
    return None


def _check_supervised(command: list[str]) -> str | None:
    """Why the command cannot be supervised (None: it can)."""
    if command[0] != "train":
        return "only `train` is supervised (an eval is rerun by hand)"
    from training.commands.supervise import storage_flags_clash
    from training.commands.train import build_parser as train_parser

    args = train_parser().parse_args(command[1:])
    return storage_flags_clash(args, "give --run-name, not --run-dir or --checkpoint-dir")


def _run_name(command: list[str], cluster_name: str) -> tuple[str, list[str]]:
    """The run's name and the train flags without it (the supervisor passes it)."""
    from training.commands.train import build_parser as train_parser
    from training.runstore.location import default_run_name

    name = train_parser().parse_args(command[1:]).run_name
    flags = list(command[1:])
    for i, flag in enumerate(flags):
        if flag == "--run-name":
            del flags[i : i + 2]
            break
        if flag.startswith("--run-name="):
            del flags[i]
            break
    return name or default_run_name(cluster_name), flags


def _supervise(args: argparse.Namespace, command: list[str]) -> int:
    from training.submit import head, stack_endpoints, supervisor_job
    from training.submit.submit_error import BAD_INPUT, CLUSTER_UNUSABLE, SubmitError

    endpoints = stack_endpoints.endpoints_from(args.endpoints, args.stack)
    if endpoints.runs is None:
        raise SubmitError(
            "--supervise: the endpoints name no run storage (`runs`), where every attempt "
            "finds the run: `pulumi up` with this uerl adds it",
            BAD_INPUT,
        )
    run_name, train_args = _run_name(command, endpoints.cluster_name)
    api = head.kube_api_client(args.kubeconfig, args.context)
    list_pods = head.kube_pod_lister(api)
    finder = head.HeadFinder(endpoints, list_pods)
    pod_name = finder.find()
    pod = next(
        p for p in list_pods(finder.namespace, finder.selector) if p["metadata"]["name"] == pod_name
    )
    restarts = MAX_RESTARTS if args.max_restarts is None else args.max_restarts
    job = supervisor_job.build(endpoints, pod, run_name, train_args, max_restarts=restarts)
    name = job["metadata"]["name"]
    from kubernetes.client import BatchV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        BatchV1Api(api).create_namespaced_job(
            endpoints.namespace, job, _request_timeout=head.API_TIMEOUT_S
        )
    except ApiException as exc:
        if exc.status == 409:
            raise SubmitError(
                f"--supervise: run {run_name} has a supervisor already (Job {name} in "
                f"namespace {endpoints.namespace}); give another --run-name, or delete that "
                "Job once its run has ended",
                BAD_INPUT,
            ) from None
        raise SubmitError(head.api_failure(api, exc), CLUSTER_UNUSABLE) from None
    except Exception as exc:  # urllib3's errors, a TLS failure
        raise SubmitError(head.api_failure(api, exc), CLUSTER_UNUSABLE) from None
    print(
        f"{PROG}: run {run_name} is supervised by Job {name} (namespace "
        f"{endpoints.namespace}): it submits `uerl train --run-name {run_name} --resume auto` "
        "now, and again from the last stored checkpoint whenever the head or the job is lost",
        file=sys.stderr,
    )
    print(
        f"{PROG}: follow it with `kubectl -n {endpoints.namespace} logs -f job/{name}`; "
        f"its results with `uerl runs list` and `uerl runs pull {run_name}`",
        file=sys.stderr,
    )
    print(name, flush=True)
    return 0


def _submit(args: argparse.Namespace, command: list[str]) -> int:
    from training.ray_auth.token_client import RAY_AUTH_TOKEN_KEY
    from training.submit import head, job, port_forward, ray_token, stack_endpoints

    endpoints = stack_endpoints.endpoints_from(args.endpoints, args.stack)
    port = stack_endpoints.dashboard_port(endpoints)
    api = head.kube_api_client(args.kubeconfig, args.context)
    finder = head.HeadFinder(endpoints, head.kube_pod_lister(api))
    finder.find()  # before anything else: the head is there and Ready, or say why not
    token = ray_token.read(api, endpoints)
    connection = port_forward.HeadConnection(
        finder.find, port_forward.pod_port_opener(api, endpoints.namespace, port)
    )
    with port_forward.Relay(connection) as relay, job.no_proxy_to_the_relay():

        def describe_head() -> str:
            pod = f"pod {connection.head or finder.current}, {finder.where}"
            error = relay.last_error
            return pod + (f"; last port-forward error: {error}" if error else "")

        client = job.connect_client(
            relay.url, head=describe_head, token=token, token_source=ray_token.where(endpoints)
        )
        job_id = job.submit(client, command, args.submission_id)

        def follow_hint() -> str:
            pod = connection.head or finder.current
            address = "--address http://127.0.0.1:8265"
            secret = endpoints.ray.token_secret
            # Ray's CLI sends RAY_AUTH_TOKEN when RAY_AUTH_MODE is token.
            auth = (
                f"; with `export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(kubectl -n "
                f"{endpoints.namespace} get secret {secret} -o jsonpath="
                f"'{{.data.{RAY_AUTH_TOKEN_KEY}}}' | base64 -d)` first"
                if secret
                else ""
            )
            return (
                f"Follow it with `kubectl -n {endpoints.namespace} port-forward pod/{pod} "
                f"8265:{port}` and `ray job logs {address} --follow {job_id}`; "
                f"stop it with `ray job stop {address} {job_id}`{auth}."
            )

        print(
            f"{PROG}: job {job_id} submitted to the Ray head pod {finder.current} "
            f"(namespace {endpoints.namespace}): {job.entrypoint(command)}",
            file=sys.stderr,
            flush=True,
        )
        if args.no_wait:
            print(job_id, flush=True)
            print(f"{PROG}: {follow_hint()}", file=sys.stderr)
            return 0
        follower = job.Follower(client, job_id, head=describe_head, follow_hint=follow_hint())
        with job.CtrlC() as ctrl_c:
            return follower.run(ctrl_c)
