"""Command-line options shared by `uerl eval` and `uerl local eval` (same evaluation code path)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.commands.arg_types import positive_float, positive_int
from training.commands.writable import check_writable_file
from training.run import checkpoints
from training.run.evaluation import REPORT_NAME, EvalOptions


def add_eval_args(parser: argparse.ArgumentParser, *, checkpoint_required: bool = True) -> None:
    group = parser.add_argument_group("evaluation")
    group.add_argument(
        "--opponent",
        metavar="WHO",
        help="self-play checkpoints: the learner plays random, snapshot:N or the learner of "
        "another checkpoint (a path); the report counts its wins. A snapshot or checkpoint "
        "samples its actions, as opponents do in the league",
    )
    group.add_argument(
        "--opponent-deterministic",
        action="store_true",
        help="the --opponent snapshot or checkpoint takes its most likely action instead",
    )
    group.add_argument(
        "--checkpoint",
        type=Path,
        required=checkpoint_required,
        metavar="DIR",
        help="a checkpoint, or a checkpoint directory (its newest checkpoint)",
    )
    group.add_argument(
        "--episodes", type=positive_int, default=10, metavar="N", help="episodes (10)"
    )
    group.add_argument(
        "--explore",
        action="store_true",
        help="sample actions from the policy's distribution (default: deterministic)",
    )
    group.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help=f"JSON report (default <checkpoint>/{REPORT_NAME}, eval-explore.json with --explore)",
    )
    group.add_argument("--seed", type=int)
    group.add_argument("--preflight-timeout", type=positive_float, default=30.0, metavar="S")
    group.add_argument(
        "--request-timeout", type=positive_float, default=5.0, metavar="S", help="per game RPC (5)"
    )
    group.add_argument(
        "--fault-wait",
        type=positive_float,
        default=2.0,
        metavar="S",
        help="while a game is down, each sample of its runner waits this long for it (2)",
    )
    group.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="fail when the episodes have not finished within S seconds (600)",
    )
    group.add_argument(
        "--verbose",
        action="store_true",
        help="also print Ray's and RLlib's own output (default: only to <report>-ray.log)",
    )


def eval_options_from_args(
    args: argparse.Namespace, *, checkpoint: Path, ray_address: str | None = None
) -> EvalOptions:
    default_name = "eval-explore.json" if args.explore else REPORT_NAME
    report_path = args.output or checkpoint / default_name
    what = "--output" if args.output else "the report (default: in the checkpoint; --output)"
    check_writable_file(report_path, what)
    checkpoints.check_loadable(checkpoint, flag="--checkpoint")
    return EvalOptions(
        checkpoint=checkpoint,
        episodes=args.episodes,
        explore=args.explore,
        report_path=report_path,
        preflight_timeout_s=args.preflight_timeout,
        request_timeout_s=args.request_timeout,
        fault_wait_s=args.fault_wait,
        timeout_s=args.timeout,
        ray_address=ray_address,
        seed=args.seed,
        verbose=args.verbose,
        opponent=args.opponent,
        opponent_deterministic=args.opponent_deterministic,
    )
