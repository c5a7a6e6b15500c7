"""How GymClient's calls reach a game: raw request bytes in, raw reply bytes out.

Two transports with one contract: gRPC Python (`GrpcioTransport`, every feature,
TLS included) and uerl's compiled client (`training.native_client`, the cheap one
per call). Both raise `CallError` with the gRPC status name, so GymClient turns
failures into the same `UEConnectionError`/`UEProtocolError` whichever carried them.
"""

from __future__ import annotations

import os
from typing import Protocol

from training.protocol.errors import UEConnectionError
from training.tls.config import TLSConfig

MAX_MESSAGE_BYTES = 100 * 1024 * 1024

# `UERL_GAME_CLIENT`: "auto" (compiled when built and the game is plaintext), "native"
# (compiled or fail), "python" (gRPC Python always).
CLIENT_ENV = "UERL_GAME_CLIENT"
CLIENT_CHOICES = ("auto", "native", "python")

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Pings only while a call is in flight: detects a silently vanished game (node
    # loss, network partition) without tripping servers' idle ping-abuse limits.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # UpdateState is not idempotent: never let gRPC replay it transparently.
    ("grpc.enable_retries", 0),
]


class CallError(Exception):
    """A call failed; `code` is the gRPC status name (e.g. "DEADLINE_EXCEEDED")."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class Transport(Protocol):
    name: str

    def wait_ready(self, timeout_s: float) -> bool:
        """Connect, waiting up to `timeout_s` for the game to listen; False if it never did."""
        ...

    def call(self, method: str, request: bytes, timeout_s: float) -> bytes: ...

    def close(self) -> None: ...


class GrpcioTransport:
    name = "python"

    def __init__(self, endpoint: str, tls: TLSConfig | None = None) -> None:
        import grpc

        self._grpc = grpc
        if tls is None:
            self._channel = grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
        else:
            self._channel = grpc.secure_channel(
                endpoint, tls.credentials(), options=CHANNEL_OPTIONS
            )
        self._methods: dict[str, grpc.UnaryUnaryMultiCallable] = {}

    def wait_ready(self, timeout_s: float) -> bool:
        try:
            self._grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except self._grpc.FutureTimeoutError:
            return False
        return True

    def call(self, method: str, request: bytes, timeout_s: float) -> bytes:
        callable_ = self._methods.get(method)
        if callable_ is None:
            # No (de)serialisers: bytes both ways, GymClient parses.
            callable_ = self._methods[method] = self._channel.unary_unary(
                method, _registered_method=True
            )
        try:
            return callable_(request, timeout=timeout_s)
        except self._grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise CallError(code.name if code else "UNKNOWN", details or "") from None

    def close(self) -> None:
        self._channel.close()


def client_choice() -> str:
    choice = os.environ.get(CLIENT_ENV, "auto").strip().lower() or "auto"
    if choice not in CLIENT_CHOICES:
        raise ValueError(f"{CLIENT_ENV}={choice!r}: expected one of {', '.join(CLIENT_CHOICES)}")
    return choice


def open_transport(endpoint: str, tls: TLSConfig | None, choice: str | None = None) -> Transport:
    """The transport `choice` (default: `UERL_GAME_CLIENT`) selects for this game."""
    from training import native_client

    choice = choice or client_choice()
    if choice == "python" or (
        choice == "auto" and (tls is not None or not native_client.available())
    ):
        return GrpcioTransport(endpoint, tls)
    if tls is not None:
        raise UEConnectionError(
            endpoint, "connect", f"needs TLS, which {CLIENT_ENV}=native does not speak yet"
        )
    return native_client.NativeTransport(endpoint)
