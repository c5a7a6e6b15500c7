"""The compiled mock game's server (`native/src/server.rs`) holds a connection's socket
only while it serves it: closed connections free their descriptors, a failing `accept`
(EMFILE) is retried with a backoff instead of a busy loop, and a server dropped without
`stop()` still closes its listener and its connections."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from native_required import require_compiled_client

from training.mock_ue import MockUEServer

MockFactory = Callable[..., MockUEServer]
ROOT = Path(__file__).resolve().parent.parent
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

require_compiled_client()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _settled_fds(at_most: int, timeout_s: float = 20.0) -> int:
    """The open-descriptor count once it is at most `at_most` (each connection's
    thread ends a moment after its client left), or the last count seen."""
    end = time.monotonic() + timeout_s
    count = _open_fds()
    while count > at_most and time.monotonic() < end:
        time.sleep(0.05)
        count = _open_fds()
    return count


def _connect_and_close(port: int, unix: bool) -> None:
    if unix:  # the game's abstract Unix socket, as the compiled client reaches it
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(f"\0uerl-game/127.0.0.1:{port}".encode())
    else:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_thousand_connect_close_cycles_leave_the_games_open_descriptors_flat(
    mock_ue: MockFactory,
) -> None:
    game = mock_ue(transport="native")
    assert game.port is not None and game._native.local_socket
    for i in range(20):  # warm up: whatever is opened once per process
        _connect_and_close(game.port, unix=bool(i % 2))
    before = _settled_fds(at_most=0, timeout_s=1.0)
    # Reconnects, discovery and rescale probes: half over TCP, half over the Unix socket.
    for i in range(1000):
        _connect_and_close(game.port, unix=bool(i % 2))
    after = _settled_fds(at_most=before + 5)
    assert after <= before + 5, (before, after)


# A game whose process may open no more descriptors: once an `accept` that was already
# waiting (Linux reserves its descriptor first) has taken a connection, every `accept`
# fails with EMFILE at once. It reports its acceptor threads' CPU time (ns, from the
# scheduler's per-thread accounting, files opened beforehand) on each line from stdin.
EMFILE_GAME = textwrap.dedent(
    """
    import os, resource, sys, time
    sys.path.insert(0, {root!r})
    import uerl_native

    server = uerl_native.Server("127.0.0.1", 0, lambda method, request: b"")

    def name(tid):
        with open(f"/proc/self/task/{{tid}}/comm") as f:
            return f.read()

    for _ in range(200):  # a thread takes its name once it runs
        tids = [t for t in os.listdir("/proc/self/task") if name(t).startswith("uerl-native-acc")]
        if len(tids) == 2:
            break
        time.sleep(0.01)
    stats = [os.open(f"/proc/self/task/{{tid}}/schedstat", os.O_RDONLY) for tid in tids]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))  # stdin, stdout, stderr: no more
    print(server.port, len(stats), flush=True)
    for _line in sys.stdin:
        print(sum(int(os.pread(fd, 200, 0).split()[0]) for fd in stats), flush=True)
    """
)


def test_an_accept_that_keeps_failing_is_backed_off_not_spun() -> None:
    game = subprocess.Popen(
        [sys.executable, "-c", EMFILE_GAME.format(root=str(ROOT))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert game.stdin is not None and game.stdout is not None
    try:
        port, acceptors = map(int, game.stdout.readline().split())
        assert acceptors == 2  # the TCP and the Unix socket acceptors
        # The first connection is taken (and dropped: the game cannot serve it); from
        # then on each accept fails at once, and a second one waits in the backlog.
        taken = socket.create_connection(("127.0.0.1", port), timeout=5)
        waiting = socket.create_connection(("127.0.0.1", port), timeout=5)

        def acceptors_cpu_ns() -> int:
            game.stdin.write("\n")  # type: ignore[union-attr]
            game.stdin.flush()  # type: ignore[union-attr]
            return int(game.stdout.readline())  # type: ignore[union-attr]

        time.sleep(0.5)  # past the first, short backoffs
        start = acceptors_cpu_ns()
        time.sleep(2.0)
        spent = acceptors_cpu_ns() - start
        taken.close()
        waiting.close()
    finally:
        game.kill()
        game.wait(10)
    # A busy loop takes all the CPU it is given; a backoff (capped at a second) a few
    # wake-ups of microseconds each.
    assert spent < 10_000_000, f"the acceptors ran {spent / 1e6:.1f} ms in 2 s"


def _read_until_closed(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the peer closed the connection within `timeout_s`."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def test_a_server_dropped_without_stop_closes_its_connections() -> None:
    import uerl_native

    server = uerl_native.Server("127.0.0.1", 0, lambda method, request: b"")
    client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    client.sendall(PREFACE)  # an HTTP/2 connection the server now serves
    client.recv(9)  # its SETTINGS: the connection's thread runs
    del server
    gc.collect()
    try:
        assert _read_until_closed(client, timeout_s=5.0)
    finally:
        client.close()


def test_a_server_dropped_without_stop_frees_its_port() -> None:
    import uerl_native

    server = uerl_native.Server("127.0.0.1", 0, lambda method, request: b"")
    port = server.port
    del server
    gc.collect()
    again = uerl_native.Server("127.0.0.1", port, lambda method, request: b"")
    again.stop()
