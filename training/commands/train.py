"""`uerl train`: train against a deployed topology's endpoints.

Exit status: 0 done, 1 preflight/discovery/training failure or a run storage that did
not answer or did not take the whole run (worth trying again), 2 bad input, 130 stopped
by Ctrl-C/SIGTERM (after a final checkpoint).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from infra.contract import JOB_STOP_GRACE_S
from infra.endpoints import Endpoints, EndpointsError
from training import exit_status
from training.commands.training_options import (
    add_training_args,
    check_flags,
    options_from_args,
    run_name_from_args,
)
from training.rllib.hparams import HyperparameterError
from training.run import checkpoints
from training.run.checkpoints import CheckpointError
from training.run.options import TrainOptions, check_before_start
from training.run.stop import StopRequest
from training.runstore.location import RunStorageUnavailable
from training.runstore.stored_run import StoredRun, open_stored_run

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


def _say(line: str) -> None:
    # Under `ray job submit` stdout is a file; a terminal is not given event lines.
    from training.runstore import events

    text = events.for_stream(line + "\n", sys.stdout)
    if text:
        print(text, end="", flush=True)


def _record_attempt(options: TrainOptions) -> None:
    """A supervised run (`uerl supervise`) notes each attempt in its record, and says it."""
    from training.runstore import attempts

    started = attempts.from_environment()
    if started is None:
        return
    resumed_from = iteration = None
    if options.resume is not None:
        checkpoint = checkpoints.resolve(options.resume, options.checkpoint_dir)
        resumed_from, iteration = checkpoint.name, checkpoints.read_meta(checkpoint).iteration
    attempts.record(options.run_dir, *started, resumed_from=resumed_from, iteration=iteration)
    where = f"from {resumed_from} (iteration {iteration})" if resumed_from else "from the start"
    _say(f"attempt {started[0]} of this run, {where}: {started[1]}")


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from training.run.endpoints_source import endpoints_file

    stored: StoredRun | None = None
    try:
        source = endpoints_file(args.endpoints)
        endpoints = Endpoints.from_file(source)
        run_name = run_name_from_args(args, name=endpoints.cluster_name)
        check_flags(args)  # before the run storage is reached
        # The stack's run storage, unless --run-dir puts the run elsewhere.
        if args.run_dir is None and endpoints.runs is not None:
            stored = open_stored_run(endpoints, run_name, resume=args.resume, log=_say)
            _say(f"run storage: {stored.where}")
        options = options_from_args(
            args,
            name=endpoints.cluster_name,
            extra={"ray_address": args.ray_address, "endpoints_file": source},
            stored_run_dir=stored.run_dir if stored is not None else None,
            say=_say,
        )
        check_before_start(options, num_learners=endpoints.num_learners)
        if stored is not None:
            stored.begin(resumed=options.resume is not None)
        _record_attempt(options)
    except (EndpointsError, HyperparameterError, CheckpointError, ValueError) as exc:
        _refused(stored)
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    except RunStorageUnavailable as exc:  # a store down past the wait: try again later
        _refused(stored)
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.FAILED
    from training.run.outcome import train_and_report

    made = not options.run_dir.exists()  # by this start (the store's: `stored.fresh`)
    try:
        with StopRequest() as stop:
            code = train_and_report(
                endpoints,
                options,
                stop=stop,
                prog=PROG,
                store=stored.sync if stored is not None else None,
                fence=stored.fence if stored is not None else None,
            )
    except BaseException:
        if stored is not None:
            stored.close()
        raise
    if code != 0 and _recorded_nothing(options.run_dir):
        if stored is not None and stored.fresh and not _supervised():
            stored.discard()
            return code
        if stored is None and made:
            shutil.rmtree(options.run_dir, ignore_errors=True)
    return ended(code, stored)


def _supervised() -> bool:
    """An attempt of `uerl supervise`, which keeps the run's record across attempts."""
    from training.runstore import attempts

    return attempts.from_environment() is not None


def _refused(stored: StoredRun | None) -> None:
    """The run's storage after a start refused before training: a run this start began
    leaves nothing (`uerl runs list` would show it, and its name would be taken)."""
    if stored is None:
        return
    if stored.fresh and not _supervised():
        stored.discard()
    else:
        stored.close()


def _recorded_nothing(run_dir: Path) -> bool:
    """The run wrote no iteration's row (so no checkpoint either) and no traceback its
    failure's message names: what is there is the start's logs only."""
    from training.run.driver import CSV_NAME
    from training.run.outcome import TRACEBACK_NAME

    return not (run_dir / CSV_NAME).exists() and not (run_dir / TRACEBACK_NAME).exists()


def said_head_stopping(code: int) -> bool:
    """A run that did not end whole (stopped by the signal, 130, or failed in its final
    checkpoint, 1: the head's stop takes the learners' pods too) while its head stops its
    jobs (its pod's preStop hook marked it) says so as an event, for its supervisor
    (training.runstore.events): the job ends STOPPED either way, and is no person's stop."""
    from training.runstore import events

    marker = Path(tempfile.gettempdir()) / events.HEAD_STOPPING_MARKER
    try:  # a mark of this stop (one left by a container restarted in place is old)
        recent = time.time() - marker.stat().st_mtime < JOB_STOP_GRACE_S + 60
    except OSError:
        recent = False
    if code == exit_status.OK or not recent:
        return False
    print(events.line(events.HEAD_STOPPING), flush=True)
    return True


def ended(code: int, stored: StoredRun | None) -> int:
    """The exit status once the run is stored: a run its store did not take whole is no
    success (1: the job FAILED, and a supervised run resumes from what is stored)."""
    said_head_stopping(code)
    if stored is None or stored.close(code):
        return code
    print(f"{PROG}: the run is not all in {stored.where}", file=sys.stderr)
    return 1 if code == 0 else code
