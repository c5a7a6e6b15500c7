"""Hostile HTTP/2 servers for the client's interop suite: a TCP listener in a thread
whose every connection runs a script of raw bytes (frames written by hand, HPACK
literals without indexing), to put a client through what no well-behaved gRPC server
sends: frozen replies, floods, malformed header blocks, HTTP/1.1, lies in a length
prefix."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8, 0x9,
)  # fmt: skip
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream & 0x7FFF_FFFF
    ) + payload  # fmt: skip


MAX_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE's default, which clients keep


def data_frames(stream: int, payload: bytes) -> bytes:
    """`payload` as DATA frames no larger than a client accepts."""
    chunks = [payload[i : i + MAX_FRAME] for i in range(0, len(payload), MAX_FRAME)] or [b""]
    return b"".join(frame(DATA, 0, stream, chunk) for chunk in chunks)


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: an integer with an N-bit prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, no Huffman coding."""
    return (
        b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value
    )  # fmt: skip


def header_block(*pairs: tuple[str, str]) -> bytes:
    return b"".join(hpack_literal(n.encode(), v.encode()) for n, v in pairs)


REPLY_HEADERS = header_block((":status", "200"), ("content-type", "application/grpc"))
OK_TRAILERS = header_block(("grpc-status", "0"))


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return bytes([1 if compressed else 0]) + struct.pack(">I", len(payload)) + payload


class Peer:
    """One accepted connection, as a script sees it."""

    def __init__(self, sock: socket.socket, stopping: threading.Event) -> None:
        self.sock = sock
        self.stopping = stopping
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return not self.stopping.is_set()
        except OSError:
            return False
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def read_preface(self) -> bool:
        while len(self.buffer) < len(PREFACE):
            if not self._fill():
                return False
        if not self.buffer.startswith(PREFACE):
            return False
        self.buffer = self.buffer[len(PREFACE) :]
        return True

    def read_frame(self) -> tuple[int, int, int, bytes] | None:
        while True:
            if len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) >= 9 + length:
                    kind, flags = self.buffer[3], self.buffer[4]
                    stream = int.from_bytes(self.buffer[5:9], "big") & 0x7FFF_FFFF
                    payload = self.buffer[9 : 9 + length]
                    self.buffer = self.buffer[9 + length :]
                    return kind, flags, stream, payload
            if not self._fill():
                return None

    def handshake(self) -> bool:
        """Our SETTINGS; the client's preface read."""
        if not self.read_preface():
            return False
        self.send(frame(SETTINGS, 0, 0))
        return True

    def await_request(self) -> int | None:
        """Serve control frames (SETTINGS and PING acknowledged) until a request's last
        frame; its stream id. None: the client left."""
        while True:
            got = self.read_frame()
            if got is None:
                return None
            kind, flags, stream, payload = got
            if kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.send(frame(PING, ACK, 0, payload))
            elif kind in (HEADERS, DATA) and flags & END_STREAM:
                return stream

    def first_request(self) -> int | None:
        """The handshake, then the first request's stream id (None: the client left)."""
        return self.await_request() if self.handshake() else None

    def serve_forever(self) -> None:
        """Acknowledge what a client sends until it leaves (replies nothing)."""
        while self.await_request() is not None:
            pass

    def hold(self) -> None:
        """Keep the connection open, reading and answering nothing, until stopped."""
        while not self.stopping.is_set() and self._fill():
            self.buffer = b""


Script = Callable[[Peer], None]


class RawServer:
    """Runs `script(peer)` for each connection on 127.0.0.1:<port>."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self.connections = 0
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RawServer:
        self.acceptor.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stopping.set()
        self.acceptor.join(5)
        for thread in self.threads:
            thread.join(5)
        self.listener.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            sock.settimeout(0.2)
            thread = threading.Thread(target=self._run, args=(sock,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _run(self, sock: socket.socket) -> None:
        try:
            self.script(Peer(sock, self.stopping))
        except OSError:
            pass  # the client left mid-script
        finally:
            sock.close()


def pause(peer: Peer, seconds: float) -> bool:
    """Sleep in small steps; False once the server stops."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if peer.stopping.is_set():
            return False
        time.sleep(min(0.01, end - time.monotonic()) if end > time.monotonic() else 0)
    return True


def seen_then_gone(requests: list[int], goaway: bool) -> Script:
    """A game that takes in a request and is gone before it answers: with `goaway`, it
    first says GOAWAY naming that request's stream as processed (the game may have acted
    on it); either way the connection then ends. `requests` gets each request's stream."""

    def script(peer: Peer) -> None:
        stream = peer.first_request()
        if stream is None:
            return
        requests.append(stream)
        if goaway:
            peer.send(frame(GOAWAY, 0, 0, struct.pack(">II", stream, 0)))

    return script
