"""A local port that reaches a port of the Ray head pod through the Kubernetes API, as
`kubectl port-forward` does, but following the head when it is replaced.

`Relay` listens on 127.0.0.1 (an ephemeral port). For each connection it accepts it calls
`connect()` for a stream to the pod's port and pumps bytes each way in two threads. The
`connect` function is injected: on a cluster, `HeadConnection` (the head pod found again
for each connection, so a new head is followed) over `kubernetes.stream.portforward`;
in tests, a plain TCP connection.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

CHUNK = 1 << 16
# A relayed connection with no byte either way for this long is closed: a port-forward
# whose pod went away can stall rather than close, and the HTTP client above has no
# timeout of its own. The job API answers in well under this.
IDLE_S = 120.0
# How long `connect()` may take (finding the head, the API's websocket handshake) before
# the local connection is closed, so its client fails and retries instead of hanging.
CONNECT_S = 30.0
# How often a waiting thread looks up from its socket (closed relay, idle link).
POLL_S = 0.5


class Stream(Protocol):
    """What the relay needs of the pod-side stream: a socket's blocking calls."""

    def fileno(self) -> int: ...
    def recv(self, size: int, /) -> bytes: ...
    def sendall(self, data: bytes, /) -> Any: ...
    def shutdown(self, how: int, /) -> None: ...
    def close(self) -> None: ...


Connect = Callable[[], Stream]


class _Link:
    """One relayed connection: the local client and the pod-side stream."""

    def __init__(self, client: socket.socket, upstream: Stream, idle_s: float) -> None:
        self.client = client
        self.upstream = upstream
        self.idle_s = idle_s
        self.last_byte = time.monotonic()
        self.ended = threading.Event()

    def pump(self, source: Stream, sink: Stream) -> None:
        try:
            while not self.ended.is_set():
                # select, not a socket timeout: a timed-out sendall would have sent an
                # unknown part of its data.
                readable, _, _ = select.select([source], [], [], POLL_S)
                if not readable:
                    if time.monotonic() - self.last_byte > self.idle_s:
                        break
                    continue
                data = source.recv(CHUNK)
                if not data:
                    break
                self.last_byte = time.monotonic()
                sink.sendall(data)
        except (OSError, ValueError):  # reset, closed under us (fileno -1)
            pass
        finally:
            self.end()

    def end(self) -> None:
        """Both directions end when one does. A half-close would not carry through the
        API's port-forward (it drops the rest of the pod's answer), so none is tried."""
        self.ended.set()
        for stream in (self.client, self.upstream):
            with contextlib.suppress(OSError, ValueError):
                stream.shutdown(socket.SHUT_RDWR)  # wakes the other pump


class Relay:
    """127.0.0.1:<ephemeral> -> `connect()`, one pod-side stream per local connection."""

    def __init__(
        self,
        connect: Connect,
        *,
        idle_s: float = IDLE_S,
        connect_s: float = CONNECT_S,
    ) -> None:
        self._connect = connect
        self._idle_s = idle_s
        self._connect_s = connect_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_S)  # accept looks up now and then: closed?
        self.port: int = self._listener.getsockname()[1]
        # Why the last connection could not reach the pod (None: the last one did).
        self.last_error: str | None = None
        self._closed = threading.Event()
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="relay-accept", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.end()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(POLL_S)  # out of file descriptors: try again, do not spin
                continue
            threading.Thread(
                target=self._relay, args=(client,), name="relay-link", daemon=True
            ).start()

    def _open_upstream(self, client: socket.socket) -> Stream | None:
        connected = threading.Event()

        def too_slow() -> None:
            if not connected.is_set():
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)  # the client fails, and retries

        timer = threading.Timer(self._connect_s, too_slow)
        timer.daemon = True
        timer.start()
        try:
            upstream = self._connect()
        except Exception as exc:  # whatever connect raises is this connection's end only
            self.last_error = str(exc) or type(exc).__name__
            return None
        finally:
            connected.set()
            timer.cancel()
        self.last_error = None
        return upstream

    def _relay(self, client: socket.socket) -> None:
        upstream = self._open_upstream(client)
        if upstream is None or self._closed.is_set():
            client.close()
            if upstream is not None:
                upstream.close()
            return
        link = _Link(client, upstream, self._idle_s)
        with self._lock:
            self._links.add(link)
        back = threading.Thread(
            target=link.pump, args=(upstream, client), name="relay-back", daemon=True
        )
        back.start()
        link.pump(client, upstream)
        back.join()
        with self._lock:
            self._links.discard(link)
        # The pod side may say why it ended (`_PodStream.error`): kept for the messages.
        with contextlib.suppress(Exception):
            said = upstream.error()  # type: ignore[attr-defined]
            if said:
                self.last_error = str(said)
        for stream in (client, upstream):
            with contextlib.suppress(OSError):
                stream.close()


class HeadConnection:
    """The Relay's `connect` on a cluster: for each connection, the head pod as
    `find_head()` sees it now (the same pod while it stays Ready, its successor once it
    is gone), then a stream to its port from `open_port(pod)`."""

    def __init__(self, find_head: Callable[[], str], open_port: Callable[[str], Stream]) -> None:
        self._find_head = find_head
        self._open_port = open_port
        self.head: str | None = None  # the pod of the last connection

    def __call__(self) -> Stream:
        pod = self._find_head()
        self.head = pod
        return self._open_port(pod)


def pod_port_opener(api_client: Any, namespace: str, port: int) -> Callable[[str], Stream]:
    """`open_port(pod)`: a stream to `port` of the pod, through the API server's
    port-forward (a websocket; `kubernetes.stream.portforward`)."""
    from kubernetes.client import ApiClient, CoreV1Api
    from kubernetes.stream import portforward

    def open_port(pod: str) -> Stream:
        # kubernetes.stream swaps its client's `request` for the websocket's while one
        # opens: a client of its own, or a call another thread makes on the shared one
        # then (the head's lookup, the log's stream, a status poll) goes to the swap.
        core = CoreV1Api(ApiClient(api_client.configuration))
        try:
            forward = portforward(
                core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)
            )
        except Exception as exc:  # ApiException(status=0): the handshake failed
            reason = getattr(exc, "reason", None) or exc
            raise ConnectionError(f"port-forward to pod {pod} port {port}: {reason}") from None
        return _PodStream(forward, pod, port)

    return open_port


class _PodStream:
    """The socket of one API port-forward, and what the kubelet said went wrong (the
    port's error channel: e.g. nothing listens on it in the pod)."""

    def __init__(self, forward: Any, pod: str, port: int) -> None:
        # Its proxy thread holds `forward`; closing the socket ends it and the websocket.
        self._forward = forward
        self._socket = forward.socket(port)
        self._where = f"pod {pod} port {port}"
        self._port = port

    def fileno(self) -> int:
        return int(self._socket.fileno())

    def recv(self, size: int, /) -> bytes:
        return bytes(self._socket.recv(size))

    def sendall(self, data: bytes, /) -> Any:
        return self._socket.sendall(data)

    def shutdown(self, how: int, /) -> None:
        self._socket.shutdown(how)

    def close(self) -> None:
        self._socket.close()

    def error(self) -> str | None:
        said = self._forward.error(self._port)
        return f"port-forward to {self._where}: {said.strip()}" if said else None
