"""UEVectorEnv: N environments of one game as an RLlib vector multi-agent env, with validation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from training.mock_ue import TWO_TEAMS, MockUEServer
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.errors import UEProtocolError
from training.rllib.vector_env import UEVectorEnv

MockFactory = Callable[..., MockUEServer]


def _env(server: MockUEServer) -> UEVectorEnv:
    return UEVectorEnv(server.address, startup_timeout_s=5, request_timeout_s=5)


def test_env_exposes_one_sub_env_view_per_game_environment(mock_ue: MockFactory) -> None:
    env = _env(mock_ue(TWO_TEAMS, num_envs=3))
    try:
        assert env.num_envs == 3 and len(env.envs) == 3
        assert env.possible_agents == ["cart_0", "cart_1", "pendulum_0"]
        assert env.agent_types == {"cart_0": "cart", "cart_1": "cart", "pendulum_0": "pendulum"}
        assert env.envs[2].unwrapped.get_action_space("pendulum_0").shape == (1,)
        assert env.single_observation_space["cart_1"].shape == (4,)
    finally:
        env.close()


def test_step_is_one_rpc_for_all_environments(mock_ue: MockFactory) -> None:
    server = mock_ue(num_envs=4)
    env = _env(server)
    try:
        obs, infos = env.reset(seed=3)
        assert len(obs) == 4 and all(o["agent_0"].dtype == np.float32 for o in obs)
        assert infos == [{"agent_0": {}}] * 4
        _, rewards, terms, _, _ = env.step([{"agent_0": np.int64(1)}] * 4)
        assert rewards == [{"agent_0": 1.0}] * 4
        assert terms == [{"agent_0": False, "__all__": False}] * 4
        assert server.stats.steps == 1 and server.stats.env_steps == 4
    finally:
        env.close()


def test_finished_environment_restarts_on_the_next_step_as_rllib_expects(
    mock_ue: MockFactory,
) -> None:
    env = _env(mock_ue(num_envs=2))
    try:
        env.reset(seed=0)
        for _ in range(200):
            obs, rewards, terms, _, _ = env.step([{"agent_0": 1}, {"agent_0": 0}])
            if terms[0]["__all__"]:
                break
        assert terms[0] == {"agent_0": True, "__all__": True}
        obs, rewards, terms, truncs, _ = env.step([{}, {"agent_0": 0}])
        assert rewards[0] == {"agent_0": 0.0}
        assert terms[0]["__all__"] is False and truncs[0]["__all__"] is False
        assert np.all(np.abs(obs[0]["agent_0"]) <= 0.05)
    finally:
        env.close()


def test_multi_agent_episode_ends_when_every_agent_is_done(mock_ue: MockFactory) -> None:
    env = _env(mock_ue(TWO_TEAMS, num_envs=1))
    try:
        obs, _ = env.reset(seed=0)
        ends = []
        for _ in range(210):
            actions = {a: env.single_action_spaces[a].sample() for a in obs[0]}
            obs, _, terms, truncs, _ = env.step([actions])
            ends.append((set(obs[0]), terms[0]["__all__"], truncs[0]["__all__"]))
            if terms[0]["__all__"] or truncs[0]["__all__"]:
                break
        agents_seen, term_all, trunc_all = ends[-1]
        # The pendulum is truncated at 200 steps, long after both carts fell.
        assert agents_seen == {"pendulum_0"} and trunc_all and not term_all
        assert not any(t or u for _, t, u in ends[:-1])
    finally:
        env.close()


def _tamper(mutate: Callable[[pb.State], None]) -> Callable[[pb.StateUpdate, pb.State], None]:
    def on_reply(request: pb.StateUpdate, state: pb.State) -> None:
        if request.WhichOneof("update") == "step":
            mutate(state)

    return on_reply


def _agent0(state: pb.State, env: int) -> pb.AgentState:
    return state.training_state.environment_states[env].agent_states["agent_0"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda s: setattr(_agent0(s, 1), "reward", float("nan")),
            "environment 1 agent 'agent_0' reward is NaN",
        ),
        (
            lambda s: s.training_state.environment_states.pop(),
            "reply has 1 environments, expected 2",
        ),
        (
            lambda s: _agent0(s, 1).observations.box_point.values.pop(),
            "environment 1 agent 'agent_0' observations: expected 4 values",
        ),
        (
            lambda s: (
                s.training_state.environment_states[0]
                .agent_states["intruder"]
                .CopyFrom(_agent0(s, 0))
            ),
            "environment 0: unknown agent 'intruder'",
        ),
        (lambda s: s.ClearField("training_state"), "reply has no training_state"),
    ],
    ids=[
        "nan_reward",
        "environment_count",
        "observation_shape",
        "unknown_agent",
        "missing_training_state",
    ],
)
def test_invalid_replies_are_reported_with_environment_agent_and_field(
    mock_ue: MockFactory,
    mutate: Callable[[pb.State], None],
    message: str,
) -> None:
    server = mock_ue(num_envs=2, on_reply=_tamper(mutate))
    env = _env(server)
    try:
        env.reset(seed=0)
        with pytest.raises(UEProtocolError) as info:
            env.step([{"agent_0": 0}, {"agent_0": 0}])
    finally:
        env.close()
    assert f"UE game at {server.address} answered UpdateState(step) wrongly" in str(info.value)
    assert message in str(info.value)


def test_close_sends_closed_to_the_game(mock_ue: MockFactory) -> None:
    server = mock_ue()
    env = _env(server)
    env.close()
    assert server.stats.sessions_closed == 1
