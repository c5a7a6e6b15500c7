"""UESingleAgentVectorEnv: a one-agent game as a gymnasium vector env (RLlib's single-agent
path), the same game as `UEVectorEnv` gives the multi-agent runner, only batched."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from training.mock_ue import TWO_TEAMS, MockUEServer
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.errors import UEProtocolError
from training.protocol.spaces import CodecError
from training.protocol.step_layout import ActionColumn
from training.rllib.single_agent import UESingleAgentVectorEnv
from training.rllib.vector_env import UEVectorEnv

MockFactory = Callable[..., MockUEServer]
DICT_GAME = "uerl-test/DictAgent-v0"


class DictAgent(gym.Env):
    """One agent with Dict actions (a move and a jump); observes them; ends after 5 steps.
    (The mock game itself takes no Dict actions: only the request is checked.)"""

    observation_space = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
    action_space = gym.spaces.Dict(
        {"move": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "jump": gym.spaces.Discrete(2)}
    )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action: dict[str, Any]):
        self.t += 1
        move = np.clip(np.asarray(action["move"], np.float32), -1, 1)
        obs = np.array([*move, int(action["jump"])], np.float32)
        return obs, float(move.sum()), self.t >= 5, False, {}


if DICT_GAME not in gym.registry:
    gym.register(DICT_GAME, entry_point=DictAgent)


def _view(server: MockUEServer) -> UESingleAgentVectorEnv:
    return UESingleAgentVectorEnv(
        UEVectorEnv(server.address, startup_timeout_s=5, request_timeout_s=5)
    )


def test_spaces_are_the_agents_batched_over_the_games_environments(mock_ue: MockFactory) -> None:
    env = _view(mock_ue("Pendulum-v1", num_envs=3))
    try:
        assert env.num_envs == 3 and env.agent == "agent_0"
        assert env.single_observation_space.shape == (3,)
        assert env.observation_space.shape == (3, 3)
        assert env.action_space.shape == (3, 1)
    finally:
        env.close()


def test_each_step_equals_the_multi_agent_envs_dicts_across_episode_restarts(
    mock_ue: MockFactory,
) -> None:
    # Two copies of the game, one per view, same seeds and actions: 300 random CartPole
    # steps over 3 environments end (and restart) dozens of episodes.
    single = _view(mock_ue("CartPole-v1", num_envs=3))
    multi = UEVectorEnv(mock_ue("CartPole-v1", num_envs=3).address, startup_timeout_s=5)
    rng = np.random.default_rng(0)
    restarts = 0
    try:
        obs, _ = single.reset(seed=11)
        dict_obs, _ = multi.reset(seed=11)
        np.testing.assert_array_equal(obs, np.stack([o["agent_0"] for o in dict_obs]))
        for _ in range(300):
            actions = rng.integers(0, 2, 3)
            obs, rewards, terms, truncs, infos = single.step(actions)
            d_obs, d_rew, d_term, d_trunc, _ = multi.step([{"agent_0": a} for a in actions])
            np.testing.assert_array_equal(obs, np.stack([o["agent_0"] for o in d_obs]))
            assert rewards.tolist() == [r["agent_0"] for r in d_rew]
            assert terms.tolist() == [t["__all__"] for t in d_term]
            assert truncs.tolist() == [t["__all__"] for t in d_trunc]
            assert infos == [{}, {}, {}]
            restarts += int(terms.sum() + truncs.sum())
    finally:
        single.close()
        multi.close()
    assert restarts >= 20


def test_the_step_after_an_episode_ends_is_its_restart(mock_ue: MockFactory) -> None:
    env = _view(mock_ue(num_envs=2))
    try:
        env.reset(seed=0)
        for _ in range(200):
            _, _, terms, _, _ = env.step(np.array([1, 0]))
            if terms[0]:
                break
        assert terms[0]
        obs, rewards, terms, truncs, _ = env.step(np.array([0, 0]))
        assert rewards[0] == 0.0 and not terms[0] and not truncs[0]
        assert np.all(np.abs(obs[0]) <= 0.05)  # CartPole's reset state
    finally:
        env.close()


def test_dict_actions_go_to_each_environment_by_key(mock_ue: MockFactory) -> None:
    env = _view(mock_ue(DICT_GAME, num_envs=2))
    try:
        actions = {
            "move": np.array([[0.5, 0.25], [-1.0, 0.0]], np.float32),
            "jump": np.array([1, 0]),
        }
        columns = [ActionColumn(0, np.arange(2, dtype=np.int32), env._values(actions))]
        request = pb.StateUpdate.FromString(env.game.codec.encode(2, columns))
    finally:
        env.close()
    sent = [e.updates["agent_0"].dict_point.values for e in request.step.environments]
    assert [list(p["move"].box_point.values) for p in sent] == [[0.5, 0.25], [-1.0, 0.0]]
    assert [p["jump"].discrete_point.value for p in sent] == [1, 0]


def test_box_actions_of_the_wrong_size_are_refused_naming_the_agent(mock_ue: MockFactory) -> None:
    server = mock_ue("Pendulum-v1", num_envs=2)
    env = _view(server)
    try:
        env.reset(seed=0)
        with pytest.raises(CodecError, match=r"action of .agent_0.*2 environments, got 3"):
            env.step(np.zeros((3, 1), np.float32))
        assert server.stats.steps == 0  # refused before anything was sent
    finally:
        env.close()


def _drop_agent_of_env_1(request: pb.StateUpdate, state: pb.State) -> None:
    if request.WhichOneof("update") == "step":
        del state.training_state.environment_states[1].agent_states["agent_0"]


def test_a_step_without_the_agent_in_an_environment_is_an_error_naming_it(
    mock_ue: MockFactory,
) -> None:
    server = mock_ue(num_envs=2, on_reply=_drop_agent_of_env_1)
    env = _view(server)
    try:
        env.reset(seed=0)
        with pytest.raises(UEProtocolError) as info:
            env.step(np.array([0, 0]))
    finally:
        env.close()
    assert f"UE game at {server.address} answered UpdateState(step) wrongly" in str(info.value)
    assert "environment 1: no state for agent 'agent_0'" in str(info.value)
    assert "--env-runner multi_agent" in str(info.value)


def test_a_game_with_more_agents_is_refused(mock_ue: MockFactory) -> None:
    game = UEVectorEnv(mock_ue(TWO_TEAMS).address, startup_timeout_s=5)
    try:
        with pytest.raises(ValueError, match="one agent per environment"):
            UESingleAgentVectorEnv(game)
    finally:
        game.close()


def test_close_ends_the_game_session(mock_ue: MockFactory) -> None:
    server = mock_ue()
    env = _view(server)
    env.close()
    assert server.stats.sessions_closed == 1


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.training_state.environment_states.pop(),  # one environment too few
        lambda s: setattr(
            s.training_state.environment_states[1].agent_states["agent_0"], "reward", math.nan
        ),
        lambda s: s.ClearField("training_state"),
    ],
    ids=["environment_count", "nan_reward", "missing_training_state"],
)
def test_a_bad_step_reply_is_the_same_error_on_both_paths(
    mock_ue: MockFactory, mutate: Callable[[pb.State], None]
) -> None:
    # The single-agent path checks a reply with the multi-agent env's own checks.
    def on_reply(request: pb.StateUpdate, state: pb.State) -> None:
        if request.WhichOneof("update") == "step":
            mutate(state)

    errors = []
    for single_agent in (False, True):
        game = UEVectorEnv(mock_ue(num_envs=2, on_reply=on_reply).address, startup_timeout_s=5)
        env: Any = UESingleAgentVectorEnv(game) if single_agent else game
        try:
            env.reset(seed=0)
            with pytest.raises(UEProtocolError) as info:
                env.step(np.array([0, 0]) if single_agent else [{"agent_0": 0}, {"agent_0": 0}])
            errors.append(str(info.value).split(" answered ", 1)[1])
        finally:
            env.close()
    assert errors[0] == errors[1]
