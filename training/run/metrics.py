"""Per-iteration metrics: the progress line, the CSV and the learning-curve PNG."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from training.runstore import atomic


@dataclass(frozen=True)
class IterationRow:
    iteration: int
    env_steps_total: int
    episodes_total: int
    time_s: float
    env_steps_per_s: float
    episode_return_mean: float  # NaN until an episode has finished
    episode_len_mean: float
    learner_steps_per_s: float
    # Env runners whose game answered at the end of the iteration, of all of them, and
    # those that did not report then (their game's state is unknown).
    runners_healthy: int = 0
    runners_total: int = 0
    runners_unknown: int = 0
    # Self-play: the learning policy's Elo rating after this iteration (NaN otherwise).
    elo: float = math.nan


COLUMNS = [f.name for f in fields(IterationRow)]


def _get(result: dict[str, Any], *path: str, default: float = math.nan) -> float:
    node: Any = result
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    try:
        return float(node)
    except (TypeError, ValueError):
        return default


def row_from_result(result: dict[str, Any], *, previous_steps: int) -> IterationRow:
    """One row from `Algorithm.train()`'s result (new API stack keys)."""
    steps = int(_get(result, "env_runners", "num_env_steps_sampled_lifetime", default=0))
    steps = steps or int(_get(result, "num_env_steps_sampled_lifetime", default=0))
    time_s = _get(result, "time_this_iter_s", default=0.0)
    learner = _get(result, "learners", "__all_modules__", "num_env_steps_trained_throughput")
    if math.isnan(learner):
        # Some algorithms report only module steps: sum them over modules.
        learner = _get(result, "learners", "__all_modules__", "num_module_steps_trained_throughput")
    return IterationRow(
        iteration=int(_get(result, "training_iteration", default=0)),
        env_steps_total=steps,
        episodes_total=int(_get(result, "env_runners", "num_episodes_lifetime", default=0)),
        time_s=time_s,
        env_steps_per_s=(steps - previous_steps) / time_s if time_s > 0 else math.nan,
        episode_return_mean=_get(result, "env_runners", "episode_return_mean"),
        episode_len_mean=_get(result, "env_runners", "episode_len_mean"),
        learner_steps_per_s=learner,
    )


def progress_line(row: IterationRow) -> str:
    ret = "   n/a" if math.isnan(row.episode_return_mean) else f"{row.episode_return_mean:7.1f}"
    learn = "n/a" if math.isnan(row.learner_steps_per_s) else f"{row.learner_steps_per_s:,.0f}"
    runners = f" | runners {row.runners_healthy}/{row.runners_total}" if row.runners_total else ""
    if row.runners_unknown:
        runners += f", {row.runners_unknown} unknown"
    elo = "" if math.isnan(row.elo) else f" | elo {row.elo:6.0f}"
    return (
        f"iter {row.iteration:4d} | env steps {row.env_steps_total:>9,} | "
        f"{row.env_steps_per_s:8,.0f} steps/s | return mean {ret} | "
        f"learner {learn} steps/s | {row.time_s:5.1f}s{runners}{elo}"
    )


def read_csv(path: Path) -> list[IterationRow]:
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        rows = []
        for raw in csv.DictReader(fh):
            rows.append(
                IterationRow(
                    **{
                        name: (int(float(raw[name])) if name in _INTS else float(raw[name]))
                        for name in COLUMNS
                        if raw.get(name) not in (None, "")  # older CSVs lack newer columns
                    }
                )
            )
        return rows


_INTS = {
    "iteration",
    "env_steps_total",
    "episodes_total",
    "runners_healthy",
    "runners_total",
    "runners_unknown",
}


def write_csv(path: Path, rows: list[IterationRow]) -> None:
    """Every row so far, replacing the file whole (written after every iteration, so a
    lost pod leaves the rows up to its last iteration, never a cut line)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    atomic.write_text(path, text.getvalue())


def plot_learning_curve(path: Path, rows: list[IterationRow], *, title: str) -> None:
    """Episode return mean and env steps/s against env steps; self-play runs (whose
    zero-sum return says nothing) also get the learner's Elo rating."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a head node or in CI
    import matplotlib.pyplot as plt

    steps = [r.env_steps_total for r in rows]
    rated = any(not math.isnan(r.elo) for r in rows)
    fig, axes = plt.subplots(3 if rated else 2, 1, figsize=(8, 8 if rated else 6), sharex=True)
    ax_ret, ax_tp = axes[0], axes[-1]
    ax_ret.plot(steps, [r.episode_return_mean for r in rows], marker="o", ms=3)
    ax_ret.set_ylabel("episode return mean")
    ax_ret.set_title(title)
    ax_ret.grid(alpha=0.3)
    if rated:
        ax_elo = axes[1]
        ax_elo.plot(steps, [r.elo for r in rows], marker="o", ms=3, color="C2")
        ax_elo.set_ylabel("learner Elo")
        ax_elo.grid(alpha=0.3)
    ax_tp.plot(steps, [r.env_steps_per_s for r in rows], marker="o", ms=3, label="env steps/s")
    ax_tp.plot(steps, [r.learner_steps_per_s for r in rows], marker="x", ms=3, label="learner")
    ax_tp.set_xlabel("env steps")
    ax_tp.set_ylabel("steps/s (log)")
    # Learner throughput is often 10-100x the sampling rate: log scale shows both.
    ax_tp.set_yscale("log")
    ax_tp.legend()
    ax_tp.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
