"""Every call of the compiled client ends within a few ms of its own deadline, also
while another thread of the same channel is connecting (docs/protocol.md, "Deadlines"):
no call waits out another's connection attempt, nor a slow name lookup (networked games
are reached by StatefulSet names, resolved by the system's resolver)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from host_speed import guard
from native_required import require_compiled_client
from raw_h2_server import Peer, RawServer

from training.mock_ue import MockUEServer
from training.protocol.transport import MAX_MESSAGE_BYTES

MockFactory = Callable[..., MockUEServer]
ROOT = Path(__file__).resolve().parent.parent
DEFINITION = "/Schola.GymService/RequestTrainingDefinition"
DEADLINE_EXCEEDED = 4
LATE_S = 0.5  # how far past its deadline a call may end (the interop suite's bound, why)

require_compiled_client()


def _loading(peer: Peer) -> None:
    """A game still loading: it accepts connections and says nothing."""
    peer.hold()


def test_a_call_ends_at_its_deadline_while_another_thread_waits_for_the_game() -> None:
    import uerl_native

    with RawServer(_loading) as server:
        channel = uerl_native.Channel(server.endpoint, MAX_MESSAGE_BYTES)
        # One thread waits up to 5 s for the game to answer its connection...
        waiting = threading.Thread(target=lambda: _ignore(channel.wait_ready, 5.0))
        waiting.start()
        time.sleep(0.2)  # ...and is connecting when the call starts
        start = time.monotonic()
        with pytest.raises(uerl_native.RpcError) as failed:
            channel.call(DEFINITION, b"", 1.0)
        took = time.monotonic() - start
        waiting.join(10)
    assert failed.value.args[0] == DEADLINE_EXCEEDED, failed.value.args
    assert 1.0 - 0.01 <= took <= 1.0 + LATE_S, took


def _ignore(function: Callable[..., Any], *args: Any) -> None:
    import uerl_native

    with contextlib.suppress(uerl_native.RpcError):
        function(*args)


# A resolver that takes 3 s for one name (and then gives 127.0.0.1), preloaded into a
# process of its own: the client resolves with the system's getaddrinfo, as it would a
# StatefulSet name, and this is the one way to make that lookup slow.
SLOW_RESOLVER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <unistd.h>

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
    int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **) =
        dlsym(RTLD_NEXT, "getaddrinfo");
    if (node != NULL && strcmp(node, "slow-to-resolve.uerl.test") == 0) {
        sleep(3);
        node = "127.0.0.1";
    }
    return real(node, service, hints, res);
}
"""

# Two threads, one channel to the slow name: each call's outcome and seconds taken.
TWO_CALLERS = textwrap.dedent(
    """
    import json, sys, threading, time
    sys.path.insert(0, {root!r})
    import uerl_native

    channel = uerl_native.Channel("slow-to-resolve.uerl.test:{port}", 1 << 20)
    results = {{}}

    def call(timeout_s):
        start = time.monotonic()
        try:
            channel.call({method!r}, b"", timeout_s)
            got = "OK"
        except uerl_native.RpcError as exc:
            got = exc.args[0]
        results[timeout_s] = (got, time.monotonic() - start)

    # 1 s apart, more than LATE_S: each ends at its own deadline, not at the other's.
    threads = [threading.Thread(target=call, args=(t,)) for t in (1.0, 2.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def slow_resolver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The preloadable resolver, built with the C compiler Rust links with."""
    source = tmp_path_factory.mktemp("resolver") / "slow_resolver.c"
    source.write_text(SLOW_RESOLVER_C)
    library = source.with_suffix(".so")
    built = subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return library


def _with_slow_resolver(script: str, resolver: Path) -> subprocess.CompletedProcess[str]:
    """`python -c script` with the slow resolver preloaded; it must exit 0."""
    child = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "LD_PRELOAD": str(resolver)},
        capture_output=True, text=True, timeout=guard(180),
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    return child


def test_two_threads_end_at_their_own_deadlines_while_the_name_resolves_slowly(
    mock_ue: MockFactory, slow_resolver: Path
) -> None:
    game = mock_ue(transport="native")
    script = TWO_CALLERS.format(root=str(ROOT), port=game.port, method=DEFINITION)
    child = _with_slow_resolver(script, slow_resolver)
    results = {float(k): v for k, v in json.loads(child.stdout).items()}
    for deadline, (got, took) in results.items():
        assert got == DEADLINE_EXCEEDED, (deadline, got)
        assert deadline - 0.01 <= took <= deadline + LATE_S, (deadline, took)


def test_a_slowly_resolved_name_is_reached_within_a_deadline_that_allows_it(
    mock_ue: MockFactory, slow_resolver: Path
) -> None:
    game = mock_ue(transport="native")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import uerl_native
        channel = uerl_native.Channel("slow-to-resolve.uerl.test:{game.port}", 1 << 20)
        print(len(channel.call({DEFINITION!r}, b"", 10.0)))
        """
    )
    child = _with_slow_resolver(script, slow_resolver)
    assert int(child.stdout) > 0
