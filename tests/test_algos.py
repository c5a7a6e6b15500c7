"""--algo APPO runs on the same env runner and games as PPO through `uerl local`, and learns.

IMPALA's run (the same checks, in process) is tests/test_driver_teardown.py's.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from local_runs import run_local
from proc_tree import Deadline
from run_artifacts import fingerprints, learner_losses

# IMPALA and APPO learn asynchronously: the first iteration samples nothing, the
# learner's first results come back in the third (measured: losses from iteration 3).
ITERATIONS = 4

# A full run of 10 s+ iterations (idle): a hang guard far above its time beside the
# Kubernetes tier (up to 5x idle).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_appo_trains_through_the_stack_on_every_game(tmp_path: Path, deadline: Deadline) -> None:
    run = run_local(
        tmp_path, "--algo", "APPO", "--workers", "2", "--learners", "1",
        "--iterations", str(ITERATIONS), "--checkpoint-every", "1", timeout_s=deadline.left(),
    )  # fmt: skip
    assert run.returncode == 0, run.output
    with (tmp_path / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert int(rows[-1]["env_steps_total"]) > 0
    assert all(run.games[g]["steps"] > 0 for g in ("ue-1", "ue-2")), run.games
    assert [int(r["iteration"]) for r in rows] == list(range(1, ITERATIONS + 1))
    assert (tmp_path / "checkpoints" / "latest").read_text() == f"checkpoint_{ITERATIONS:06d}"

    # The learner updated: it reported losses, and the weights moved between iterations.
    losses = learner_losses(tmp_path)
    assert losses, "no learner loss reported"
    assert all(math.isfinite(v) for values in losses.values() for v in values), losses
    first = fingerprints(tmp_path / "checkpoints" / "checkpoint_000001")
    last = fingerprints(tmp_path / "checkpoints" / f"checkpoint_{ITERATIONS:06d}")
    assert first.keys() == last.keys() and first
    assert all(first[pid] != last[pid] for pid in first), (first, last)
