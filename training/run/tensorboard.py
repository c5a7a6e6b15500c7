"""TensorBoard event files beside `metrics.csv`, for `tensorboard --logdir runs/`.

Written with tensorboardX (maintained, no TensorFlow), flushed after every
iteration so a TensorBoard watching the run directory sees each iteration as it
ends. The x axis is env steps (as ML-Agents plots), so resumed runs continue the
same curves.

Tags:
- `uerl/*`: what the progress line shows (return, episode length, env and learner
  throughput, runners healthy/total/unknown);
- `policy/<policy>/episode_return_mean`: per policy;
- `learner/<policy>/<stat>`: every scalar RLlib's learner reports per module
  (losses, entropy, KL, gradient norm, learning rate, ...);
- `runner/<index>/healthy` (1 or 0) and `runner/<index>/down_for_s`: each env runner's game,
  for the runners that reported this iteration.
"""

from __future__ import annotations

import math
import numbers
import time
from pathlib import Path
from typing import Any

from training.run.metrics import IterationRow

ALL_MODULES = "__all_modules__"


def _scalars(node: Any, prefix: str) -> dict[str, float]:
    """Numeric leaves of a (nested) result dict, `/`-joined."""
    out: dict[str, float] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            out.update(_scalars(value, f"{prefix}/{key}" if prefix else str(key)))
    elif isinstance(node, numbers.Real) and not isinstance(node, bool):
        value = float(node)
        if math.isfinite(value):
            out[prefix] = value
    elif hasattr(node, "item") and getattr(node, "size", 2) == 1:  # numpy / torch scalars
        try:
            return _scalars(node.item(), prefix)
        except (TypeError, ValueError):
            return {}
    return out


def scalars_for(
    row: IterationRow,
    result: dict[str, Any],
    runners: dict[int, dict[str, Any]],
    policy_names: dict[str, str] | None = None,
) -> dict[str, float]:
    """Every scalar of one iteration, by tag (NaNs left out: no point is better than 0).
    `policy_names`: RLlib module id -> the game's policy id where they differ (RLlib's
    single-agent `default_policy`)."""
    names = policy_names or {}
    out = {
        "uerl/episode_return_mean": row.episode_return_mean,
        "uerl/episode_len_mean": row.episode_len_mean,
        "uerl/env_steps_per_s": row.env_steps_per_s,
        "uerl/learner_steps_per_s": row.learner_steps_per_s,
        "uerl/episodes_total": float(row.episodes_total),
        "uerl/iteration_time_s": row.time_s,
        "uerl/elo": row.elo,
    }
    if row.runners_total:
        out["uerl/runners_healthy"] = float(row.runners_healthy)
        out["uerl/runners_total"] = float(row.runners_total)
        out["uerl/runners_unknown"] = float(row.runners_unknown)
    env_runners = result.get("env_runners", {}) or {}
    # RLlib's multi-agent runner says "returns", its single-agent one "return".
    per_policy = (
        env_runners.get("module_episode_returns_mean")
        or env_runners.get("module_episode_return_mean")
        or {}
    )
    for pid, value in _scalars(per_policy, "").items():
        out[f"policy/{names.get(pid, pid)}/episode_return_mean"] = value
    learners = result.get("learners", {}) or {}
    for pid, stats in learners.items():
        if pid == ALL_MODULES:
            continue
        for key, value in _scalars(stats, "").items():
            out[f"learner/{names.get(pid, pid)}/{key}"] = value
    for index, report in sorted(runners.items()):
        out[f"runner/{index}/healthy"] = 1.0 if report.get("healthy") else 0.0
        out[f"runner/{index}/down_for_s"] = float(report.get("down_for_s") or 0.0)
    return {tag: value for tag, value in out.items() if not math.isnan(value)}


class TensorBoardWriter:
    """One event file per run (segment) in `run_dir`; `close()` flushes it."""

    def __init__(
        self,
        run_dir: Path,
        policy_names: dict[str, str] | None = None,
        *,
        resumed_at: int | None = None,
    ) -> None:
        from tensorboardX import SummaryWriter

        self._policy_names = policy_names or {}
        run_dir.mkdir(parents=True, exist_ok=True)
        # A run resumed from a checkpoint at `resumed_at` env steps repeats what the lost
        # segment wrote after it: TensorBoard's purge event hides the earlier files'
        # points from the next step on, so each step is plotted once, the resumed value.
        purge_step = None if resumed_at is None else resumed_at + 1
        # flush_secs bounds the delay for anything written between iterations. The file
        # is named by the second it was made in and the host: two segments of a run in one
        # second would share (and truncate) a file but for the suffix, which also orders
        # them as TensorBoard reads them (by name).
        self._writer = SummaryWriter(
            logdir=str(run_dir),
            flush_secs=10,
            purge_step=purge_step,
            filename_suffix=f".{time.time_ns()}",
        )

    def write(
        self,
        row: IterationRow,
        result: dict[str, Any],
        runners: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        step = row.env_steps_total
        for tag, value in scalars_for(row, result, runners or {}, self._policy_names).items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # visible to a running TensorBoard at once

    def close(self) -> None:
        self._writer.close()
