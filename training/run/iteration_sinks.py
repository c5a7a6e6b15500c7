"""What hears of each iteration of a run besides its own record (`metrics.csv`, the log):
TensorBoard's event file and the driver's Ray metrics. The loop tells each sink in turn;
a new consumer of the run's figures is a sink, not another branch in the loop."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from training.run.metrics import IterationRow
from training.run.tensorboard import TensorBoardWriter
from training.telemetry.ray_metrics import DriverMetrics, IterationFigures, losses


@dataclass(frozen=True)
class Iteration:
    """One finished iteration, as the loop has it."""

    row: IterationRow
    train_result: dict[str, Any]
    # Each runner's latest health report (RunnerHealthBoard.fresh_reports()).
    runner_reports: dict[int, dict[str, Any]]
    rescales: int  # the rescales followed so far in this attempt


class IterationSink(Protocol):
    def iteration(self, done: Iteration) -> None: ...

    def checkpoint_written(self) -> None: ...

    def stored_through(self, iteration: float) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """The run's TensorBoard event file: each iteration's scalars at its env-step count."""

    def __init__(self, run_dir: Path, names: dict[str, str], *, resumed_at: int | None) -> None:
        self._writer = TensorBoardWriter(run_dir, names, resumed_at=resumed_at)

    def iteration(self, done: Iteration) -> None:
        self._writer.write(done.row, done.train_result, done.runner_reports)

    def checkpoint_written(self) -> None:
        pass

    def stored_through(self, iteration: float) -> None:
        pass

    def close(self) -> None:
        self._writer.close()


class MetricsSink:
    """The driver's Ray metrics (docs/training.md): figures, losses, rescales, checkpoints.
    Closing it is its owner's (the gauges outlive the loop until Ray is let go)."""

    def __init__(self, published: DriverMetrics, names: dict[str, str]) -> None:
        self._published = published
        self._names = names

    def iteration(self, done: Iteration) -> None:
        figures = IterationFigures(
            **{f.name: getattr(done.row, f.name) for f in fields(IterationFigures)}
        )
        self._published.iteration(
            figures,
            losses=losses(done.train_result.get("learners") or {}, self._names),
            rescales=done.rescales,
        )

    def checkpoint_written(self) -> None:
        self._published.checkpoint_written()

    def stored_through(self, iteration: float) -> None:
        self._published.stored_through(iteration)

    def close(self) -> None:
        pass
