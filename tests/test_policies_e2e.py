"""Each policy configuration through `uerl local`: the policies it trains, evaluates and
exports, on the two-player Sumo game (agents that act on each other) and TwoTeams."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from local_runs import PROJECT_ROOT, LocalRun, run_local
from proc_tree import Deadline

# A hang guard, for each module fixture's run with the first test using it, as for each
# test: two short iterations (a Ray start, a game, an eval), about a minute idle and up
# to 5x that beside the Kubernetes tier. Each wait below ends before it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SHORT = [
    "--workers", "1", "--learners", "0", "--iterations", "2",
    "--train-batch-size", "400", "--minibatch-size", "100", "--eval-episodes", "4",
]  # fmt: skip


@pytest.fixture(scope="module", params=["shared", "independent"])
def sumo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LocalRun:
    # Not `module_deadline`: that is set once for the module, and this runs once a param.
    deadline = Deadline.for_item(request.node, request.config)
    return run_local(
        tmp_path_factory.mktemp(f"sumo-{request.param}"),
        "--env", "uerl/Sumo-v0", "--envs", "4", "--policies", request.param, *SHORT,
        timeout_s=deadline.left(),
    )  # fmt: skip


def expected_policies(run: LocalRun) -> list[str]:
    return ["shared"] if "shared" in run.args else ["player_0", "player_1"]


def test_training_and_eval_exit_zero(sumo: LocalRun) -> None:
    assert sumo.returncode == 0, sumo.output


def test_the_run_says_which_policies_it_trains(sumo: LocalRun) -> None:
    configuration = "shared" if "shared" in sumo.args else "independent"
    assert f"policies {expected_policies(sumo)} ({configuration})" in sumo.output


def test_the_checkpoint_keeps_the_configuration(sumo: LocalRun) -> None:
    game = json.loads((sumo.checkpoints / "checkpoint_000002" / "game.json").read_text())
    assert game["policies"] == expected_policies(sumo)
    assert game["policy_configuration"] in ("shared", "independent")


def test_eval_plays_the_checkpoints_policies(sumo: LocalRun) -> None:
    report = json.loads((sumo.run_dir / "eval.json").read_text())
    assert sorted(report["policies"]) == expected_policies(sumo)


def test_export_writes_one_file_per_trained_policy(sumo: LocalRun, deadline: Deadline) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "export", "--checkpoint", str(sumo.checkpoints)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=deadline.left(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for policy in expected_policies(sumo):
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
