"""--resume continues the run: iterations, env step count, metrics and checkpoints."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from local_runs import LocalRun, run_local
from proc_tree import Deadline

# Two full runs, the second resuming the first, both in the module fixture with the first
# test: a hang guard, far above their loaded time (each about a minute idle, up to 5x that
# beside the Kubernetes tier).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

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
def runs(
    tmp_path_factory: pytest.TempPathFactory, module_deadline: Deadline
) -> tuple[list[dict[str, str]], LocalRun]:
    """(the first run's metrics rows, the resumed run)."""
    run_dir = tmp_path_factory.mktemp("resume")
    # Both runs within the first test's pytest-timeout, with room to stop.
    first = run_local(run_dir, *SMALL, "--iterations", "2", timeout_s=module_deadline.left())
    assert first.returncode == 0, first.output
    first_rows = _rows(first)
    second = run_local(
        run_dir, *SMALL, "--iterations", "4", "--resume", timeout_s=module_deadline.left()
    )
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


def test_resume_without_a_checkpoint_fails_before_starting_anything(
    tmp_path: Path, deadline: Deadline
) -> None:
    run = run_local(tmp_path, *SMALL, "--iterations", "2", "--resume", timeout_s=deadline.left())
    assert run.returncode == 2
    # "Before starting anything" is Ray's start line missing, not a time: how long the
    # Python imports take depends on the host.
    assert "Ray at" not in run.output
