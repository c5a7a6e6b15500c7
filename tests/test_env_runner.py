"""uerl's env runners (multi-agent `UEEnvRunner`, single-agent `UESingleAgentEnvRunner`):
each builds its env from env_config, against its own game, and survives it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from ray.rllib.utils.metrics import EPISODE_LEN_MEAN, NUM_EPISODES_LIFETIME

from training.mock_ue import TWO_TEAMS, MockUEServer
from training.policies.configurations import PolicyMapping
from training.preflight.discovery import discover
from training.rllib.algorithm import build_ppo_config
from training.rllib.env_runner import GameChangedError, UEConnection, UEEnvRunner, UEGameRunner
from training.rllib.single_agent import UESingleAgentEnvRunner

MockFactory = Callable[..., MockUEServer]


def _runner(
    servers: list[MockUEServer],
    connection: UEConnection,
    worker_index: int,
    num_env_runners: int = 2,
    env_runner: str = "auto",
) -> UEGameRunner:
    """The runner `build_ppo_config` chooses for the game (or `env_runner`'s)."""
    game = discover(servers[0].address, timeout_s=5)
    config = build_ppo_config(
        game, connection, num_env_runners=num_env_runners, env_runner=env_runner
    )
    return config.env_runner_cls(config=config, worker_index=worker_index)


@contextmanager
def cartpole_runner(mock_ue: MockFactory, env_runner: str = "auto") -> Iterator[Any]:
    """Runner 1 on a one-agent (CartPole) mock game; stopped afterwards."""
    server = mock_ue("CartPole-v1")
    connection = UEConnection(url_template="127.0.0.1", port=server.port, startup_timeout_s=5)
    runner = _runner([server], connection, worker_index=1, env_runner=env_runner)
    try:
        yield runner
    finally:
        runner.stop()


def test_a_one_agent_game_samples_on_the_single_agent_runner(mock_ue: MockFactory) -> None:
    with cartpole_runner(mock_ue) as runner:
        assert isinstance(runner, UESingleAgentEnvRunner)
        assert runner.policy_id == "cartpole"


def test_the_single_agent_runner_names_its_weights_and_episodes_after_the_games_policy(
    mock_ue: MockFactory,
) -> None:
    with cartpole_runner(mock_ue) as runner:
        (episode,) = runner.sample(num_episodes=1, random_actions=True)
        assert runner.episode_summary(episode) == {
            "cartpole": (float(episode.get_return()), len(episode))
        }
        states = runner.policy_states()
        assert list(states) == ["cartpole"]
        zeroed = {name: np.zeros_like(value) for name, value in states["cartpole"].items()}
        runner.set_policy_states({"cartpole": zeroed})
        assert all(not np.any(value) for value in runner.policy_states()["cartpole"].values())


def test_a_one_agent_game_can_still_sample_on_the_multi_agent_runner(
    mock_ue: MockFactory,
) -> None:
    with cartpole_runner(mock_ue, "multi_agent") as runner:
        assert type(runner) is UEEnvRunner
        assert {aid for ep in runner.sample(num_timesteps=4) for aid in ep.agent_ids} == {"agent_0"}


@pytest.mark.parametrize(
    ("template", "mode", "index", "expected"),
    [
        ("ue-{worker_index}", "fixed", 1, "ue-1:50051"),
        ("ue-{worker_index}", "fixed", 7, "ue-7:50051"),
        ("127.0.0.1", "per_worker", 1, "127.0.0.1:50052"),
        ("127.0.0.1", "per_worker", 4, "127.0.0.1:50055"),
        ("game-{worker_index}.games.svc", "per_worker", 2, "game-2.games.svc:50053"),
    ],
)
def test_endpoint_expansion(template: str, mode: str, index: int, expected: str) -> None:
    connection = UEConnection(url_template=template, port=50051, port_offset_mode=mode)
    assert connection.endpoint_for(index) == expected


def test_local_runner_cannot_expand_a_per_runner_template() -> None:
    connection = UEConnection(url_template="ue-{worker_index}", port=50051)
    with pytest.raises(ValueError, match="env runner 0 is the local runner"):
        connection.endpoint_for(0)


def test_connection_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        UEConnection.model_validate({"url_template": "h", "port": 1, "prot": 2})


def test_connection_round_trips_as_a_plain_dict() -> None:
    connection = UEConnection(url_template="h", port=1, tls_ca_path="/ca.pem")
    assert UEConnection.model_validate(connection.model_dump()) == connection
    assert connection.tls() is not None and connection.tls().ca_path == "/ca.pem"


@pytest.mark.parametrize("worker_index", [1, 2, 3])
def test_per_worker_runner_connects_to_its_own_port(
    mock_ue_row: Callable[..., list[MockUEServer]],
    worker_index: int,
) -> None:
    servers = mock_ue_row(3, num_envs=2)
    connection = UEConnection(
        url_template="127.0.0.1",
        port=servers[0].port - 1,
        port_offset_mode="per_worker",
        startup_timeout_s=5,
    )
    runner = _runner(servers, connection, worker_index, num_env_runners=3)
    try:
        assert runner.env.endpoint == servers[worker_index - 1].address
        assert runner.num_envs == 2
        opened = [s.stats.sessions_opened for s in servers]
        expected = [1, 0, 0]  # discovery always uses the first server
        expected[worker_index - 1] += 1
        assert opened == expected
    finally:
        runner.stop()


def test_fixed_port_runners_share_the_templated_host(mock_ue: MockFactory) -> None:
    server = mock_ue(num_envs=1)
    connection = UEConnection(url_template="127.0.0.1", port=server.port, startup_timeout_s=5)
    for index in (1, 5):
        runner = _runner([server], connection, index)
        try:
            assert runner.env.endpoint == server.address
        finally:
            runner.stop()


def test_local_runner_builds_no_env_when_remote_runners_exist(mock_ue: MockFactory) -> None:
    server = mock_ue()
    connection = UEConnection(url_template="127.0.0.{worker_index}", port=server.port)
    runner = _runner([server], connection, worker_index=0)
    assert runner.env is None
    assert server.stats.sessions_opened == 1  # discovery only


def test_runner_samples_one_episode_list_entry_per_environment(mock_ue: MockFactory) -> None:
    server = mock_ue(TWO_TEAMS, num_envs=3)
    connection = UEConnection(url_template="127.0.0.1", port=server.port, startup_timeout_s=5)
    runner = _runner([server], connection, worker_index=1)
    try:
        episodes = runner.sample(num_timesteps=30, random_actions=False)
        assert len(episodes) >= 3
        agent_modules = {aid: ep.module_for(aid) for ep in episodes for aid in ep.agent_ids}
        assert agent_modules == {"cart_0": "cart", "cart_1": "cart", "pendulum_0": "pendulum"}
        assert server.stats.steps == 10  # one RPC per vector step of 3 environments
    finally:
        runner.stop()


def test_a_game_back_on_its_endpoint_with_other_spaces_is_an_error(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1")
    connection = UEConnection(url_template="127.0.0.1", port=server.port, startup_timeout_s=5)
    runner = _runner([server], connection, worker_index=1)
    try:
        server.stop(grace=0)
        # Another build answers on the same endpoint: its policies would not fit.
        mock_ue("Pendulum-v1", port=server.port)
        with pytest.raises(GameChangedError, match="different environments, agents or spaces"):
            runner.make_env()
        assert runner.env is None
    finally:
        runner.stop()


class _NoSharedHealth:
    """Stands in for Ray's GCS store (no Ray here): no other runner, none down."""

    def publish(self, runner_index: int, down_since: float | None) -> None:
        pass

    def every_game_down_for(self, limit_s: float, *, now: float | None = None) -> bool:
        return False


@pytest.mark.parametrize("env_runner", ["single_agent", "multi_agent"])
def test_episodes_a_game_fault_cuts_are_dropped_never_counted_as_finished(
    mock_ue: MockFactory, env_runner: str
) -> None:
    server = mock_ue("CartPole-v1")
    connection = UEConnection(
        url_template="127.0.0.1", port=server.port, startup_timeout_s=5, request_timeout_s=2
    )
    runner = _runner([server], connection, worker_index=1, num_env_runners=1, env_runner=env_runner)
    runner._shared_health = _NoSharedHealth()  # type: ignore[assignment]
    try:
        # 5 steps of a CartPole episode (random actions last 8+ steps): cut in the middle.
        (cut,) = runner.sample(num_timesteps=5, random_actions=True)
        assert not cut.is_done and len(cut) == 5
        server.stop(grace=0)
        assert runner.sample(num_timesteps=5, random_actions=True) == []
        assert not runner.game_health_state().healthy
        mock_ue("CartPole-v1", port=server.port)  # the game is back on its endpoint
        # By timesteps (not episodes, which would force a reset anyway). Random CartPole
        # episodes last 22 steps on average but 60 or more 1.8% of the time: 300 steps
        # always finish some.
        after = runner.sample(num_timesteps=300, random_actions=True)
        finished = [ep for ep in after if ep.is_done]
        assert finished, [(ep.id_, len(ep)) for ep in after]
        # The cut episode is not continued on the new session; every one after it
        # starts from the new session's reset.
        assert cut.id_ not in {ep.id_ for ep in after}
        assert all(_started_at(ep) == 0 for ep in after)
        # RLlib's finished-episode count and mean length are those episodes' alone.
        metrics = runner.get_metrics()
        assert metrics[NUM_EPISODES_LIFETIME].peek() == len(finished)
        lengths = [len(ep) for ep in finished]
        assert metrics[EPISODE_LEN_MEAN].peek() == pytest.approx(sum(lengths) / len(lengths))
    finally:
        runner.stop()


def _started_at(episode: Any) -> int:
    """The env step an episode (chunk) starts at, single-agent or multi-agent."""
    return episode.t_started if hasattr(episode, "t_started") else episode.env_t_started


def test_policy_mapping_is_picklable_and_names_unknown_agents() -> None:
    import pickle

    mapping: Any = pickle.loads(pickle.dumps(PolicyMapping({"a": "t"})))
    assert mapping("a", None) == "t"
    with pytest.raises(KeyError, match="agent 'b' is not in the game's definition"):
        mapping("b", None)
