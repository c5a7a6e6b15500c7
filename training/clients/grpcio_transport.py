"""`Transport` over gRPC Python: every feature (TLS included), one Python call per request."""

from __future__ import annotations

from training.protocol.transport import MAX_MESSAGE_BYTES, CallError
from training.tls.config import TLSConfig

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Pings only while a call is in flight: detects a silently vanished game (node
    # loss, network partition) without tripping servers' idle ping-abuse limits.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # Only transparent retries (no retry policy is configured): a call is sent again only
    # when the game provably never saw it (refused stream, above a GOAWAY's last stream),
    # as the compiled client does; UpdateState is not idempotent, so nothing else is.
    ("grpc.enable_retries", 1),
]


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
            reply = callable_(request, timeout=timeout_s)
        except self._grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise CallError(code.name if code else "UNKNOWN", details or "") from None
        if reply is None:
            # gRPC Python's unary call gives None for an OK status with no message.
            raise CallError("INTERNAL", "the game answered OK without a reply message")
        return reply

    def close(self) -> None:
        self._channel.close()
