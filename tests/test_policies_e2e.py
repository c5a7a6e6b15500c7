"""`--policies shared` through `uerl local`: the policy it trains, evaluates and exports, on
the two-player Sumo game (agents that act on each other), and its refusal on TwoTeams.

The other configurations' runs: by_type (two policies trained, evaluated and exported) in
tests/test_eval_e2e.py; independent's mapping in tests/test_policies.py (its policies
train, evaluate and export as by_type's do); self_play and ctde in their own modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from local_runs import PROJECT_ROOT, LocalRun, run_local
from proc_tree import Deadline

# A hang guard, for the module fixture's run with the first test, as for each test: two
# short iterations (a Ray start, a game, an eval), about a minute idle and up to 5x that
# beside the Kubernetes tier. Each wait below ends before it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SHORT = [
    "--workers", "1", "--learners", "0", "--iterations", "2",
    "--train-batch-size", "400", "--minibatch-size", "100", "--eval-episodes", "4",
]  # fmt: skip


# Both players act with the one policy.
POLICIES = ["shared"]


@pytest.fixture(scope="module")
def sumo(tmp_path_factory: pytest.TempPathFactory, module_deadline: Deadline) -> LocalRun:
    run = run_local(
        tmp_path_factory.mktemp("sumo-shared"),
        "--env", "uerl/Sumo-v0", "--envs", "4", "--policies", "shared", *SHORT,
        timeout_s=module_deadline.left(),
    )  # fmt: skip
    print(run.output)
    return run


def test_training_and_eval_exit_zero(sumo: LocalRun) -> None:
    assert sumo.returncode == 0, sumo.output


def test_the_run_says_which_policies_it_trains(sumo: LocalRun) -> None:
    assert f"policies {POLICIES} (shared)" in sumo.output


def test_the_checkpoint_keeps_the_configuration(sumo: LocalRun) -> None:
    game = json.loads((sumo.checkpoints / "checkpoint_000002" / "game.json").read_text())
    assert game["policies"] == POLICIES
    assert game["policy_configuration"] == "shared"


def test_eval_plays_the_checkpoints_policies(sumo: LocalRun) -> None:
    report = json.loads((sumo.run_dir / "eval.json").read_text())
    assert sorted(report["policies"]) == POLICIES


def test_export_writes_one_file_per_trained_policy(sumo: LocalRun, deadline: Deadline) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "export", "--checkpoint", str(sumo.checkpoints)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=deadline.left(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for policy in POLICIES:
        assert f"{policy}.onnx" in done.stdout


def test_shared_on_agents_with_different_spaces_is_refused_naming_them(
    tmp_path, deadline: Deadline
) -> None:
    run = run_local(
        tmp_path, "--env", "uerl/TwoTeams-v0", "--policies", "shared", "--workers", "1",
        "--learners", "0", "--iterations", "1", timeout_s=deadline.left(),
    )  # fmt: skip
    assert run.returncode == 1, run.output
    assert "--policies shared needs one observation and one action space" in run.output
    assert "cart_0, cart_1 observe" in run.output and "pendulum_0 observe" in run.output
    assert "Traceback" not in run.output
