"""A message over the limit is RESOURCE_EXHAUSTED on both sides of the compiled
transport (`native/`), as gRPC does it: the client refuses to send a request over its
limit, and the compiled server answers a request over its limit without buffering it
(and refuses to send a reply over it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from native_required import require_compiled_client
from raw_h2_server import Peer, RawServer

from training.clients.native_transport import NativeTransport
from training.protocol.transport import MAX_MESSAGE_BYTES, CallError

ROOT = Path(__file__).resolve().parent.parent
ECHO = "/t.T/Echo"
LIMIT = 1 << 20
RESOURCE_EXHAUSTED = 8

require_compiled_client()


def test_the_client_refuses_to_send_a_request_over_its_limit() -> None:
    import uerl_native

    requests: list[int] = []

    def count_requests(peer: Peer) -> None:
        if peer.handshake():
            while (stream := peer.await_request()) is not None:
                requests.append(stream)

    with RawServer(count_requests) as server:
        channel = uerl_native.Channel(server.endpoint, LIMIT)
        with pytest.raises(uerl_native.RpcError) as failed:
            channel.call(ECHO, b"x" * (LIMIT + 1), 2.0)
    assert failed.value.args[0] == RESOURCE_EXHAUSTED, failed.value.args
    assert requests == []  # nothing went out


def test_the_client_sends_a_request_at_its_limit() -> None:
    import uerl_native

    handled: list[int] = []

    def echo(method: str, request: bytes) -> bytes:
        handled.append(len(request))
        return b"ok"

    server = uerl_native.Server("127.0.0.1", 0, echo)
    try:
        channel = uerl_native.Channel(f"127.0.0.1:{server.port}", LIMIT)
        assert channel.call(ECHO, b"x" * LIMIT, 10.0) == b"ok"
    finally:
        server.stop()
    assert handled == [LIMIT]


@pytest.fixture
def limited_server() -> Iterator[tuple[str, list[int]]]:
    """A compiled server whose limit is LIMIT; its address and the request sizes its
    handler saw. The handler answers with as many bytes as the request asks for."""
    import uerl_native

    handled: list[int] = []

    def reply_of_asked_size(method: str, request: bytes) -> bytes:
        handled.append(len(request))
        return b"r" * int(request) if len(request) < 20 else b"ok"

    server = uerl_native.Server("127.0.0.1", 0, reply_of_asked_size, max_message_bytes=LIMIT)
    try:
        yield f"127.0.0.1:{server.port}", handled
    finally:
        server.stop()


def _call_with(client: str, address: str, request: bytes) -> tuple[str, Any]:
    """("OK", reply) or (status name, details), from gRPC Python's client or the
    compiled one (each with a limit above the server's)."""
    if client == "grpcio":
        options = [("grpc.max_send_message_length", 64 << 20)]
        with grpc.insecure_channel(address, options=options) as channel:
            call = channel.unary_unary(ECHO)
            try:
                return "OK", call(request, timeout=10.0)
            except grpc.RpcError as exc:
                return exc.code().name, exc.details()
    transport = NativeTransport(address)
    try:
        return "OK", transport.call(ECHO, request, 10.0)
    except CallError as exc:
        return exc.code, exc.details
    finally:
        transport.close()


@pytest.mark.parametrize("client", ["grpcio", "compiled"])
def test_the_server_answers_a_request_over_its_limit_with_resource_exhausted(
    limited_server: tuple[str, list[int]], client: str
) -> None:
    address, handled = limited_server
    got = _call_with(client, address, b"x" * (LIMIT + 1))
    assert got[0] == "RESOURCE_EXHAUSTED", got
    assert handled == []  # the game never saw it


@pytest.mark.parametrize("client", ["grpcio", "compiled"])
def test_the_server_refuses_to_send_a_reply_over_its_limit(
    limited_server: tuple[str, list[int]], client: str
) -> None:
    address, _ = limited_server
    assert _call_with(client, address, str(LIMIT).encode()) == ("OK", b"r" * LIMIT)
    got = _call_with(client, address, str(LIMIT + 1).encode())
    assert got[0] == "RESOURCE_EXHAUSTED", got


# The compiled server alone in a process (limit 1 MiB), reporting its peak resident
# memory (KiB) on each line read from stdin.
LIMITED_GAME = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, {root!r})
    import uerl_native

    server = uerl_native.Server("127.0.0.1", 0, lambda m, r: b"", max_message_bytes={limit})
    print(server.port, flush=True)
    for _line in sys.stdin:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
    """
)


def test_the_server_does_not_buffer_a_request_past_its_limit() -> None:
    game = subprocess.Popen(
        [sys.executable, "-c", LIMITED_GAME.format(root=str(ROOT), limit=LIMIT)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert game.stdin is not None and game.stdout is not None

    def peak_kib() -> int:
        game.stdin.write("\n")  # type: ignore[union-attr]
        game.stdin.flush()  # type: ignore[union-attr]
        return int(game.stdout.readline())  # type: ignore[union-attr]

    try:
        address = f"127.0.0.1:{int(game.stdout.readline())}"
        before = peak_kib()
        # 64 MiB from a client whose own limit (MAX_MESSAGE_BYTES) lets it send them.
        got = _call_with("compiled", address, b"x" * (64 << 20))
        grown_mib = (peak_kib() - before) / 1024
    finally:
        game.kill()
        game.wait(10)
    assert MAX_MESSAGE_BYTES > 64 << 20
    assert got[0] == "RESOURCE_EXHAUSTED", got
    assert grown_mib < 16, f"the server grew by {grown_mib:.0f} MiB"
