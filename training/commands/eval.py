"""`uerl eval`: play a checkpoint's policies against a deployed topology's games, no training.

Exit status: 0 done, 1 preflight/discovery/evaluation failure, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from infra.endpoints import EndpointsError
from training import exit_status
from training.commands.eval_options import add_eval_args, eval_options_from_args

PROG = "uerl eval"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run a checkpoint's policies against the games `uerl train` uses "
        "(one env runner per game, no learners) and report per-policy returns. The games "
        "must be free: it refuses to start while a training run holds them.",
    )
    parser.add_argument(
        "--endpoints",
        metavar="FILE",
        help="`pulumi stack output endpoints --json`; default: the ConfigMap on the Ray head",
    )
    parser.add_argument(
        "--ray-address", help="override endpoints.ray.gcs_address (host:port or ray://host:port)"
    )
    add_eval_args(parser)
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from training.run.checkpoints import CheckpointError, resolve_checkpoint
    from training.run.endpoints_source import load_endpoints

    try:
        checkpoint = resolve_checkpoint(args.checkpoint)  # what the user gave, first
        options = eval_options_from_args(args, checkpoint=checkpoint, ray_address=args.ray_address)
        endpoints = load_endpoints(args.endpoints)
    except (EndpointsError, CheckpointError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    from training.run.eval_outcome import eval_and_report

    return eval_and_report(endpoints, options, prog=PROG)
