"""Discovery: one short session to a game -> a plain, serialisable GameSpec."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable

import gymnasium as gym
import pytest

from training.commands import discover as discover_cmd
from training.mock_ue import TWO_TEAMS, MockUEServer
from training.policies.game_spec import GameSpec, game_spec_from_definition
from training.preflight.discovery import discover
from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.errors import UEConnectionError, UEProtocolError

MockFactory = Callable[..., MockUEServer]

CART_OBS = gym.make("CartPole-v1").observation_space


def test_discover_reads_agents_types_and_spaces(mock_ue: MockFactory) -> None:
    server = mock_ue(TWO_TEAMS, num_envs=3)
    game = discover(server.address, timeout_s=5)
    assert game.num_envs == 3
    assert sorted(game.agents) == ["cart_0", "cart_1", "pendulum_0"]
    assert game.agents["cart_1"].observation_space == CART_OBS
    assert game.agents["pendulum_0"].action_space == gym.spaces.Box(-2.0, 2.0, (1,))


def test_one_policy_per_agent_type(mock_ue: MockFactory) -> None:
    game = discover(mock_ue(TWO_TEAMS).address, timeout_s=5)
    assert game.policy_ids() == ["cart", "pendulum"]
    assert game.policy_mapping() == {"cart_0": "cart", "cart_1": "cart", "pendulum_0": "pendulum"}
    spaces = game.policy_spaces()
    assert spaces["cart"] == (CART_OBS, gym.spaces.Discrete(2))
    assert spaces["pendulum"][1].shape == (1,)


def test_discover_closes_its_session_so_the_game_is_free(mock_ue: MockFactory) -> None:
    server = mock_ue()
    discover(server.address, timeout_s=5)
    stats = server.stats
    assert (stats.sessions_opened, stats.sessions_closed) == (1, 1)


def test_game_spec_round_trips_through_json_and_pickle(mock_ue: MockFactory) -> None:
    game = discover(mock_ue(TWO_TEAMS, num_envs=2).address, timeout_s=5)
    assert GameSpec.from_json(game.to_json()) == game
    assert pickle.loads(pickle.dumps(game)) == game


def test_unreachable_game_fails_within_the_timeout(closed_port: int) -> None:
    start = time.monotonic()
    with pytest.raises(UEConnectionError, match=f"127.0.0.1:{closed_port} did not answer"):
        discover(f"127.0.0.1:{closed_port}", timeout_s=1.0)
    # Within the 1 s, with room for a loaded host; ignoring it would retry for 45 s.
    assert time.monotonic() - start < 1.0 + 7.0


def test_cli_prints_json_that_loads_back(
    mock_ue: MockFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    server = mock_ue(TWO_TEAMS, num_envs=2)
    assert discover_cmd.main([server.address, "--json", "--timeout", "5"]) == 0
    printed = GameSpec.from_json(capsys.readouterr().out)
    assert printed == discover(server.address, timeout_s=5)


def test_cli_prints_a_readable_summary(
    mock_ue: MockFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    server = mock_ue(TWO_TEAMS, num_envs=2)
    assert discover_cmd.main([server.address]) == 0
    out = capsys.readouterr().out
    assert f"game at {server.address}: 2 environment(s), 3 agent(s)" in out
    assert "agent 'pendulum_0' type='pendulum' policy='pendulum'" in out
    assert "policies: cart, pendulum" in out


def test_cli_reports_an_unreachable_game_and_fails(
    closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert discover_cmd.main([f"127.0.0.1:{closed_port}", "--timeout", "1"]) == 1
    assert f"UE game at 127.0.0.1:{closed_port} did not answer" in capsys.readouterr().err


def _definition(*envs: dict[str, tuple[gym.Space, gym.Space, str]]) -> pb.TrainingDefinition:
    msg = pb.TrainingDefinition()
    for agents in envs:
        env = msg.environment_definitions.add()
        for aid, (obs, act, agent_type) in agents.items():
            codec.space_to_proto(obs, env.agent_definitions[aid].obs_space)
            codec.space_to_proto(act, env.agent_definitions[aid].action_space)
            env.agent_definitions[aid].agent_type = agent_type
    return msg


def test_environments_that_differ_from_environment_0_are_rejected() -> None:
    a = {"a": (CART_OBS, gym.spaces.Discrete(2), "t")}
    b = {"a": (CART_OBS, gym.spaces.Discrete(3), "t")}
    with pytest.raises(UEProtocolError, match="environment 2 agent 'a' differs"):
        game_spec_from_definition(_definition(a, a, b), "game:1")


def test_agents_sharing_a_type_must_share_spaces() -> None:
    agents = {
        "a": (CART_OBS, gym.spaces.Discrete(2), "t"),
        "b": (CART_OBS, gym.spaces.Discrete(3), "t"),
    }
    with pytest.raises(UEProtocolError, match="agent 'b' has agent_type 't' but different"):
        game_spec_from_definition(_definition(agents), "game:1")


def test_an_agent_without_a_type_gets_its_own_policy() -> None:
    agents = {"solo": (CART_OBS, gym.spaces.Discrete(2), "")}
    game = game_spec_from_definition(_definition(agents), "game:1")
    assert game.policy_mapping() == {"solo": "solo"}


def test_a_game_without_environments_is_rejected() -> None:
    with pytest.raises(UEProtocolError, match="defines no environments"):
        game_spec_from_definition(pb.TrainingDefinition(), "game:1")
