"""`uerl runs`: a stack's stored runs from this machine, no kubectl.

    uerl runs list [--stack NAME | --endpoints FILE | --dir DIR] [--json]
    uerl runs pull RUN [--stack NAME | --endpoints FILE | --dir DIR] [--to DIR] [--latest]
                   [--replace | --follow [--interval SECONDS]]
    uerl runs pack RUN --dir DIR [--latest] [--manifest | --only PATH ...]

`list` and `pull` read the stack's run storage (endpoints `runs`): the runs claim through
the Ray head pod (an exec by the Kubernetes API; --kubeconfig, --context as for
`uerl submit`), or the bucket directly with this machine's AWS credentials. `pull`
brings a run (or with --latest only its latest checkpoint, with its curves, metrics,
events and logs) to `<--to>/<RUN>`, whole or not at all; `uerl export --checkpoint
<--to>/<RUN>/checkpoints` and `uerl eval` take it from there, and TensorBoard reads its
events. `pull --follow` keeps `<--to>/<RUN>` in step with a run while it trains (every
--interval seconds, only what is new or changed, nothing of the copy deleted) and ends
when the run does, or at Ctrl-C (exit 0 both), with one line saying what it copied:
`tensorboard --logdir <--to>/<RUN>` beside it shows the curves live. `list --dir`,
`pull --dir` and `pack` read a directory on the machine they run on: the head runs
`list` and `pack` for `list` and `pull` of a claim (`pack` writes a tar to standard
output; `--manifest` the run's files as JSON instead, for a follow). Bad input (a
store's configuration included) exits 2, a cluster or store that does not answer 1,
each with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training import exit_status
from training.commands.arg_types import run_name
from training.commands.writable import (
    OutputRefused,
    check_room,
    check_writable_dir,
    write_failed,
)
from training.runs.follow import DEFAULT_INTERVAL_S
from training.runstore.location import RUN_NAME_LIMITS

PROG = "uerl runs"


def _source(parser: argparse.ArgumentParser, *, local: bool) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--stack",
        metavar="NAME",
        help="the stack whose runs to read: `pulumi stack output endpoints --json --stack "
        "NAME` (in the current directory, the Pulumi project)",
    )
    group.add_argument(
        "--endpoints",
        metavar="FILE",
        type=Path,
        help="the stack's endpoints: `pulumi stack output endpoints --json > FILE`",
    )
    if local:
        group.add_argument(
            "--dir",
            metavar="DIR",
            type=Path,
            help="the runs in a directory on this machine (it must exist): a runs claim "
            "mounted here, or a run storage's directory",
        )
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        type=Path,
        help="kubeconfig file, for a runs claim (default: $KUBECONFIG, else ~/.kube/config)",
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="List a stack's stored runs and pull one to this machine, from its runs "
        "claim (through the Ray head pod) or its bucket; no kubectl.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="list|pull|pack")
    listing = commands.add_parser("list", help="the stored runs, oldest first")
    _source(listing, local=True)
    listing.add_argument("--json", action="store_true", help="print JSON, a list of runs")
    pull = commands.add_parser("pull", help="bring a run to this machine")
    pull.add_argument(
        "run",
        metavar="RUN",
        type=run_name,
        help=f"the run's name (`uerl runs list`): {RUN_NAME_LIMITS}",
    )
    _source(pull, local=True)
    pull.add_argument(
        "--to",
        metavar="DIR",
        type=Path,
        default=Path("runs"),
        help="where the run goes, as DIR/RUN (default: runs): a directory this user can "
        "write in (made if absent), with room for the run; checked before anything is read",
    )
    pull.add_argument(
        "--latest",
        action="store_true",
        help="only the latest checkpoint of the run's checkpoints (and all else it wrote)",
    )
    again = pull.add_mutually_exclusive_group()
    again.add_argument("--replace", action="store_true", help="replace an earlier pull of RUN")
    again.add_argument(
        "--follow",
        action="store_true",
        help="keep DIR/RUN in step with the run while it trains (an earlier pull is "
        "updated in place): polls the store every --interval seconds, copies only new or "
        "changed files, deletes nothing of the copy; ends when the run ends (its writer's "
        "lease is gone) or at Ctrl-C, exit 0 both. `tensorboard --logdir DIR/RUN` beside "
        "it shows the curves as they grow",
    )
    pull.add_argument(
        "--interval",
        metavar="SECONDS",
        type=_interval,
        help=f"with --follow: seconds between two polls of the store (default "
        f"{DEFAULT_INTERVAL_S:g}, at least 1)",
    )
    pack = commands.add_parser(
        "pack", help="(for `uerl runs` on the Ray head) a run under --dir as a tar on stdout"
    )
    pack.add_argument("run", metavar="RUN", type=run_name)
    pack.add_argument("--dir", metavar="DIR", type=Path, required=True)
    pack.add_argument("--latest", action="store_true")
    what = pack.add_mutually_exclusive_group()
    what.add_argument(
        "--manifest",
        action="store_true",
        help="print the run's files (size, time) and its writer's lease as JSON, no tar",
    )
    what.add_argument(
        "--only",
        metavar="PATH",
        nargs="+",
        help="pack only these files of the run (DIR/: all below DIR)",
    )
    return parser


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 1.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: at least 1 second, and finite")
    return value


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if getattr(args, "interval", None) is not None and not args.follow:
        parser.error("--interval: only with --follow")
    from training.runstore.location import RunStorageError, RunStorageUnavailable
    from training.submit.submit_error import BAD_INPUT, SubmitError

    try:
        if args.command == "pack":
            return _pack(args)
        if args.command == "list":
            return _list(args)
        return _pull(args)
    except SubmitError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except (RunStorageError, OutputRefused) as exc:  # the user's to mend: the field or flag
        print(f"{PROG}: {exc}", file=sys.stderr)
        return BAD_INPUT
    except RunStorageUnavailable as exc:  # the store did not answer: try again
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.FAILED
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return exit_status.INTERRUPTED


def _pack(args: argparse.Namespace) -> int:
    from training.runstore import listing

    try:
        if args.manifest:
            print(json.dumps(listing.manifest(args.dir, args.run)))
            return exit_status.OK
        latest, files = listing.plan(args.dir, args.run, latest_only=args.latest, only=args.only)
    except FileNotFoundError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    if args.only is not None and not listing.selected(
        f"{listing.CHECKPOINTS}/{listing.LATEST}", args.only
    ):
        latest = None  # the pointer was not asked for
    listing.pack(args.dir, args.run, latest, files, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return exit_status.OK


def _store(args: argparse.Namespace) -> Any:
    """The stack's run storage reader: ClaimRuns, BucketRuns, or DirectoryRuns (--dir)."""
    if getattr(args, "dir", None) is not None:
        from training.runs.directory_reader import DirectoryRuns

        return DirectoryRuns(args.dir)
    from training.submit import stack_endpoints
    from training.submit.submit_error import BAD_INPUT, SubmitError

    endpoints = stack_endpoints.endpoints_from(args.endpoints, args.stack)
    if endpoints.runs is None:
        raise SubmitError(
            "the endpoints name no run storage (`runs`): the stack predates it; "
            "`pulumi up` with this uerl adds it",
            BAD_INPUT,
        )
    if endpoints.runs.uri.startswith("s3://"):
        from training.runs.bucket_reader import BucketRuns

        return BucketRuns(endpoints.runs)
    from training.runs.claim_reader import ClaimRuns
    from training.submit.head import kube_api_client

    return ClaimRuns.on_cluster(endpoints, kube_api_client(args.kubeconfig, args.context))


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) if seconds else "-"


