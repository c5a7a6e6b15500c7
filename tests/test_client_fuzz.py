"""Fuzz: whatever bytes a game's server sends, the compiled client ends each call with
the reply or a gRPC status, on time, and never with a panic or another exception.

What is mutated is real: the bytes gRPC's C core (grpcio's server, what Schola's plugin
serves with) sent for a call, recorded by a proxy: its SETTINGS, PING and WINDOW_UPDATE
frames, the reply's HPACK header blocks (Huffman-coded, indexed), the gRPC length prefix
and message (plain and gzip-compressed) and the trailers. Each case replays a mutant to a
fresh connection. The protobuf inside a reply has its own fuzz test (test_decode_fuzz.py,
and test_native_client.py for the compiled codec).

`UERL_FUZZ_SECONDS` sets how long it runs (default 20; CI runs the default).
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections import Counter

from native_required import require_compiled_client
from raw_h2_server import PREFACE, Peer, RawServer
from test_grpc_interop import grpcio_server

from training.clients import native
from training.protocol.transport import CallError

require_compiled_client()

SECONDS = float(os.environ.get("UERL_FUZZ_SECONDS", "20"))
DEADLINE_S = 0.3
LATE_S = 0.5  # the interop suite's bound (why: tests/test_grpc_interop.py)
# The cases are seeded (the same sequence everywhere): the first that decodes to the
# message is case 176 and four kinds of outcome appear by case 25. An idle host runs about
# 250 in the 20 s, so a slower one runs these 250 whatever its pace; they were 50, which a
# host 1.5x slower would have failed on (no "OK, the message" before case 176).
MIN_CASES = 250
MESSAGE = bytes(range(256)) * 8  # 2 KB, compressible


def record(endpoint: str, method: str, request: bytes) -> tuple[bytes, bytes]:
    """What the server sent for one call on a fresh connection, split where the reply
    starts: (connection set-up, the reply's frames)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    from_server: list[bytes] = []

    def proxy() -> None:
        client, _ = listener.accept()
        host, server_port = endpoint.rsplit(":", 1)
        upstream = socket.create_connection((host, int(server_port)))

        def pump(src: socket.socket, dst: socket.socket, keep: list[bytes] | None) -> None:
            try:
                while data := src.recv(65536):
                    if keep is not None:
                        keep.append(data)
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for sock in (src, dst):
                    sock.close()

        threading.Thread(target=pump, args=(client, upstream, None), daemon=True).start()
        pump(upstream, client, from_server)

    thread = threading.Thread(target=proxy, daemon=True)
    thread.start()
    transport = native.NativeTransport(f"127.0.0.1:{port}")
    assert transport.call(method, request, 5.0) == MESSAGE
    transport.close()
    thread.join(5)
    listener.close()
    return split_at_reply(b"".join(from_server))


def split_at_reply(data: bytes) -> tuple[bytes, bytes]:
    at = 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        stream = int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFF_FFFF
        if stream != 0:
            return data[:at], data[at:]
        at += 9 + length
    raise AssertionError("no reply frames recorded")


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        if kind == 0 and buf:  # flip bits
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:  # overwrite a byte with an interesting value
            buf[rng.randrange(len(buf))] = rng.choice([0x00, 0x01, 0x3F, 0x7F, 0x80, 0xFF])
        elif kind == 2:  # insert random bytes
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = rng.randbytes(rng.randint(1, 32))
        elif kind == 3 and buf:  # delete a range
            at = rng.randrange(len(buf))
            del buf[at : at + rng.randint(1, 32)]
        elif kind == 4 and buf:  # duplicate a range (frames repeated)
            at = rng.randrange(len(buf))
            buf[at:at] = buf[at : at + rng.randint(1, 64)]
        elif kind == 5 and len(buf) > 9:  # a frame header's length or type field
            at = rng.randrange(len(buf) - 9)
            buf[at : at + 4] = rng.randbytes(4)
        elif buf:  # truncate
            del buf[rng.randrange(len(buf)) :]
    return bytes(buf)


class Replayer:
    """Serves each connection the next mutant: the set-up after the client's preface,
    the reply once the client's request is in."""

    def __init__(self) -> None:
        self.case: tuple[bytes, bytes] = (b"", b"")

    def __call__(self, peer: Peer) -> None:
        setup, reply = self.case
        if not peer.read_preface():
            return
        peer.send(setup)
        while not _request_ended(peer):
            pass
        peer.send(reply)
        peer.hold()


def _request_ended(peer: Peer) -> bool:
    """Reads a frame (answering nothing): does it end the request?"""
    got = peer.read_frame()
    if got is None:
        raise OSError("client left")
    kind, flags, stream, _ = got
    return stream != 0 and kind in (0x0, 0x1) and bool(flags & 0x1)


def test_mutated_c_core_replies_end_every_call_with_a_reply_or_a_status_on_time() -> None:
    with grpcio_server() as plain_endpoint:
        plain = record(plain_endpoint, "/t.T/Echo", MESSAGE)
    with grpcio_server(per_call_gzip=True) as gzip_endpoint:
        gzipped = record(gzip_endpoint, "/t.T/Echo", MESSAGE)
    assert PREFACE not in plain[0]
    replayer = Replayer()
    rng = random.Random(31)
    outcomes: Counter[str] = Counter()
    slowest = 0.0
    cases = 0
    with RawServer(replayer) as server:
        # SECONDS of cases, and at least MIN_CASES however slow the host; then a hang guard.
        end, give_up = time.monotonic() + SECONDS, time.monotonic() + SECONDS + 600
        while (time.monotonic() < end or cases < MIN_CASES) and time.monotonic() < give_up:
            setup, reply = rng.choice([plain, gzipped])
            part = rng.randrange(4)  # mostly the reply: set-up mutants rarely get that far
            replayer.case = (
                mutate(rng, setup) if part == 0 else setup,
                mutate(rng, reply) if part != 0 else reply,
            )
            transport = native.NativeTransport(server.endpoint)
            start = time.monotonic()
            try:
                got = transport.call("/t.T/Echo", MESSAGE, DEADLINE_S)
                outcomes["OK, the message" if got == MESSAGE else "OK, other bytes"] += 1
            except CallError as exc:
                outcomes[exc.code] += 1
            except BaseException as exc:  # a panic, a TypeError: the defects this finds
                raise AssertionError(
                    f"case {cases}: {type(exc).__name__}: {exc}; mutant {replayer.case!r}"
                ) from exc
            finally:
                transport.close()
            took = time.monotonic() - start
            slowest = max(slowest, took)
            assert took <= DEADLINE_S + LATE_S, (cases, took, replayer.case)
            cases += 1
    print(
        f"client fuzz: {cases} cases in {SECONDS:.0f} s, slowest {slowest:.3f} s: {dict(outcomes)}"
    )
    # The mutants reach every layer: some still decode, most fail in different ways.
    assert cases >= MIN_CASES and outcomes["OK, the message"] > 0, outcomes
    assert len(outcomes) >= 4, outcomes
