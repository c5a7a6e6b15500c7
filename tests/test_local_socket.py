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


def _impostor(name: str, uid: int | None) -> int:
    """A process that holds the abstract socket `name` and accepts on it (as `uid`, when
    given); its pid once it listens."""
    ready, up = os.pipe()
    pid = os.fork()
    if pid == 0:  # the impostor: only syscalls here, then _exit (a forked pytest)
        try:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(name.encode())
                sock.listen(8)
                os.write(up, b"up")
                while True:
                    sock.accept()
        finally:
            os._exit(0)
    os.close(up)
    assert os.read(ready, 2) == b"up"
    os.close(ready)
    return pid


NOBODY = 65534
# How the socket's user and the client's differ. As root: the impostor runs as `nobody`.
# As any user: the impostor runs as this one and the client is told it is another
# (`Channel._trust_local_socket_of`, the uid the guard compares SO_PEERCRED's with). The
# first needs root, so it is only collected then: nothing here skips.
DIFFERENT_USERS = ["a_client_of_another_uid"] + (
    ["an_impostor_of_another_user"] if os.geteuid() == 0 else []
)


@pytest.fixture(params=DIFFERENT_USERS)
def name_taken_by_another_user(
    request: pytest.FixtureRequest, mock_ue: MockFactory
) -> Iterator[tuple[MockUEServer, int | None]]:
    """A game on TCP whose socket name a process of another user than the client's holds
    (and accepts on); with the uid the client must be told it runs as (None: its own)."""
    game = mock_ue(transport="grpcio")
    impostor_uid = NOBODY if request.param == "an_impostor_of_another_user" else None
    pid = _impostor(_socket_name("127.0.0.1", game.port), impostor_uid)
    client_uid = os.geteuid() + 1 if impostor_uid is None else None
    yield game, client_uid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_socket_another_user_serves_is_passed_over_for_tcp(
    name_taken_by_another_user: tuple[MockUEServer, int | None],
) -> None:
    import uerl_native

    game, client_uid = name_taken_by_another_user
    channel = uerl_native.Channel(game.address, MAX_MESSAGE_BYTES)
    if client_uid is not None:
        channel._trust_local_socket_of(client_uid)
    channel.wait_ready(10.0)
    assert channel.call(DEFINITION, b"", 10.0)
    assert channel.via == "tcp"


def test_a_client_told_its_own_uid_still_takes_the_unix_socket(mock_ue: MockFactory) -> None:
    # The test hook above changes whom the guard trusts, not whether it is consulted.
    import uerl_native

    game = mock_ue(transport="native")
    channel = uerl_native.Channel(game.address, MAX_MESSAGE_BYTES)
    channel._trust_local_socket_of(os.geteuid())
    channel.wait_ready(10.0)
    assert channel.via == "unix"
