"""GymClient against the mock game: session sequence, autoreset modes, failures with deadlines."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from training.clients.game_client import GymClient
from training.mock_ue import TWO_TEAMS, MockUEServer
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.errors import UEConnectionError, UEProtocolError

MockFactory = Callable[..., MockUEServer]


@pytest.fixture(autouse=True, params=["native", "python"])
def game_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every behaviour here holds for both transports: the compiled one and gRPC Python."""
    monkeypatch.setenv("UERL_GAME_CLIENT", request.param)
    return request.param


def _client(server: MockUEServer, **kwargs: Any) -> GymClient:
    kwargs.setdefault("startup_timeout_s", 5.0)
    kwargs.setdefault("request_timeout_s", 5.0)
    return GymClient(server.address, **kwargs)


def _step(client: GymClient, actions: list[dict[str, int]]) -> pb.State:
    update = pb.StateUpdate()
    for agent_actions in actions:
        updates = update.step.environments.add().updates
        for aid, action in agent_actions.items():
            updates[aid].discrete_point.value = action
    return client.step(update)


def _agent(state: pb.State, env: int, aid: str = "agent_0") -> pb.AgentState:
    return state.training_state.environment_states[env].agent_states[aid]


def _obs(point: pb.Point) -> np.ndarray:
    return np.asarray(point.box_point.values, np.float32)


def _run_until_done(client: GymClient, num_envs: int = 1) -> pb.State:
    """Push CartPole env 0 to one side until it terminates; return that step's State."""
    for _ in range(200):
        state = _step(client, [{"agent_0": 1}] * num_envs)
        if _agent(state, 0).terminated:
            return state
    raise AssertionError("CartPole never terminated")


