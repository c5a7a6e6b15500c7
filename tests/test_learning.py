"""Learning through the whole stack: gRPC games, env runners on worker nodes, a learner node."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from local_runs import run_local
from proc_tree import Deadline

TARGET = 150.0
STEP_BUDGET = 100_000  # measured: ~20k steps to 150 with these settings


# A hang guard, far above the run's time beside the Kubernetes tier (up to 5x idle); the
# run stops at the return or at the step budget, not at a time, so load cannot fail it.
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_cartpole_reaches_return_150_within_the_step_budget(
    tmp_path: Path, deadline: Deadline
) -> None:
    run = run_local(
        tmp_path,
        "--workers",
        "2",
        "--learners",
        "1",
        "--envs",
        "4",
        "--seed",
        "0",
        "--timesteps",
        str(STEP_BUDGET),
        "--stop-return",
        str(TARGET),
        "--checkpoint-every",
        "1000",
        timeout_s=deadline.left(),  # ends before pytest-timeout, with room to stop
    )
    assert run.returncode == 0, run.output
    with (run.run_dir / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    returns = [float(r["episode_return_mean"]) for r in rows]
    best = max(r for r in returns if not math.isnan(r))
    steps = int(rows[-1]["env_steps_total"])
    print(f"\nbest return mean {best:.1f} after {steps} env steps in {run.wall_s:.0f}s")
    assert best >= TARGET, run.output
    assert steps <= STEP_BUDGET + 10_000
