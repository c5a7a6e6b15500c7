"""Which RLlib runner a run samples with: RLlib's single-agent path for games with one agent
per environment, the multi-agent one for the others, and the checkpoint keeps its choice
(its module is RLlib's `default_policy`, named back to the game's policy everywhere)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from test_export import game_for, modules_for

from training.commands.training_options import add_training_args, options_from_args
from training.mock_ue.scenarios import TWO_TEAMS
from training.policies.configurations import PolicyConfigurationError
from training.policies.game_spec import GameSpec
from training.preflight.discovery import discover
from training.rllib.algorithm import build_ppo_config, path_of, policy_names
from training.rllib.env_runner import UEConnection, UEEnvRunner, UEGameRunner
from training.rllib.single_agent import SINGLE_AGENT_POLICY_KEY, UESingleAgentEnvRunner
from training.run import checkpoints
from training.run.metrics import IterationRow
from training.run.options import TrainOptions, run_env_runner
from training.run.runner_health import RunnerHealthBoard
from training.run.tensorboard import scalars_for

CONNECTION = UEConnection(url_template="127.0.0.1", port=50051)


def config_for(env_id: str, env_runner: str = "auto"):
    return build_ppo_config(game_for(env_id), CONNECTION, num_env_runners=2, env_runner=env_runner)


def test_a_one_agent_game_trains_on_rllibs_single_agent_runner() -> None:
    config = config_for("CartPole-v1")
    assert config.env_runner_cls is UESingleAgentEnvRunner
    assert not config.is_multi_agent
    assert config.env_config[SINGLE_AGENT_POLICY_KEY] == "cartpole"
    assert config.observation_space.shape == (4,)
    assert path_of(config) == "single_agent"


def test_a_game_with_more_agents_trains_on_the_multi_agent_runner() -> None:
    config = config_for(TWO_TEAMS)
    assert config.env_runner_cls is UEEnvRunner
    assert config.is_multi_agent and set(config.policies) == {"cart", "pendulum"}
    assert path_of(config) == "multi_agent"


def test_a_one_agent_game_may_ask_for_the_multi_agent_runner() -> None:
    config = config_for("CartPole-v1", "multi_agent")
    assert config.env_runner_cls is UEEnvRunner and set(config.policies) == {"cartpole"}


def test_the_single_agent_runner_refuses_a_game_with_more_agents_naming_them() -> None:
    with pytest.raises(PolicyConfigurationError, match="agents \\['cart_0', 'cart_1', 'pend"):
        config_for(TWO_TEAMS, "single_agent")


def test_both_paths_get_the_same_runners_environments_and_training_settings() -> None:
    single, multi = config_for("CartPole-v1"), config_for("CartPole-v1", "multi_agent")
    for key in (
        "num_env_runners",
        "num_envs_per_env_runner",
        "train_batch_size_per_learner",
        "minibatch_size",
        "num_epochs",
        "lr",
    ):
        assert getattr(single, key) == getattr(multi, key), key


def test_tensorboard_names_the_single_agent_module_after_the_games_policy() -> None:
    names = policy_names(config_for("CartPole-v1"))
    assert names == {"default_policy": "cartpole"}
    row = IterationRow(
        iteration=1,
        env_steps_total=100,
        episodes_total=5,
        time_s=1.0,
        env_steps_per_s=100.0,
        episode_return_mean=12.0,
        episode_len_mean=20.0,
        learner_steps_per_s=1000.0,
    )
    result = {
        "env_runners": {"module_episode_return_mean": {"default_policy": 12.0}},
        "learners": {"default_policy": {"policy_loss": 0.5}},
    }
    tags = scalars_for(row, result, {}, names)
    assert tags["policy/cartpole/episode_return_mean"] == 12.0
    assert tags["learner/cartpole/policy_loss"] == 0.5


def test_the_multi_agent_runner_keeps_rllibs_module_ids() -> None:
    assert policy_names(config_for(TWO_TEAMS)) == {}


# -- the flag and --resume ------------------------------------------------------------


def parse(tmp_path: Path, *argv: str) -> TrainOptions:
    parser = argparse.ArgumentParser()
    add_training_args(parser)
    return options_from_args(parser.parse_args(["--run-dir", str(tmp_path), *argv]), name="t")


def test_the_flag_chooses_the_runner_and_auto_is_the_default(tmp_path: Path) -> None:
    assert parse(tmp_path).env_runner == "auto"
    assert parse(tmp_path, "--env-runner", "multi_agent").env_runner == "multi_agent"


def single_agent_checkpoint(tmp_path: Path, env_runner: str | None = "single_agent") -> Path:
    """A checkpoint as a single-agent run writes it: one module, RLlib's `default_policy`."""
    game = game_for("CartPole-v1")
    path = tmp_path / "checkpoints" / "checkpoint_000001"
    ((spaces),) = game.policy_spaces().values()
    modules_for({"default_policy": spaces}).save_to_path(
        str((path / checkpoints.MODULES_SUBDIR).resolve())
    )
    meta = {"iteration": 1, "env_steps_total": 100, "algo": "PPO"}
    if env_runner is not None:
        meta["env_runner"] = env_runner
    (path / checkpoints.META).write_text(json.dumps(meta))
    (path / checkpoints.GAME).write_text(game.to_json())
    (path.parent / checkpoints.LATEST).write_text(path.name)
    return path


