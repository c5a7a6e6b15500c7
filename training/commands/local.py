"""`uerl local`: the whole topology on this machine, then exactly the `uerl train` code path.

From the dev stack's topology (overridable): a Ray head with 0 CPUs, X learner
nodes and Y worker nodes each with one unit of the custom resource (separate
raylets on 127.0.0.2), Y mock games (+ a discovery instance when networked) on
127.0.0.1, and an endpoints object describing them. Everything started is
stopped on exit, on error and on Ctrl-C/SIGTERM/SIGHUP (and dies with this
process if it is killed).

`uerl local scale N --run-dir DIR` changes the number of workers of the session
running in DIR (games, worker nodes, endpoints.json); its training follows.

`uerl local serve` starts the same topology with the Ray dashboard and keeps it
up until Ctrl-C/SIGTERM, for `ray job submit ... -- uerl train` against it (the
Ray Jobs flow of a deployed cluster, on this machine). `uerl local eval
--checkpoint DIR ...` starts it and runs the `uerl eval` code path instead;
`uerl local --eval-episodes N` evaluates the final checkpoint after training, on
the same games (training has released them).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from training import exit_status
from training.commands.arg_types import non_negative_int, port, positive_float, positive_int
from training.commands.eval_options import add_eval_args, eval_options_from_args
from training.commands.training_options import add_training_args, options_from_args

if TYPE_CHECKING:
    from infra.endpoints import Endpoints
    from infra.topology import Topology
    from training.local.local_game_tls import TLSMode
    from training.local.session import Work
    from training.run.stop import StopRequest

PROG = "uerl local"
EVAL_PROG = "uerl local eval"
SERVE_PROG = "uerl local serve"
SCALE_PROG = "uerl local scale"


def _add_topology_args(parser: argparse.ArgumentParser) -> None:
    topo = parser.add_argument_group("topology (default: the dev stack's)")
    source = topo.add_mutually_exclusive_group()
    source.add_argument("--stack", default="dev", help="read uerl:topology from Pulumi.STACK.yaml")
    source.add_argument("--topology", type=Path, metavar="FILE", help="topology YAML/JSON")
    topo.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="like `uerl render --set`, e.g. topology.workers.cpus=2",
    )
    topo.add_argument("--workers", type=int, help="Y: worker nodes / games / env runners")
    topo.add_argument("--learners", type=int, help="X: learner nodes (0: learn on the driver)")
    topo.add_argument("--pattern", choices=("sidecar", "networked"))
    games = parser.add_argument_group("mock games")
    games.add_argument("--env", default="CartPole-v1", help="gymnasium id the games serve")
    games.add_argument(
        "--envs", type=positive_int, default=1, help="environments per game (default 1)"
    )
    games.add_argument(
        "--base-port", type=port, help="worker i's game on BASE+i (default: a free block)"
    )
    games.add_argument(
        "--tls",
        nargs="?",
        const="server",
        choices=("server", "mutual"),
        help="serve the games over TLS with a throwaway CA (written to the run directory); "
        "`--tls mutual`: env runners present a certificate too. Default: the topology's "
        "simulator.tls decides",
    )
    games.add_argument(
        "--game-restarts",
        type=non_negative_int,
        default=10,
        metavar="N",
        help="restart a game that exits at most N times, then stop training (10)",
    )
    parser.add_argument(
        "--dashboard",
        action="store_true",
        help="start the Ray dashboard (and its job API) on 127.0.0.2; its URL goes into "
        "endpoints.json as ray.dashboard_url",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the topology on this machine (no Kubernetes, no Docker) and train. "
        "`uerl local eval --help`: evaluate a checkpoint on it instead.",
    )
    _add_topology_args(parser)
    add_training_args(parser)
    parser.add_argument(
        "--eval-episodes",
        type=positive_int,
        metavar="N",
        help="after training, evaluate the final checkpoint for N episodes (deterministic)",
    )
    return parser


def build_eval_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=EVAL_PROG,
        description="Run the topology on this machine and evaluate a checkpoint on its games "
        "(the `uerl eval` code path), without training.",
    )
    _add_topology_args(parser)
    parser.add_argument("--run-dir", type=Path, help="logs (default runs/local-<name>-eval-<time>)")
    add_eval_args(parser)
    return parser


def _topology_sets(args: argparse.Namespace) -> list[str]:
    """--set, then the shorthand flags as --set; a flag and a --set that give one field
    different values are refused (neither silently wins)."""
    from infra.config_path import ConfigPathError, parse_path, parse_value

    given: dict[tuple[str | int, ...], tuple[str, object]] = {}
    for assignment in args.set:
        path, _, value = assignment.partition("=")
        with contextlib.suppress(ConfigPathError):  # reported where the topology is built
            given[tuple(parse_path(path.strip()))] = (assignment, parse_value(value))
    sets = list(args.set)
    for flag, path, value in (
        ("--workers", "topology.workers.replicas", args.workers),
        ("--learners", "topology.learners.replicas", args.learners),
        ("--pattern", "topology.pattern", args.pattern),
    ):
        if value is None:
            continue
        other = given.get(tuple(path.split(".")))
        if other is not None and other[1] != value:
            raise ValueError(
                f"{flag} {value} and --set {other[0]} both set {path}: give one of them"
            )
        sets.append(f"{path}={value}")
    return sets


def _load_topology(args: argparse.Namespace) -> Topology:
    from training.local.local_topology import load_topology

    return load_topology(
        stack=None if args.topology else args.stack,
        topology_file=args.topology,
        sets=_topology_sets(args),
    )


def _run(args: argparse.Namespace, topology: Topology, work: Work, run_dir: Path, prog: str) -> int:
    from training.local.session import run_local

    return run_local(
        topology,
        work,
        run_dir=run_dir,
        env_id=args.env,
        envs_per_game=args.envs,
        base_port=args.base_port,
        prog=prog,
        max_game_restarts=args.game_restarts,
        dashboard=args.dashboard,
        tls=_tls_mode(args, topology),
    )


def _needs_a_game(topology: Topology) -> None:
    if topology.workers.replicas == 0:
        raise ValueError(
            "topology.workers.replicas is 0: a run needs a game to start (discovery asks "
            "one); `uerl local scale 0 --run-dir DIR` pauses a running one instead"
        )


def _tls_mode(args: argparse.Namespace, topology: Topology) -> TLSMode | None:
    """`--tls`, else what the topology asks of its games (a Secret there, a CA here)."""
    if args.tls is not None:
        return args.tls
    spec = topology.simulator.tls
    if spec is None:
        return None
    return "mutual" if spec.mutual else "server"


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv[:1] == ["eval"]:
        return main_eval(argv[1:])
    if argv[:1] == ["serve"]:
        return main_serve(argv[1:])
    if argv[:1] == ["scale"]:
        return main_scale(argv[1:])
    args = build_parser().parse_args(argv)
    from training.local.local_topology import StackConfigError
    from training.rllib.hparams import HyperparameterError
    from training.run.checkpoints import CheckpointError
    from training.run.options import check_before_start

    try:
        topology = _load_topology(args)
        _needs_a_game(topology)
        options = options_from_args(args, name=f"local-{topology.name}")
        check_before_start(options, num_learners=topology.learners.replicas)
        # The session rewrites it on `uerl local scale`; the training follows it.
        options = options.model_copy(update={"endpoints_file": options.run_dir / "endpoints.json"})
        if args.eval_episodes is not None and args.eval_episodes < 1:
            raise ValueError(f"--eval-episodes {args.eval_episodes}: must be at least 1")
    except (StackConfigError, HyperparameterError, CheckpointError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    if topology.learners.gpus:
        print(f"{PROG}: no GPUs here: learners run on CPU (topology asks {topology.learners.gpus})")

    def train_then_eval(endpoints: Endpoints, stop: StopRequest) -> int:
        from training.run.outcome import train_and_report

        code = train_and_report(endpoints, options, stop=stop, prog=PROG)
        if code != 0 or args.eval_episodes is None:
            return code
        from training.run.checkpoints import resolve_checkpoint
        from training.run.eval_outcome import eval_and_report
        from training.run.evaluation import EvalOptions

        eval_options = EvalOptions(
            checkpoint=resolve_checkpoint(options.checkpoint_dir),
            episodes=args.eval_episodes,
            report_path=options.run_dir / "eval.json",
            request_timeout_s=options.request_timeout_s,
            fault_wait_s=options.fault_wait_s,
            seed=options.seed,
        )
        return eval_and_report(endpoints, eval_options, prog=PROG)

    return _run(args, topology, train_then_eval, options.run_dir, PROG)


def main_eval(argv: Sequence[str]) -> int:
    args = build_eval_parser().parse_args(list(argv))
    from training.local.local_topology import StackConfigError
    from training.run.checkpoints import CheckpointError, resolve_checkpoint

    try:
        topology = _load_topology(args)
        _needs_a_game(topology)
        checkpoint = resolve_checkpoint(args.checkpoint)
        options = eval_options_from_args(args, checkpoint=checkpoint)
    except (StackConfigError, CheckpointError, ValueError) as exc:
        print(f"{EVAL_PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    run_dir = args.run_dir or Path("runs") / (
        f"local-{topology.name}-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    )

    def evaluate(endpoints: Endpoints, stop: StopRequest) -> int:
        from training.run.eval_outcome import eval_and_report

        return eval_and_report(endpoints, options, prog=EVAL_PROG)

    return _run(args, topology, evaluate, run_dir, EVAL_PROG)


def build_serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=SERVE_PROG,
        description="Start the topology on this machine with the Ray dashboard (job API) and "
        "keep it up until Ctrl-C/SIGTERM: submit `uerl train` / `uerl eval` to it with "
        "`ray job submit`, exactly as on a deployed cluster.",
    )
    _add_topology_args(parser)
    parser.add_argument("--run-dir", type=Path, help="logs, endpoints.json (default runs/...)")
    return parser


def serve_instructions(dashboard_url: str, endpoints_file: Path) -> str:
    return (
        f"{SERVE_PROG}: serving; submit training with\n"
        f"  ray job submit --address {dashboard_url} --working-dir . -- \\\n"
        f"      uerl train --endpoints {endpoints_file} --run-dir /tmp/uerl-job\n"
        f"{SERVE_PROG}: Ctrl-C stops everything"
    )


def main_serve(argv: Sequence[str]) -> int:
    args = build_serve_parser().parse_args(list(argv))
    args.dashboard = True  # the point of serving: the job API
    from training.local.local_topology import StackConfigError

    try:
        topology = _load_topology(args)
    except (StackConfigError, ValueError) as exc:
        print(f"{SERVE_PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    run_dir = (
        args.run_dir
        or Path("runs") / f"local-{topology.name}-serve-{time.strftime('%Y%m%d-%H%M%S')}"
    ).resolve()

    def serve(endpoints: Endpoints, stop: StopRequest) -> int:
        print(
            serve_instructions(endpoints.ray.dashboard_url, run_dir / "endpoints.json"), flush=True
        )
        try:
            while not stop.requested:
                time.sleep(0.5)
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the way to stop serving
            pass
        return 0

    return _run(args, topology, serve, run_dir, SERVE_PROG)


def build_scale_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=SCALE_PROG,
        description="Change the number of workers (games, worker nodes, env runners) of the "
        "`uerl local` session running in --run-dir, while it trains: the local "
        "`pulumi config set --path topology.workers.replicas N` + `pulumi up`.",
    )
    parser.add_argument("workers", type=int, help="Y: the new number of workers (0 pauses)")
    parser.add_argument(
        "--run-dir", type=Path, required=True, help="the run directory of the session"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=300.0,
        metavar="S",
        help="wait at most S seconds for the session to apply it (300)",
    )
    return parser


def main_scale(argv: Sequence[str]) -> int:
    args = build_scale_parser().parse_args(list(argv))
    from training.local.scaling import ScaleError, request_scale

    try:
        result = request_scale(args.run_dir, args.workers, timeout_s=args.timeout)
    except ScaleError as exc:
        print(f"{SCALE_PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    print(f"{SCALE_PROG}: {result.message}", flush=True)
    return 0 if result.ok else 1
