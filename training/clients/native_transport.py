"""`Transport` over the compiled client (`native/src/transport.rs`): gRPC unary calls on
the `h2` crate, driven by the calling thread; what it supports and retries is in
docs/protocol.md."""

from __future__ import annotations

from training.protocol.transport import MAX_MESSAGE_BYTES, CallError

# gRPC status codes by number (grpc/status.h): what the compiled client raises.
STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)


def call_error(exc: Exception) -> CallError:
    """A `uerl_native.RpcError` as the `CallError` every transport raises."""
    code, details = exc.args
    name = STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else "UNKNOWN"
    return CallError(name, details)


class NativeTransport:
    name = "native"

    def __init__(self, endpoint: str) -> None:
        import uerl_native

        self._native = uerl_native
        self._channel = uerl_native.Channel(endpoint, MAX_MESSAGE_BYTES)

    def wait_ready(self, timeout_s: float) -> bool:
        try:
            self._channel.wait_ready(timeout_s)
        except self._native.RpcError:
            return False
        return True

    def call(self, method: str, request: bytes, timeout_s: float) -> bytes:
        try:
            return self._channel.call(method, request, timeout_s)
        except self._native.RpcError as exc:
            raise call_error(exc) from None

    @property
    def channel(self) -> object:
        """The compiled channel, for `NativeVectorStep`."""
        return self._channel

    def close(self) -> None:
        self._channel.close()
