"""The mock UE game: health service, sessions, validation, process lifecycle."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from training.clients.game_client import GymClient
from training.mock_ue import MockUEServer, scenario_for, wire
from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol._generated import schola_gym_pb2_grpc as pb_grpc
from training.protocol.errors import UEProtocolError

MockFactory = Callable[..., MockUEServer]


@pytest.mark.parametrize("service", ["", "Schola.GymService"])
def test_standard_health_service_reports_serving(mock_ue: MockFactory, service: str) -> None:
    server = mock_ue()
    with grpc.insecure_channel(server.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_update_before_start_is_refused(mock_ue: MockFactory) -> None:
    server = mock_ue()
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.GymServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.UpdateState(pb.StateUpdate(reset=pb.Reset()), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "StartGymConnector first" in info.value.details()


def test_new_client_supersedes_a_session_abandoned_without_closed(mock_ue: MockFactory) -> None:
    server = mock_ue()
    crashed = GymClient(server.address, startup_timeout_s=5)
    crashed.connect()
    crashed.reset({0: 0})
    crashed._close_transport()  # vanish without CLOSED, like a killed env runner
    with GymClient(server.address, startup_timeout_s=5) as client:
        client.connect()
        state = client.reset({0: 0})
    assert 0 in state.initial_state.environment_states
    stats = server.stats
    assert (stats.sessions_opened, stats.sessions_superseded, stats.sessions_closed) == (2, 1, 1)


def test_step_with_the_wrong_number_of_environments_is_rejected(mock_ue: MockFactory) -> None:
    server = mock_ue(num_envs=3)
    with GymClient(server.address, startup_timeout_s=5) as client:
        client.connect()
        client.reset(dict.fromkeys(range(3)))
        update = pb.StateUpdate()
        update.step.environments.add().updates["agent_0"].discrete_point.value = 0
        with pytest.raises(UEProtocolError, match="step has 1 environments, game hosts 3"):
            client.step(update)


def test_reset_of_an_environment_the_game_does_not_host_is_rejected(
    mock_ue: MockFactory,
) -> None:
    server = mock_ue(num_envs=2)
    with GymClient(server.address, startup_timeout_s=5) as client:
        client.connect()
        with pytest.raises(UEProtocolError, match="reset of environment 5"):
            client.reset({5: None})


def test_a_taken_port_is_an_error_not_a_shared_socket(mock_ue: MockFactory) -> None:
    first = mock_ue()
    with pytest.raises(OSError, match="cannot bind"):
        MockUEServer(port=first.port).start()


def test_unknown_env_id_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown env 'NoSuchGame-v9'"):
        MockUEServer(env_id="NoSuchGame-v9")


def test_any_gymnasium_id_is_served_as_a_single_agent() -> None:
    scenario = scenario_for("MountainCar-v0")
    assert [(s.agent_id, s.agent_type) for s in scenario.slots] == [("agent_0", "mountaincar")]


def test_process_stops_cleanly_on_sigterm_and_writes_stats(tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.cli",
            "mock-ue",
            "--port",
            "0",
            "--envs",
            "2",
            "--stats-file",
            str(stats_file),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("mock-ue listening on 127.0.0.1:")
        address = line.split("listening on ", 1)[1].split()[0]
        with GymClient(address, startup_timeout_s=10) as client:
            client.connect()
            client.reset({0: 0, 1: 0})
            update = pb.StateUpdate()
            for _ in range(2):
                update.step.environments.add().updates["agent_0"].discrete_point.value = 0
            client.step(update)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stats = json.loads(stats_file.read_text())
    assert stats == {
        "sessions_opened": 1,
        "sessions_closed": 1,
        "sessions_superseded": 0,
        "resets": 1,
        "steps": 1,
        "env_steps": 2,
        "episodes_ended": 0,
    }


def test_compiled_server_exits_zero_on_sigterm_with_a_client_still_connected() -> None:
    # Its connection threads hold Python thread states: none may outlive the interpreter.
    from native_required import require_compiled_client

    require_compiled_client()
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.cli", "mock-ue", "--port", "0", "--transport", "native"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        address = line.split(" on ", 1)[1].split()[0]
        with GymClient(address, startup_timeout_s=10, transport="native") as client:
            client.connect()
            client.reset({0: 0})
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_mock_needs_neither_ray_nor_torch(tmp_path: Path) -> None:
    # The mock-ue image installs only grpc, protobuf, gymnasium, numpy and pydantic.
    script = tmp_path / "run.py"
    script.write_text(
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('ray', 'torch', 'pulumi'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from training.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), "mock-ue", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line
        address = line.split("listening on ", 1)[1].split()[0]
        with GymClient(address, startup_timeout_s=10) as client:
            client.connect()
            assert len(client.training_definition().environment_definitions) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _message_state(
    entries: list[dict[str, tuple[Any, float, bool, bool]]], spaces: dict
) -> pb.State:
    """The reference encoding: the same training state built as protobuf messages."""
    state = pb.State()
    state.training_state.SetInParent()
    for env in entries:
        env_state = state.training_state.environment_states.add()
        for aid, (obs, reward, term, trunc) in env.items():
            st = env_state.agent_states[aid]
            codec.value_to_point(spaces[aid], obs, st.observations)
            st.reward, st.terminated, st.truncated = reward, term, trunc
    return state


@pytest.mark.parametrize(
    "spaces",
    [
        {"a": gym.spaces.Box(-1.0, 1.0, (4,), np.float32)},
        {"a": gym.spaces.Box(0, 255, (3, 50), np.uint8), "b": gym.spaces.Discrete(3)},
        {"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float64), "b": gym.spaces.Discrete(5)},
    ],
)
def test_hand_encoded_replies_parse_as_the_message_built_state(spaces: dict) -> None:
    rng = np.random.default_rng(0)
    n = 5
    encoders = [wire.AgentEntryEncoder(aid, space) for aid, space in spaces.items()]
    values = {
        aid: (
            [space.sample() for _ in range(n)],
            rng.normal(size=n).astype(np.float32).tolist(),
            rng.random(n) < 0.5,
            rng.random(n) < 0.5,
        )
        for aid, space in spaces.items()
    }
    # Every agent everywhere: the whole-reply template when all layouts are fixed.
    everywhere = [
        {aid: (v[0][i], v[1][i], bool(v[2][i]), bool(v[3][i])) for aid, v in values.items()}
        for i in range(n)
    ]
    if all(e.fixed for e in encoders):
        full = wire.FullReply(encoders, n)
        for k, v in enumerate(values.values()):
            full.set(k, np.stack(v[0]), *v[1:])
        assert pb.State.FromString(full.tobytes()) == _message_state(everywhere, spaces)
    # Agents in some environments only: per-entry encoding.
    where = {aid: [i for i in range(n) if (i + k) % 2] for k, aid in enumerate(spaces)}
    parts: list[list[bytes]] = [[] for _ in range(n)]
    for enc in encoders:
        idx, v = where[enc.agent_id], values[enc.agent_id]
        rows = enc.encode([v[0][i] for i in idx], *([x[i] for i in idx] for x in v[1:]))
        for i, entry in zip(idx, rows, strict=True):
            parts[i].append(entry)
    some = [{aid: e[aid] for aid in spaces if i in where[aid]} for i, e in enumerate(everywhere)]
    assert pb.State.FromString(wire.training_state(n, parts)) == _message_state(some, spaces)


def test_the_game_counts_the_episodes_it_ended(mock_ue: MockFactory) -> None:
    # What training may count as finished episodes (tests/test_rescale_e2e.py holds RLlib
    # to it): an environment whose every agent is done.
    server = mock_ue("CartPole-v1", num_envs=2)
    ended = 0
    with GymClient(server.address, startup_timeout_s=5) as client:
        client.connect()
        client.reset({0: 0, 1: 1})
        for _ in range(60):  # always pushing left ends a CartPole episode in ~10 steps
            update = pb.StateUpdate()
            for _ in range(2):
                update.step.environments.add().updates["agent_0"].discrete_point.value = 0
            state = client.step(update)
            ended += sum(
                all(a.terminated or a.truncated for a in env.agent_states.values())
                for env in state.training_state.environment_states
            )
    assert ended >= 4 and server.stats.episodes_ended == ended
