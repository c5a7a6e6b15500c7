"""Policy configurations: which policy each agent acts with, and where the choice travels."""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from training.commands.training_options import add_training_args, options_from_args
from training.policies.configurations import (
    SHARED_POLICY_ID,
    PolicyConfigurationError,
    PolicyMapping,
)
from training.policies.game_spec import GameSpec
from training.protocol.game_definition import AgentSpec
from training.rllib.hparams import HyperparameterError
from training.run import checkpoints
from training.run.options import TrainOptions, run_policies

CART = AgentSpec("cart", gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2))
PENDULUM = AgentSpec(
    "pendulum", gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32)
)


def two_teams() -> GameSpec:
    return GameSpec(2, {"cart_0": CART, "cart_1": CART, "pendulum_0": PENDULUM})


def two_carts() -> GameSpec:
    return GameSpec(1, {"cart_0": CART, "cart_1": CART})


def test_by_type_gives_one_policy_per_agent_type() -> None:
    game = two_teams()
    assert game.policies == "by_type"
    assert game.policy_mapping() == {"cart_0": "cart", "cart_1": "cart", "pendulum_0": "pendulum"}


def test_independent_gives_every_agent_its_own_policy() -> None:
    game = two_teams().with_policies("independent")
    assert game.policy_ids() == ["cart_0", "cart_1", "pendulum_0"]
    assert game.policy_spaces()["pendulum_0"] == (PENDULUM.observation_space, PENDULUM.action_space)


def test_shared_maps_every_agent_to_one_policy() -> None:
    game = two_carts().with_policies("shared")
    assert game.policy_mapping() == {"cart_0": SHARED_POLICY_ID, "cart_1": SHARED_POLICY_ID}
    assert game.policy_ids() == [SHARED_POLICY_ID]


def test_shared_refuses_agents_whose_spaces_differ_naming_them() -> None:
    with pytest.raises(PolicyConfigurationError) as error:
        two_teams().with_policies("shared")
    message = str(error.value)
    assert "cart_0, cart_1 observe Box(-1.0, 1.0, (4,), float32)" in message
    assert "pendulum_0 observe Box(-1.0, 1.0, (3,), float32)" in message
    assert "Use --policies by_type or independent" in message


def test_an_unknown_configuration_is_refused() -> None:
    with pytest.raises(PolicyConfigurationError, match="use one of by_type, shared, independent"):
        two_teams().with_policies("everyone")


def test_the_configuration_survives_the_game_specs_json() -> None:
    game = two_teams().with_policies("independent")
    again = GameSpec.from_json(game.to_json())
    assert again.policies == "independent" and again.policy_ids() == game.policy_ids()


def test_a_game_spec_saved_before_configurations_reads_as_by_type() -> None:
    data = two_teams().to_dict()
    del data["policy_configuration"]
    assert GameSpec.from_dict(data).policies == "by_type"


def test_a_game_matches_a_run_whatever_the_runs_configuration() -> None:
    game = two_teams()
    assert game.with_policies("independent").signature() == game.signature()


def test_the_mapping_function_names_an_unknown_agent() -> None:
    with pytest.raises(KeyError, match="agent 'ghost' is not in the game's definition"):
        PolicyMapping({"cart_0": "cart"})("ghost")


# -- where the choice comes from -----------------------------------------------


def parse(tmp_path: Path, *argv: str) -> TrainOptions:
    parser = argparse.ArgumentParser()
    add_training_args(parser)
    return options_from_args(parser.parse_args(["--run-dir", str(tmp_path), *argv]), name="t")


def test_the_flag_chooses_the_configuration(tmp_path: Path) -> None:
    assert parse(tmp_path, "--policies", "shared").policies == "shared"


def test_the_hyperparameter_file_may_choose_it_too(tmp_path: Path) -> None:
    yaml = tmp_path / "hp.yaml"
    yaml.write_text("policies: independent\nlr: 0.001\n")
    options = parse(tmp_path, "--hparams", str(yaml))
    assert options.policies == "independent" and options.hparams["lr"] == 0.001
    assert "policies" not in options.hparams


def test_the_flag_wins_over_the_file(tmp_path: Path) -> None:
    yaml = tmp_path / "hp.yaml"
    yaml.write_text("policies: independent\n")
    assert parse(tmp_path, "--hparams", str(yaml), "--policies", "by_type").policies == "by_type"


def test_a_bad_value_in_the_file_names_the_file(tmp_path: Path) -> None:
    yaml = tmp_path / "hp.yaml"
    yaml.write_text("policies: all\n")
    with pytest.raises(HyperparameterError, match=f"{yaml}: policies 'all': use one of"):
        parse(tmp_path, "--hparams", str(yaml))


def test_without_a_choice_a_new_run_is_by_type(tmp_path: Path) -> None:
    assert run_policies(parse(tmp_path)) == "by_type"


class SavedAlgo:
    class config:  # what checkpoints.save reads of an AlgorithmConfig
        normalize_actions = True
        clip_actions = False

    def save_to_path(self, path: str) -> None:
        Path(path).mkdir(parents=True)


def checkpoint(tmp_path: Path, game: GameSpec) -> Path:
    meta = checkpoints.CheckpointMeta(3, 300, "PPO", normalize_actions=True, clip_actions=False)
    return checkpoints.save(SavedAlgo(), tmp_path / "checkpoints", meta, game=game)


def test_a_resumed_run_keeps_the_checkpoints_configuration(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, two_teams().with_policies("independent"))
    assert run_policies(parse(tmp_path, "--resume", str(path))) == "independent"


def test_a_resumed_run_cannot_change_the_configuration(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, two_teams().with_policies("independent"))
    with pytest.raises(checkpoints.CheckpointError, match="its policies are independent"):
        run_policies(parse(tmp_path, "--resume", str(path), "--policies", "by_type"))
