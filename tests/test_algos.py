"""--algo APPO and IMPALA run on the same env runner and games as PPO."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from local_runs import run_local


@pytest.mark.parametrize("algo", ["APPO", "IMPALA"])
def test_algo_trains_through_the_stack_on_every_game(tmp_path: Path, algo: str) -> None:
    run = run_local(
        tmp_path, "--algo", algo, "--workers", "2", "--learners", "1", "--iterations", "4"
    )
    assert run.returncode == 0, run.output
    with (tmp_path / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert int(rows[-1]["env_steps_total"]) > 0
    assert all(run.games[g]["steps"] > 0 for g in ("ue-1", "ue-2")), run.games
    assert (tmp_path / "checkpoints" / "latest").read_text() == "checkpoint_000004"
