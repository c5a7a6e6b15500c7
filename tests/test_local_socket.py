"""A game on the runner's machine is reached over a Unix socket when uerl serves it.

The compiled server, bound to a loopback address, also listens on an abstract Unix
socket named for that address; the compiled client tries it first and falls back to TCP
(`native/src/local_socket.rs`, docs/protocol.md). It must never reach another game than
TCP would, nor a socket another user took.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from native_required import require_compiled_client

from training.mock_ue import MockUEServer
from training.protocol.transport import MAX_MESSAGE_BYTES

MockFactory = Callable[..., MockUEServer]
DEFINITION = "/Schola.GymService/RequestTrainingDefinition"

require_compiled_client()


def _channel(address: str) -> Any:  # uerl_native.Channel (no stubs)
    import uerl_native

    channel = uerl_native.Channel(address, MAX_MESSAGE_BYTES)
    channel.wait_ready(10.0)
    return channel


def _socket_name(host: str, port: int) -> str:
    return f"\0uerl-game/{host}:{port}"


def test_a_compiled_game_on_loopback_is_reached_over_its_unix_socket(
    mock_ue: MockFactory,
) -> None:
    game = mock_ue(transport="native")
    channel = _channel(game.address)
    assert channel.call(DEFINITION, b"", 10.0)
    assert channel.via == "unix"


def test_localhost_names_the_same_socket_as_127_0_0_1(mock_ue: MockFactory) -> None:
    game = mock_ue(transport="native")
    channel = _channel(f"localhost:{game.port}")
    assert channel.via == "unix"


def test_a_game_without_a_local_socket_is_reached_over_tcp(mock_ue: MockFactory) -> None:
    game = mock_ue(transport="grpcio")  # gRPC's C core, as a Schola game serves
    channel = _channel(game.address)
    assert channel.call(DEFINITION, b"", 10.0)
    assert channel.via == "tcp"


def test_a_compiled_game_on_every_address_offers_no_local_socket() -> None:
    game = MockUEServer("0.0.0.0", 0, transport="native")
    game.start()
    try:
        assert game._native.local_socket is False
        assert _channel(f"127.0.0.1:{game.port}").via == "tcp"
    finally:
        game.stop(grace=0)


def test_a_stopped_game_frees_its_socket_for_the_next_game_on_its_port(
    mock_ue: MockFactory,
) -> None:
    first = mock_ue("CartPole-v1", transport="native")
    cartpole = _channel(first.address).call(DEFINITION, b"", 10.0)
    first.stop(grace=0)
    second = mock_ue("Pendulum-v1", transport="native", port=first.port)
    assert second._native.local_socket is True
    channel = _channel(second.address)
    assert channel.call(DEFINITION, b"", 10.0) != cartpole
    assert channel.via == "unix"


@pytest.fixture
def name_taken_by_another_user(mock_ue: MockFactory) -> Iterator[MockUEServer]:
    """A game on TCP whose socket name a process of user `nobody` holds (and accepts on)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    game = mock_ue(transport="grpcio")
    ready, up = os.pipe()
    pid = os.fork()
    if pid == 0:  # the impostor: only syscalls here, then _exit (a forked pytest)
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(_socket_name("127.0.0.1", game.port).encode())
                sock.listen(8)
                os.write(up, b"up")
                while True:
                    sock.accept()
        finally:
            os._exit(0)
    os.close(up)
    assert os.read(ready, 2) == b"up"
    os.close(ready)
    yield game
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_socket_another_user_serves_is_passed_over_for_tcp(
    name_taken_by_another_user: MockUEServer,
) -> None:
    channel = _channel(name_taken_by_another_user.address)
    assert channel.call(DEFINITION, b"", 10.0)
    assert channel.via == "tcp"
