"""`uerl export`: one ONNX file per policy of a checkpoint, in Schola's inference interface.

Exit status: 0 written and verified, 1 export or verification failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from training.commands.arg_types import non_negative_int, positive_int

PROG = "uerl export"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Write <out>/<policy_id>.onnx for every policy of a checkpoint (named "
        "inputs per observation key, deterministic named outputs per action key, dynamic "
        "batch, opset 21), each checked with onnxruntime against the torch module.",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        metavar="DIR",
        help="a checkpoint, or a checkpoint directory (its newest checkpoint)",
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="where to write (default <checkpoint>/onnx)"
    )
    parser.add_argument(
        "--policy", action="append", metavar="ID", help="only this policy (repeatable)"
    )
    parser.add_argument(
        "--snapshot",
        action="append",
        type=non_negative_int,
        metavar="N",
        help="self-play checkpoints: also export snapshot N of the learner (repeatable)",
    )
    parser.add_argument(
        "--samples",
        type=positive_int,
        default=512,
        help="observations sampled from the game's spaces to verify each file (512)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from training.export.exporter import export_checkpoint, listing
    from training.export.interface import ExportError
    from training.run.checkpoints import CheckpointError, check_loadable, resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(args.checkpoint)
        check_loadable(checkpoint, flag="--checkpoint")
    except CheckpointError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    out = args.out or checkpoint / "onnx"
    try:
        exported = export_checkpoint(
            checkpoint, out, policies=args.policy, snapshots=args.snapshot, samples=args.samples
        )
    except (ExportError, CheckpointError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(listing(exported), flush=True)
    return 0
