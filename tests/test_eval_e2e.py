"""`uerl local --eval-episodes`: train a two-agent-type game, evaluate the final checkpoint
on the same games, then export both policies of that trained checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from local_runs import PROJECT_ROOT, LocalRun, run_local
from proc_tree import Deadline

# A hang guard, for the module fixture's run (two short iterations and an eval, about a
# minute idle, up to 5x that beside the Kubernetes tier) with the first test as for each.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, module_deadline: Deadline) -> LocalRun:
    run = run_local(
        tmp_path_factory.mktemp("eval-e2e"),
        "--env", "uerl/TwoTeams-v0", "--workers", "2", "--learners", "0",
        "--iterations", "2", "--train-batch-size", "500", "--minibatch-size", "100",
        "--eval-episodes", "4", timeout_s=module_deadline.left(),
    )  # fmt: skip
    print(run.output)
    return run


def test_training_then_eval_exits_zero(trained: LocalRun) -> None:
    assert trained.returncode == 0, trained.output


def test_eval_report_has_both_policies_over_the_asked_episodes(trained: LocalRun) -> None:
    report = json.loads((trained.run_dir / "eval.json").read_text())
    assert report["episodes"] == 4 and report["iteration"] == 2
    assert sorted(report["policies"]) == ["cart", "pendulum"]
    assert all(p["episodes"] == 4 for p in report["policies"].values())
    assert "eval: 4/4 episode(s)" in trained.output


def test_checkpoint_keeps_the_games_named_spaces(trained: LocalRun) -> None:
    game = json.loads((trained.checkpoints / "checkpoint_000002" / "game.json").read_text())
    assert game["policies"] == ["cart", "pendulum"]


def test_both_trained_policies_export_and_verify(trained: LocalRun, deadline: Deadline) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "export", "--checkpoint", str(trained.checkpoints)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=deadline.left(),
    )  # fmt: skip
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("0 mismatch(es)") == 2
    assert "cart.onnx" in done.stdout and "pendulum.onnx" in done.stdout
