"""--resume continues the run: iterations, env step count, metrics and checkpoints."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from local_runs import LocalRun, run_local

pytestmark = pytest.mark.slow  # two full runs, the second resuming the first

SMALL = (
    "--workers",
    "2",
    "--learners",
    "1",
    "--train-batch-size",
    "500",
    "--minibatch-size",
    "100",
    "--checkpoint-every",
    "2",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, str]], LocalRun]:
    """(the first run's metrics rows, the resumed run)."""
    run_dir = tmp_path_factory.mktemp("resume")
    # Both runs within the first test's pytest-timeout (600 s), with room to stop.
    first = run_local(run_dir, *SMALL, "--iterations", "2", timeout_s=240)
    assert first.returncode == 0, first.output
    first_rows = _rows(first)
    second = run_local(run_dir, *SMALL, "--iterations", "4", "--resume", timeout_s=240)
    return first_rows, second


def _rows(run: LocalRun) -> list[dict[str, str]]:
    with (run.run_dir / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


Runs = tuple[list[dict[str, str]], LocalRun]


def test_resumed_run_says_where_it_continues_from(runs: Runs) -> None:
    _, second = runs
    assert second.returncode == 0, second.output
    assert "checkpoint_000002: iteration 2" in second.output


def test_resumed_run_continues_the_env_step_count(runs: Runs) -> None:
    first_rows, second = runs
    before = int(first_rows[-1]["env_steps_total"])
    after = [int(r["env_steps_total"]) for r in _rows(second)[2:]]
    # Iteration 3 adds one batch (>= 500 steps) to the checkpoint's count: no restart at 0.
    assert before < after[0] < after[1]
    assert after[0] - before < before


def test_resumed_run_continues_iterations_and_keeps_earlier_metrics(runs: Runs) -> None:
    first_rows, second = runs
    rows = _rows(second)
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3, 4]
    assert rows[:2] == first_rows


def test_resumed_run_writes_its_final_checkpoint(runs: Runs) -> None:
    _, second = runs
    assert (second.checkpoints / "latest").read_text() == "checkpoint_000004"


def test_resume_without_a_checkpoint_fails_before_starting_anything(tmp_path: Path) -> None:
    run = run_local(tmp_path, *SMALL, "--iterations", "2", "--resume", timeout_s=60)
    assert run.returncode == 2
    assert "--resume: no checkpoint in" in run.output
    assert "Ray at" not in run.output and run.wall_s < 30
