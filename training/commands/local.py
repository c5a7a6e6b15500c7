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
import sys
from collections.abc import Sequence
from pathlib import Path

from training.commands.training_options import add_training_args, options_from_args

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
    games.add_argument(
        "--game-restarts",
        type=int,
        default=10,
        metavar="N",
        help="restart a game that exits at most N times, then stop training (10)",
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
    from training.local.topology import StackConfigError, load_topology
    from training.rllib.hparams import HyperparameterError
    from training.run.checkpoints import CheckpointError

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
    from training.local.session import run_local

    return run_local(
        topology,
        options,
        env_id=args.env,
        envs_per_game=args.envs,
        base_port=args.base_port,
        prog=PROG,
        max_game_restarts=args.game_restarts,
    )
