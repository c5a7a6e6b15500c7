"""`uerl export`: one ONNX file per policy of a checkpoint, in Schola's inference interface.

Exit status: 0 written and verified, 1 export or verification failed, 2 bad input (the
checkpoint, --policy or --snapshot it does not hold, an --out that cannot take the files),
each checked before the modules load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from training import exit_status
from training.commands.arg_types import non_negative_int, positive_int
from training.commands.writable import (
    OutputRefused,
    check_room,
    check_writable_dir,
    write_failed,
)

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
        "--out",
        type=Path,
        metavar="DIR",
        help="where to write (default <checkpoint>/onnx): a directory this user can write "
        "in (made if absent), with room for the files; checked before the modules load",
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="ID",
        help="only this policy of the checkpoint (repeatable; an unknown one is refused "
        "naming those it holds)",
    )
    parser.add_argument(
        "--snapshot",
        action="append",
        type=non_negative_int,
        metavar="N",
        help="self-play checkpoints only: also export snapshot N of the learner "
        "(repeatable; one the league does not hold is refused naming those it does)",
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
    from training.export.exporter import (
        ExportRequestError,
        chosen_policies,
        expected_size,
        export_checkpoint,
        listing,
    )
    from training.export.interface import ExportError
    from training.run.checkpoints import CheckpointError, check_loadable, resolve_checkpoint

    # Everything the user gave, checked before the modules load (seconds, with torch).
    try:
        checkpoint = resolve_checkpoint(args.checkpoint)
        out = args.out or checkpoint / "onnx"
        what = "--out" if args.out else "the ONNX files (default: in the checkpoint; --out)"
        check_writable_dir(out, what)
        chosen = chosen_policies(checkpoint, policies=args.policy, snapshots=args.snapshot)
        needed = expected_size(checkpoint, chosen)
        check_room(out, what, needed=needed, needs="the ONNX files take about")
        check_loadable(checkpoint, flag="--checkpoint")  # unpickles the modules' state
    except (CheckpointError, ExportRequestError, OutputRefused) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    try:
        exported = export_checkpoint(
            checkpoint, out, policies=args.policy, snapshots=args.snapshot, samples=args.samples
        )
    except OSError as exc:
        if exc.errno is None:
            raise
        print(f"{PROG}: {write_failed(out, what, exc)}", file=sys.stderr)
        return exit_status.BAD_INPUT
    except ExportRequestError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    except (ExportError, CheckpointError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.FAILED
    print(listing(exported), flush=True)
    return exit_status.OK
