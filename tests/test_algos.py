"""--algo APPO and IMPALA run on the same env runner and games as PPO."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from local_runs import run_local

# RLlib's IMPALA (and APPO after it) makes every iteration last at least 10 s
# (`min_time_s_per_iteration`): two are enough to train and checkpoint.
ITERATIONS = 2


@pytest.mark.parametrize("algo", ["APPO", "IMPALA"])
def test_algo_trains_through_the_stack_on_every_game(tmp_path: Path, algo: str) -> None:
    run = run_local(
        tmp_path, "--algo", algo, "--workers", "2", "--learners", "1",
        "--iterations", str(ITERATIONS),
    )  # fmt: skip
    assert run.returncode == 0, run.output
    with (tmp_path / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert int(rows[-1]["env_steps_total"]) > 0
    assert all(run.games[g]["steps"] > 0 for g in ("ue-1", "ue-2")), run.games
    assert [int(r["iteration"]) for r in rows] == [1, 2]
    assert (tmp_path / "checkpoints" / "latest").read_text() == f"checkpoint_{ITERATIONS:06d}"
