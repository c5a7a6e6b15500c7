"""`uerl local`: the whole topology on this machine, then exactly the `uerl train` code path.

From the dev stack's topology (overridable): a Ray head with 0 CPUs, X learner
nodes and Y worker nodes each with one unit of the custom resource (separate
raylets on 127.0.0.2), Y mock games (+ a discovery instance when networked) on
127.0.0.1, and an endpoints object describing them. Everything started is
stopped on exit, on error and on Ctrl-C/SIGTERM/SIGHUP (and dies with this
process if it is killed).
"""

from __future__ import annotations

import argparse
import atexit
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from training.train_args import add_training_args, options_from_args

if TYPE_CHECKING:
    from infra.topology import Topology
    from training.driver import TrainOptions
    from training.local_games import LocalMockGames

PROG = "uerl local"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the topology on this machine (no Kubernetes, no Docker) and train.",
    )
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
    games.add_argument("--envs", type=int, default=1, help="environments per game (default 1)")
    games.add_argument(
        "--base-port", type=int, help="worker i's game on BASE+i (default: a free block)"
    )
    add_training_args(parser)
    return parser


def _topology_sets(args: argparse.Namespace) -> list[str]:
    sets = list(args.set)
    if args.workers is not None:
        sets.append(f"topology.workers.replicas={args.workers}")
    if args.learners is not None:
        sets.append(f"topology.learners.replicas={args.learners}")
    if args.pattern is not None:
        sets.append(f"topology.pattern={args.pattern}")
    return sets


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from training.checkpoints import CheckpointError
    from training.hparams import HyperparameterError
    from training.stack_config import StackConfigError, load_topology

    try:
        topology = load_topology(
            stack=None if args.topology else args.stack,
            topology_file=args.topology,
            sets=_topology_sets(args),
        )
        options = options_from_args(args, name=f"local-{topology.name}")
    except (StackConfigError, HyperparameterError, CheckpointError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if topology.learners.gpus:
        print(f"{PROG}: no GPUs here: learners run on CPU (topology asks {topology.learners.gpus})")
    return run_local(topology, options, args)


def run_local(topology: Topology, options: TrainOptions, args: argparse.Namespace) -> int:
    from training.commands.train import train_and_report
    from training.local_cluster import LocalClusterError, LocalRayCluster, node_specs
    from training.local_endpoints import local_endpoints
    from training.local_games import LocalGamesError, LocalMockGames
    from training.stop import StopRequest

    run_dir: Path = options.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalRayCluster(
        node_specs(
            learners=topology.learners.replicas,
            learner_cpus=topology.learners.cpus,
            workers=topology.workers.replicas,
            worker_cpus=topology.workers.cpus,
            custom_resource=topology.workers.custom_resource,
        ),
        log_dir=run_dir / "logs",
    )
    games = LocalMockGames(
        workers=topology.workers.replicas,
        env_id=args.env,
        envs_per_game=args.envs,
        run_dir=run_dir / "games",
        base_port=args.base_port,
        discovery_instance=topology.has_dedicated_discovery,
        startup_timeout_s=min(topology.simulator.startup_timeout_s, 120.0),
    )
    # Belt and braces: the `with` blocks stop everything, atexit covers sys.exit paths
    # taken from elsewhere; both stops are idempotent.
    atexit.register(games.stop)
    atexit.register(cluster.stop)
    started = time.monotonic()
    code = 1
    try:
        with StopRequest() as stop:
            print(
                f"{PROG}: {topology.pattern}, {topology.workers.replicas} worker(s), "
                f"{topology.learners.replicas} learner(s); logs in {run_dir}",
                flush=True,
            )
            with games, cluster:
                endpoints = local_endpoints(
                    topology,
                    gcs_address=cluster.address,
                    client_port=cluster.client_port,
                    base_port=games.base_port,
                )
                (run_dir / "endpoints.json").write_text(endpoints.to_json())
                print(
                    f"{PROG}: Ray at {cluster.address}, games "
                    + ", ".join(f"{g.name}={g.endpoint}" for g in games.games)
                    + f" (up in {time.monotonic() - started:.1f}s)",
                    flush=True,
                )
                code = train_and_report(endpoints, options, stop=stop, prog=PROG)
    except KeyboardInterrupt:
        print(f"{PROG}: aborted; everything started was stopped", file=sys.stderr)
        code = 130
    except (LocalClusterError, LocalGamesError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        code = 1
    finally:
        atexit.unregister(cluster.stop)
        atexit.unregister(games.stop)
    _report_games(games, run_dir)
    print(f"{PROG}: finished in {time.monotonic() - started:.1f}s (exit {code})", flush=True)
    return code


def _report_games(games: LocalMockGames, run_dir: Path) -> None:
    """Per-game session and step counts: proof each env runner used its own game."""
    if not games.stats:
        return
    (run_dir / "games.json").write_text(json.dumps(games.stats, indent=2, sort_keys=True))
    for name, stats in sorted(games.stats.items()):
        print(
            f"  {name}: {stats.get('sessions_opened', 0)} session(s), "
            f"{stats.get('steps', 0)} step RPCs, {stats.get('resets', 0)} resets",
            flush=True,
        )