@pytest.fixture
def spawn_mock() -> Iterator[Callable[..., tuple[subprocess.Popen[str], str]]]:
    """Run `uerl mock-ue` as a separate process on a free port; yields (process, address)."""
    procs: list[subprocess.Popen[str]] = []

    def spawn(*args: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.cli", "mock-ue", "--port", "0", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        return proc, line.split("listening on ", 1)[1].split()[0]

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_definition_lists_every_environment_with_its_agents(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1", num_envs=3)
    with _client(server) as client:
        client.connect()
        definition = client.training_definition()
    assert len(definition.environment_definitions) == 3
    agent = definition.environment_definitions[2].agent_definitions["agent_0"]
    assert agent.agent_type == "cartpole"
    assert agent.action_space.discrete_space.high == 2
    assert len(agent.obs_space.box_space.dimensions) == 4


def test_reset_returns_first_observations_for_every_environment(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1", num_envs=4)
    with _client(server) as client:
        client.connect()
        state = client.reset({i: 10 + i for i in range(4)})
    assert state.HasField("initial_state") and not state.HasField("training_state")
    envs = state.initial_state.environment_states
    assert sorted(envs.keys()) == [0, 1, 2, 3]
    first = [_obs(envs[i].agent_states["agent_0"].observations) for i in range(4)]
    assert all(o.shape == (4,) and np.all(np.abs(o) <= 0.05) for o in first)
    assert not np.array_equal(first[0], first[1])  # distinct seeds, distinct starts


def test_reset_with_the_same_seed_is_reproducible(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1")
    with _client(server) as client:
        client.connect()
        a = _obs(
            client.reset({0: 7})
            .initial_state.environment_states[0]
            .agent_states["agent_0"]
            .observations
        )
        b = _obs(
            client.reset({0: 7})
            .initial_state.environment_states[0]
            .agent_states["agent_0"]
            .observations
        )
    np.testing.assert_array_equal(a, b)


def test_one_step_rpc_steps_every_environment(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1", num_envs=5)
    with _client(server) as client:
        client.connect()
        client.reset(dict.fromkeys(range(5)))
        state = _step(client, [{"agent_0": i % 2} for i in range(5)])
    assert len(state.training_state.environment_states) == 5
    assert all(_agent(state, i).reward == 1.0 for i in range(5))
    assert server.stats.steps == 1 and server.stats.env_steps == 5


def test_next_step_autoreset_answers_the_reset_observation_with_zero_reward(
    mock_ue: MockFactory,
) -> None:
    server = mock_ue("CartPole-v1")
    with _client(server) as client:
        client.connect(pb.NEXT_STEP)
        client.reset({0: 0})
        _run_until_done(client)
        after = _step(client, [{"agent_0": 1}])  # action is ignored: the env restarts
    agent = _agent(after, 0)
    assert agent.reward == 0.0 and not agent.terminated and not agent.truncated
    assert np.all(np.abs(_obs(agent.observations)) <= 0.05)
    assert not after.HasField("initial_state")


def test_same_step_autoreset_sends_the_new_first_observation_beside_the_last(
    mock_ue: MockFactory,
) -> None:
    server = mock_ue("CartPole-v1", num_envs=2)
    with _client(server) as client:
        client.connect(pb.SAME_STEP)
        client.reset({0: 0, 1: 1})
        done = _run_until_done(client, num_envs=2)
        final = _agent(done, 0)
        assert final.terminated and final.reward == 1.0
        assert np.abs(_obs(final.observations)[2]) > 0.2  # the pole fell: terminal obs
        assert done.HasField("initial_state")
        restarted = done.initial_state.environment_states[0].agent_states["agent_0"]
        assert np.all(np.abs(_obs(restarted.observations)) <= 0.05)
        following = _step(client, [{"agent_0": 0}] * 2)
    assert _agent(following, 0).reward == 1.0  # stepping continues the new episode


def test_disabled_autoreset_refuses_to_step_a_finished_environment(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1")
    with _client(server) as client:
        client.connect(pb.DISABLED)
        client.reset({0: 0})
        _run_until_done(client)
        with pytest.raises(UEProtocolError, match=r"environment 0 is done.*DISABLED"):
            _step(client, [{"agent_0": 1}])
        client.reset({0: 3})
        assert _agent(_step(client, [{"agent_0": 1}]), 0).reward == 1.0


def test_multi_agent_environments_report_each_agent_until_it_is_done(
    mock_ue: MockFactory,
) -> None:
    server = mock_ue(TWO_TEAMS, num_envs=2)
    with _client(server) as client:
        client.connect()
        definition = client.training_definition().environment_definitions[0]
        types = {aid: d.agent_type for aid, d in definition.agent_definitions.items()}
        assert types == {"cart_0": "cart", "cart_1": "cart", "pendulum_0": "pendulum"}
        state = client.reset({0: 0, 1: 1})
        assert set(state.initial_state.environment_states[1].agent_states) == set(types)
        alive = [set(types), set(types)]
        for _ in range(60):
            update = pb.StateUpdate()
            for env in range(2):
                updates = update.step.environments.add().updates
                for aid in alive[env] & {"cart_0", "cart_1"}:
                    updates[aid].discrete_point.value = 1
                updates["pendulum_0"].box_point.values.append(0.5)
            state = client.step(update)
            for env in range(2):
                for aid, st in state.training_state.environment_states[env].agent_states.items():
                    if st.terminated or st.truncated:
                        alive[env].discard(aid)
    # The carts fall within 60 steps and stop being reported; the pendulum keeps going.
    assert alive == [{"pendulum_0"}, {"pendulum_0"}]
    reported = state.training_state.environment_states[0].agent_states
    assert set(reported) == {"pendulum_0"} and reported["pendulum_0"].reward < 0


def test_step_with_a_missing_action_is_rejected_naming_environment_and_agent(
    mock_ue: MockFactory,
) -> None:
    server = mock_ue("CartPole-v1", num_envs=2)
    with _client(server) as client:
        client.connect()
        client.reset({0: 0, 1: 0})
        with pytest.raises(UEProtocolError, match="environment 1: no action for agent 'agent_0'"):
            _step(client, [{"agent_0": 1}, {}])


def test_closed_session_frees_the_game_for_a_second_client(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1")
    first = _client(server)
    first.connect()
    first.reset({0: 0})
    first.close()
    with _client(server) as second:
        second.connect()
        second.reset({0: 0})
        assert _agent(_step(second, [{"agent_0": 0}]), 0).reward == 1.0
    stats = server.stats
    assert (stats.sessions_opened, stats.sessions_closed, stats.sessions_superseded) == (2, 2, 0)


def test_step_after_close_fails_without_touching_the_network(mock_ue: MockFactory) -> None:
    server = mock_ue("CartPole-v1")
    client = _client(server)
    client.connect()
    client.close()
    with pytest.raises(UEConnectionError, match="is not connected"):
        _step(client, [{"agent_0": 0}])


def test_a_call_without_a_session_names_its_own_operation(mock_ue: MockFactory) -> None:
    # Before: every operation's not-connected error named UpdateState.
    client = _client(mock_ue("CartPole-v1"))
    with pytest.raises(UEConnectionError) as info:
        client.training_definition()
    assert info.value.operation == "RequestTrainingDefinition"
    assert str(info.value).endswith(
        "is not connected for RequestTrainingDefinition (session closed or never opened)"
    )


def test_unreachable_endpoint_fails_within_the_startup_timeout(closed_port: int) -> None:
    client = GymClient(f"127.0.0.1:{closed_port}", startup_timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(UEConnectionError) as info:
        client.connect()
    # Within the 1 s, with room for a loaded host; ignoring it would retry for 45 s.
    assert time.monotonic() - start < 1.0 + 7.0
    assert str(info.value).startswith(
        f"UE game at 127.0.0.1:{closed_port} did not answer StartGymConnector within 1 s"
    )


def test_silent_listener_fails_within_the_startup_timeout() -> None:
    # Accepts TCP but never speaks HTTP/2, like a game still loading.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(UEConnectionError, match=f"{endpoint} did not answer StartGymConnector"):
            GymClient(endpoint, startup_timeout_s=1.0).connect()
        assert time.monotonic() - start < 1.0 + 7.0  # as above


def test_game_that_stops_answering_hits_the_request_deadline(mock_ue: MockFactory) -> None:
    # The game answers after 6 s: a call that ends within 4 s kept its 0.5 s deadline, with
    # room for a loaded host.
    server = mock_ue("CartPole-v1", step_delay_s=6.0)
    with _client(server, request_timeout_s=0.5) as client:
        client.connect()
        client.reset({0: 0})
        start = time.monotonic()
        expected = rf"{server.address} did not answer UpdateState\(step\) within 0\.5 s"
        with pytest.raises(UEConnectionError, match=expected):
            _step(client, [{"agent_0": 0}])
        assert time.monotonic() - start < 4.0


def test_full_session_against_a_mock_ue_process(spawn_mock: Callable[..., Any]) -> None:
    _proc, address = spawn_mock("--envs", "2", "--env", "Pendulum-v1")
    with GymClient(address, startup_timeout_s=10, request_timeout_s=5) as client:
        client.connect()
        definition = client.training_definition()
        assert len(definition.environment_definitions) == 2
        client.reset({0: 1, 1: 2})
        update = pb.StateUpdate()
        for value in (-1.5, 1.5):
            update.step.environments.add().updates["agent_0"].box_point.values.append(value)
        state = client.step(update)
    rewards = [_agent(state, i).reward for i in range(2)]
    assert all(r <= 0 for r in rewards)


def test_game_killed_mid_step_raises_promptly(spawn_mock: Callable[..., Any]) -> None:
    proc, address = spawn_mock("--step-delay", "10")
    client = GymClient(address, startup_timeout_s=10, request_timeout_s=30)
    client.connect()
    client.reset({0: 0})
    errors: list[BaseException] = []

    def step() -> None:
        try:
            _step(client, [{"agent_0": 0}])
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    thread = threading.Thread(target=step)
    start = time.monotonic()
    thread.start()
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    thread.join(timeout=20)
    assert not thread.is_alive()
    # Killed at 0.5 s; not noticing would end only at the 30 s request deadline, so 10 s
    # tells them apart with room for a loaded host.
    assert time.monotonic() - start < 10.0
    assert len(errors) == 1 and isinstance(errors[0], UEConnectionError)
    assert f"UE game at {address} went away during UpdateState(step)" in str(errors[0])
    client.close()  # the game is gone: close must not raise or hang
