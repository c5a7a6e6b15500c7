"""`uerl train`: train against a deployed topology's endpoints.

Exit status: 0 done, 1 preflight/discovery/training failure, 2 bad input,
130 stopped by Ctrl-C/SIGTERM (after a final checkpoint).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from infra.endpoints import Endpoints, EndpointsError
from training.checkpoints import CheckpointError
from training.driver import TrainOptions, run_training
from training.hparams import HyperparameterError
from training.stop import StopRequest
from training.train_args import add_training_args, options_from_args, summary

PROG = "uerl train"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train against the endpoints of a deployed uerl topology "
        "(e.g. `ray job submit --working-dir . -- uerl train` on the head).",
    )
    parser.add_argument(
        "--endpoints",
        metavar="FILE",
        help="`pulumi stack output endpoints --json` (or `pulumi stack output --json`); "
        "default: the ConfigMap mounted on the Ray head",
    )
    parser.add_argument(
        "--ray-address", help="override endpoints.ray.gcs_address (host:port or ray://host:port)"
    )
    add_training_args(parser)
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from training.endpoints_source import load_endpoints

    try:
        endpoints = load_endpoints(args.endpoints)
        options = options_from_args(
            args, name=endpoints.cluster_name, extra={"ray_address": args.ray_address}
        )
    except (EndpointsError, HyperparameterError, CheckpointError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    with StopRequest() as stop:
        return train_and_report(endpoints, options, stop=stop, prog=PROG)


def train_and_report(
    endpoints: Endpoints, options: TrainOptions, *, stop: StopRequest, prog: str
) -> int:
    """Run the training code path; failures become one clear message and an exit code."""
    from training.failures import describe

    try:
        result = run_training(endpoints, options, stop=stop)
    except KeyboardInterrupt:
        print(f"{prog}: aborted by {stop.signal_name or 'KeyboardInterrupt'}", file=sys.stderr)
        return 130
    except Exception as exc:
        print(
            f"{prog}: {describe(exc, traceback_file=options.run_dir / 'traceback.txt')}",
            file=sys.stderr,
        )
        return 1
    print(summary(result), flush=True)
    return 130 if result.interrupted else 0
