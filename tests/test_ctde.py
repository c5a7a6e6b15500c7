"""`--policies ctde`: one actor per agent acting on its own observation, one critic shared
by all of them that sees every agent's observation, stepped once per update."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from infra.endpoints import Endpoints
from infra.topology import Topology
from training.local.local_endpoints import local_endpoints
from training.mock_ue import TWO_TEAMS
from training.policies.configurations import PolicyConfigurationError
from training.policies.ctde import GLOBAL_OBS, AddGlobalObservations, ctde_module_spec
from training.policies.game_spec import GameSpec
from training.preflight.discovery import discover
from training.protocol.game_definition import AgentSpec
from training.rllib.algorithm import build_algo_config, build_ppo_config
from training.rllib.env_runner import UEConnection, UEEnvRunner

SPOTTER_OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
RUNNER_OBS = gym.spaces.Box(-1, 1, (2,), np.float32)
WORD = gym.spaces.Discrete(3)


def relay_like() -> GameSpec:
    return GameSpec(
        1,
        {
            "spotter": AgentSpec("spotter", SPOTTER_OBS, WORD),
            "runner": AgentSpec("runner", RUNNER_OBS, WORD),
        },
    ).with_policies("ctde")


def test_ctde_gives_every_agent_its_own_actor() -> None:
    assert relay_like().policy_mapping() == {"runner": "runner", "spotter": "spotter"}


def test_ctde_refuses_a_game_with_one_agent() -> None:
    with pytest.raises(PolicyConfigurationError, match="at least two agents"):
        GameSpec(1, {"solo": AgentSpec("solo", SPOTTER_OBS, WORD)}).with_policies("ctde")


def test_the_actors_share_one_critic_whose_input_is_every_agents_observation() -> None:
    game = relay_like()
    module = ctde_module_spec(game.policy_spaces()).build()
    critic = module["spotter"].central_critic
    assert critic is module["runner"].central_critic
    assert critic[0].in_features == 4 + 2
    # The actors keep no critic of their own.
    assert module["spotter"].vf is None and module["spotter"].encoder.critic_encoder is None


def test_values_come_from_the_global_observation_and_actions_from_the_own_one() -> None:
    module = ctde_module_spec(relay_like().policy_spaces()).build()
    runner = module["runner"]
    own = torch.zeros((5, 2))
    everyone = torch.randn((5, 6))
    values = runner.compute_values({Columns.OBS: own, GLOBAL_OBS: everyone})
    assert values.shape == (5,)
    assert not torch.allclose(
        values, runner.compute_values({Columns.OBS: own, GLOBAL_OBS: 0 * everyone})
    )
    logits = runner.forward_inference({Columns.OBS: own})[Columns.ACTION_DIST_INPUTS]
    assert logits.shape == (5, 3)


def test_inference_only_actors_carry_no_critic() -> None:
    spec = ctde_module_spec(relay_like().policy_spaces())
    spec.inference_only = True
    module = spec.build()
    assert module["runner"].central_critic is None
    assert not any("central_critic" in key for key in module["runner"].get_state())


def test_the_shared_critic_is_in_exactly_one_optimizer() -> None:
    config = build_ppo_config(relay_like(), UEConnection.model_construct(), num_env_runners=0)
    learner = config.build_learner(env=None)
    learner.build()
    critic = learner.module["runner"].central_critic
    owners = [
        name
        for name, optimizer in learner._named_optimizers.items()
        for group in optimizer.param_groups
        for p in group["params"]
        if any(p is q for q in critic.parameters())
    ]
    assert len(set(owners)) == 1 and len(owners) == len(list(critic.parameters()))
    every = {
        id(p)
        for o in learner._named_optimizers.values()
        for g in o.param_groups
        for p in g["params"]
    }
    assert every == {
        id(p) for mid in ("runner", "spotter") for p in learner.module[mid].parameters()
    }


def two_agent_episode(steps: int) -> MultiAgentEpisode:
    episode = MultiAgentEpisode(
        observations=[
            {"spotter": np.full(4, 0.0, np.float32), "runner": np.array([0, 0], np.float32)}
        ],
        observation_space=gym.spaces.Dict({"spotter": SPOTTER_OBS, "runner": RUNNER_OBS}),
        action_space=gym.spaces.Dict({"spotter": WORD, "runner": WORD}),
    )
    for t in range(1, steps + 1):
        episode.add_env_step(
            observations={
                "spotter": np.full(4, float(t), np.float32),
                "runner": np.array([t, -t], np.float32),
            },
            actions={"spotter": 0, "runner": 1},
            rewards={"spotter": 0.0, "runner": 0.0},
        )
    return episode


def test_each_agents_rows_get_every_agents_observation_at_the_same_step() -> None:
    piece = AddGlobalObservations(agent_spaces={"spotter": SPOTTER_OBS, "runner": RUNNER_OBS})
    episode = two_agent_episode(3)
    batch = piece(rl_module=None, batch={}, episodes=[episode])
    # One batched item per episode chunk, as RLlib adds observations.
    rows = {key[1]: np.concatenate(items) for key, items in batch[GLOBAL_OBS].items()}
    assert set(rows) == {"spotter", "runner"}
    np.testing.assert_array_equal(rows["spotter"], rows["runner"])
    # Agent-id order: runner (2 values) then spotter (4), one row per step.
    np.testing.assert_array_equal(rows["runner"][2], [2, -2, 2, 2, 2, 2])
    assert rows["runner"].shape == (3, 6)


def test_agents_that_do_not_act_together_are_refused_naming_their_steps() -> None:
    piece = AddGlobalObservations(agent_spaces={"spotter": SPOTTER_OBS, "runner": RUNNER_OBS})
    episode = two_agent_episode(2)
    episode.add_env_step(
        observations={"spotter": np.zeros(4, np.float32)},
        actions={"spotter": 0},
        rewards={"spotter": 0.0},
    )
    with pytest.raises(PolicyConfigurationError, match="every agent to act at every step"):
        piece(rl_module=None, batch={}, episodes=[episode])


def endpoints(learners: int) -> Endpoints:
    topology = Topology.parse({"learners": {"replicas": learners}, "workers": {"replicas": 1}})
    return local_endpoints(
        topology, gcs_address="127.0.0.2:6379", client_port=10001, base_port=50000
    )


def test_ctde_refuses_another_algorithm_than_ppo() -> None:
    with pytest.raises(PolicyConfigurationError, match="--algo APPO"):
        build_algo_config(endpoints(0), relay_like(), algo="APPO")


def test_ctde_refuses_more_than_one_learner_naming_the_topology_field() -> None:
    with pytest.raises(PolicyConfigurationError, match=r"topology\.learners\.replicas"):
        build_algo_config(endpoints(2), relay_like())


def test_a_runner_whose_game_agents_do_not_act_together_refuses_it_before_the_learner(
    mock_ue: Any,
) -> None:
    # TwoTeams: each cart falls on its own, the pendulum swings on: not in lockstep.
    server = mock_ue(TWO_TEAMS, num_envs=1)
    game = GameSpec.of(discover(server.address, timeout_s=5), "ctde")
    connection = UEConnection(url_template="127.0.0.1", port=server.port, startup_timeout_s=5)
    runner = UEEnvRunner(
        config=build_ppo_config(game, connection, num_env_runners=1), worker_index=1
    )
    try:
        returned = [e for _ in range(6) for e in runner.sample(num_timesteps=100)]
        refused = runner.game_health().get("refused", "")
    finally:
        runner.stop()
    assert refused.startswith("--policies ctde needs every agent to act at every step")
    # Nothing the learner would get is out of step.
    agent_spaces = {aid: spec.observation_space for aid, spec in game.agents.items()}
    AddGlobalObservations(agent_spaces=agent_spaces)(rl_module=None, batch={}, episodes=returned)
