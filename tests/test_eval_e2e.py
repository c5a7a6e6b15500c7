"""`uerl local --eval-episodes`: train a two-agent-type game, each of its policies trained,
evaluate the final checkpoint on the same games, then export both policies of that trained
checkpoint."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from local_runs import PROJECT_ROOT, LocalRun, run_local
from proc_tree import Deadline
from run_artifacts import learner_losses
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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


def _last_scalar(run: LocalRun, tag: str) -> float | None:
    """The last value TensorBoard reads for `tag` in the run, None if it has none."""
    last = None
    for events in sorted(run.run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            last = acc.Scalars(tag)[-1].value
    return last


def test_training_then_eval_exits_zero(trained: LocalRun) -> None:
    assert trained.returncode == 0, trained.output


def test_each_policy_is_trained(trained: LocalRun) -> None:
    # Lifetime: in this game a policy may sit out one iteration (its agents all done while
    # the pendulum runs on), but each must have been trained, and its learner report a loss.
    losses = learner_losses(trained.run_dir)
    for policy in ("cart", "pendulum"):
        steps = _last_scalar(trained, f"learner/{policy}/num_module_steps_trained_lifetime")
        assert steps is not None and steps > 0, (policy, steps)
        own = [v for tag, values in losses.items() if tag.startswith(f"learner/{policy}/")
               for v in values]  # fmt: skip
        assert own and all(math.isfinite(v) for v in own), (policy, sorted(losses))


def test_each_game_served_only_its_own_env_runner_and_every_session_was_closed(
    trained: LocalRun,
) -> None:
    games = trained.games
    # Training, then eval: each a discovery session on ue-1 and one runner on each game.
    assert [games[name]["sessions_opened"] for name in ("ue-1", "ue-2")] == [4, 2], games
    for name, stats in games.items():
        assert stats["sessions_superseded"] == 0, (name, stats)
        assert stats["sessions_closed"] == stats["sessions_opened"], (name, stats)
        # At least its share of training's two batches of 500 env steps.
        assert stats["env_steps"] >= 2 * 500 // 2, (name, stats)


def test_eval_report_has_both_policies_over_the_asked_episodes(trained: LocalRun) -> None:
    report = json.loads((trained.run_dir / "eval.json").read_text())
    assert report["episodes"] == 4 and report["iteration"] == 2
    assert sorted(report["policies"]) == ["cart", "pendulum"]
    assert all(p["episodes"] == 4 for p in report["policies"].values())
    assert "eval: 4/4 episode(s)" in trained.output


def test_the_run_says_which_policies_it_trains(trained: LocalRun) -> None:
    assert "policies ['cart', 'pendulum'] (by_type)" in trained.output


def test_checkpoint_keeps_the_games_named_spaces_and_the_configuration(trained: LocalRun) -> None:
    game = json.loads((trained.checkpoints / "checkpoint_000002" / "game.json").read_text())
    assert game["policies"] == ["cart", "pendulum"]
    assert game["policy_configuration"] == "by_type"


def test_both_trained_policies_export_and_verify(trained: LocalRun, deadline: Deadline) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "export", "--checkpoint", str(trained.checkpoints)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=deadline.left(),
    )  # fmt: skip
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("0 mismatch(es)") == 2
    assert "cart.onnx" in done.stdout and "pendulum.onnx" in done.stdout