def table(runs: list[Any]) -> str:
    from training.runs.transfer import mib

    header = ("run", "checkpoint", "iteration", "env steps", "updated (UTC)", "size")
    rows = [
        (
            run.name,
            run.checkpoint or "-",
            "-" if run.iteration is None else str(run.iteration),
            "-" if run.env_steps is None else str(run.env_steps),
            _when(run.updated),
            mib(run.size),
        )
        for run in runs
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {2, 3, 5}
    return "\n".join(
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in [header, *rows]
    )


def _list(args: argparse.Namespace) -> int:
    if args.dir is not None:
        from training.runstore.listing import list_runs
        from training.runstore.location import RunStorageError

        # A mistyped directory is no empty run storage: "0 run(s)" would say it is.
        if not args.dir.is_dir():
            why = "is not a directory" if args.dir.exists() else "no such directory"
            raise RunStorageError(f"--dir {args.dir}: {why}")
        runs, where = list_runs(args.dir), str(args.dir)
    else:
        store = _store(args)
        runs = store.list()
        where = store.where
    if args.json:
        print(json.dumps([run.to_json() for run in runs]))
        return 0
    if runs:
        print(table(runs))
    print(f"{len(runs)} run(s) in {where}", file=sys.stderr)
    return 0


def _pull(args: argparse.Namespace) -> int:
    from training.runs.transfer import into_place
    from training.runstore.location import RunStorageError

    check_writable_dir(args.to, "--to")  # before the store: a pull that cannot land costs none
    store = _store(args)
    if args.follow:
        return _follow(args, store)
    runs = {run.name: run for run in store.list()}
    if args.run not in runs:
        known = ", ".join(sorted(runs)) or "none"
        raise RunStorageError(f"RUN {args.run!r}: no such run in {store.where} (runs: {known})")
    summary = runs[args.run]
    total = None if args.latest else summary.size
    if total is not None:
        hint = "free space there, give another --to, or pull only its latest checkpoint (--latest)"
        check_room(args.to, "--to", needed=total, needs="the run is", hint=hint)
    try:
        target = into_place(
            args.to,
            args.run,
            replace=args.replace,
            fill=lambda into: store.pull(args.run, into, latest_only=args.latest, total=total),
        )
    except OSError as exc:
        if exc.errno is None:  # not this machine's disk
            raise
        raise write_failed(args.to, "--to", exc) from None
    pointer = target / "checkpoints" / "latest"
    latest = pointer.read_text().strip() if pointer.is_file() else None
    checkpoint = f" (checkpoint {latest})" if latest else ""
    print(f"{PROG}: pulled {args.run}{checkpoint} from {store.where} to {target}", file=sys.stderr)
    if latest:
        print(f"{PROG}: next: uerl export --checkpoint {target / 'checkpoints'}", file=sys.stderr)
    return 0


def _took(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _follow(args: argparse.Namespace, store: Any) -> int:
    """`pull --follow`: to the run's end or Ctrl-C, then one line; exit 0 both."""
    import signal

    from training.runs.follow import FollowReport, follow
    from training.runs.transfer import mib

    target = args.to / args.run
    interval = DEFAULT_INTERVAL_S if args.interval is None else args.interval
    report = FollowReport()
    # A second Ctrl-C while the summary is said is no traceback.
    print(
        f"{PROG}: following {args.run} in {store.where} into {target} every {interval:g} s "
        f"(Ctrl-C to stop); `tensorboard --logdir {target}` shows its curves as they grow",
        file=sys.stderr,
        flush=True,
    )
    try:
        follow(
            store,
            args.run,
            target,
            interval_s=interval,
            latest_only=args.latest,
            log=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True),
            report=report,
        )
    except OSError as exc:
        if exc.errno is None:  # not this machine's disk
            raise
        raise write_failed(args.to, "--to", exc) from None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end = "the run has ended" if report.finished else "stopped (Ctrl-C)"
    print(
        f"{PROG}: {end}: {report.files} file(s), {mib(report.bytes)} copied to {target} in "
        f"{report.polls} poll(s) over {_took(report.seconds())}",
        file=sys.stderr,
        flush=True,
    )
    return 0
