"""How a training run ends for the user: a summary, or one clear message, and an exit code.

Exit status: 0 done, 1 preflight/discovery/training failure or gave up on the
games (after a final checkpoint), 130 stopped by Ctrl-C/SIGTERM (after a final
checkpoint).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from infra.endpoints import Endpoints
from training import exit_status
from training.run.driver import TrainOptions, TrainResult, run_training
from training.run.stop import StopRequest
from training.runstore.lease import LeaseLost

# Where a failure that is no user error leaves its traceback (its message names it).
TRACEBACK_NAME = "traceback.txt"


def train_and_report(
    endpoints: Endpoints,
    options: TrainOptions,
    *,
    stop: StopRequest,
    prog: str,
    store: Callable[[], float | None] | None = None,
    fence: Callable[[], None] | None = None,
) -> int:
    """Run the training code path; failures become one clear message and an exit code.
    `store`: called whenever the run wrote artefacts (a bucket's mirror uploads them);
    `fence`: before each write (the run's lease)."""
    from training.run.failures import describe

    try:
        result = run_training(endpoints, options, stop=stop, store=store, fence=fence)
    except LeaseLost as exc:  # another writer's run now: no traceback written into it
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        return exit_status.FAILED
    except KeyboardInterrupt:
        print(f"{prog}: aborted by {stop.signal_name or 'KeyboardInterrupt'}", file=sys.stderr)
        return exit_status.INTERRUPTED
    except Exception as exc:
        print(
            f"{prog}: {describe(exc, traceback_file=options.run_dir / TRACEBACK_NAME)}",
            file=sys.stderr,
        )
        return exit_status.FAILED
    print(summary(result), flush=True)
    if result.failure is not None:
        print(f"{prog}: gave up: {result.failure}", file=sys.stderr, flush=True)
        return exit_status.FAILED
    return exit_status.INTERRUPTED if result.interrupted else exit_status.OK


def _ending(result: TrainResult) -> str:
    if result.failure is not None:
        return "stopped"
    return "interrupted" if result.interrupted else "done"


def summary(result: TrainResult) -> str:
    last = result.rows[-1] if result.rows else None
    lines = [
        f"{_ending(result)} in {result.wall_s:.1f}s: "
        f"{len(result.rows)} iteration(s) recorded, {result.env_steps_total:,} env steps, "
        f"best return mean {result.best_return:.1f}"
        + (f", last {last.episode_return_mean:.1f}" if last else "")
    ]
    if result.checkpoint:
        lines.append(f"  checkpoint:     {result.checkpoint}")
    if result.csv_path:
        lines.append(f"  metrics:        {result.csv_path}")
    if result.png_path:
        lines.append(f"  learning curve: {result.png_path}")
    return "\n".join(lines)