def test_a_single_agent_checkpoints_module_loads_under_the_games_policy_id(
    tmp_path: Path,
) -> None:
    modules = checkpoints.load_modules(single_agent_checkpoint(tmp_path))
    assert list(modules.keys()) == ["cartpole"]
    assert modules["cartpole"].observation_space.shape == (4,)


def test_checkpoints_from_before_the_choice_are_multi_agent(tmp_path: Path) -> None:
    path = single_agent_checkpoint(tmp_path, env_runner=None)
    assert checkpoints.read_meta(path).env_runner == "multi_agent"


def test_resume_keeps_the_checkpoints_runner(tmp_path: Path) -> None:
    single_agent_checkpoint(tmp_path)
    assert run_env_runner(parse(tmp_path, "--resume")) == "single_agent"


def test_resume_with_another_runner_is_refused_naming_both(tmp_path: Path) -> None:
    single_agent_checkpoint(tmp_path)
    options = parse(tmp_path, "--resume", "--env-runner", "multi_agent")
    refused = r"--env-runner single_agent.*--env-runner multi_agent"
    with pytest.raises(checkpoints.CheckpointError, match=refused):
        run_env_runner(options)


# -- a one-agent game that leaves its agent out of a step -----------------------------


def _drop_agent_of_env_1(request: Any, state: Any) -> None:
    if request.WhichOneof("update") == "step":
        del state.training_state.environment_states[1].agent_states["agent_0"]


class _NoRayShared:
    """Stands in for the run's shared health (a Ray KV) on a runner built in-process."""

    def publish(self, runner_index: int, down_since: float | None) -> None:
        pass

    def every_game_down_for(self, limit_s: float) -> bool:
        return False


def test_a_step_without_the_agent_refuses_the_run_naming_the_environment_and_the_flag(
    mock_ue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the runner took the protocol error for a game fault, reconnected, failed the
    # same way, and so on for ever; the driver never gave up.
    monkeypatch.setattr(UEGameRunner, "_shared", _NoRayShared())  # a fault would ask Ray
    server = mock_ue(num_envs=2, on_reply=_drop_agent_of_env_1)
    game = GameSpec.of(discover(server.address, timeout_s=5))
    connection = UEConnection(url_template="127.0.0.1", port=server.port, startup_timeout_s=5)
    config = build_ppo_config(game, connection, num_env_runners=1)
    sessions_before = server.stats.sessions_opened  # discovery's
    runner = UESingleAgentEnvRunner(config=config, worker_index=1)
    try:
        returned = [e for _ in range(3) for e in runner.sample(num_timesteps=20)]
        report = runner.game_health()
    finally:
        runner.stop()
    assert returned == []
    assert report["healthy"] and report["faults"] == 0  # not a fault: no reconnects
    assert server.stats.sessions_opened == sessions_before + 1
    assert "environment 1: no state for agent 'agent_0'" in report["refused"]
    assert "--env-runner multi_agent" in report["refused"]
    board = RunnerHealthBoard(1, give_up_after_s=300)
    board.update([report])
    reason = board.give_up_reason()
    assert reason is not None and reason.startswith(f"env runner 1 ({server.address}): ")
    assert "--env-runner multi_agent" in reason and "\n" not in reason
