"""gRPC client for one Schola-enabled UE game instance.

Unlike Schola's reference client, every call has a deadline and keepalive is on,
so a game that hangs or dies surfaces as a `UEConnectionError` naming the
endpoint and the operation instead of a hung trainer.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType

import grpc
from google.protobuf.message import DecodeError

from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol._generated import schola_gym_pb2_grpc as pb_grpc
from training.protocol.errors import UEConnectionError, UEProtocolError
from training.tls.config import TLSConfig
from training.tls.handshake import check_handshake, serves_tls

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 100 * 1024 * 1024

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


class GymClient:
    """One session with one game: connect() -> definition() -> reset()/step()... -> close()."""

    def __init__(
        self,
        endpoint: str,
        *,
        startup_timeout_s: float = 45.0,
        request_timeout_s: float = 60.0,
        close_timeout_s: float = 5.0,
        tls: TLSConfig | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.close_timeout_s = close_timeout_s
        self.tls = tls
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.GymServiceStub | None = None
        self._update_raw: grpc.UnaryUnaryMultiCallable | None = None
        self._session_open = False

    # ------------------------------------------------------------------ lifecycle

    def connect(self, autoreset: int = pb.NEXT_STEP) -> None:
        """Wait (up to the start timeout) for the game, then StartGymConnector."""
        deadline = time.monotonic() + self.startup_timeout_s
        if self._channel is None and self.tls is not None:
            # gRPC would retry a TLS failure until the deadline and then say only
            # that no connection could be made: this names the cause at once.
            check_handshake(self.endpoint, self.tls, timeout_s=self.startup_timeout_s)
        if self._channel is None:
            if self.tls is None:
                self._channel = grpc.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.secure_channel(
                    self.endpoint, self.tls.credentials(), options=CHANNEL_OPTIONS
                )
            self._stub = pb_grpc.GymServiceStub(self._channel)
            # Replies arrive as bytes and are parsed by `parse_state`, so a reply that is
            # not a State message is a UEProtocolError naming the game, like any other.
            self._update_raw = self._channel.unary_unary(
                "/Schola.GymService/UpdateState",
                request_serializer=pb.StateUpdate.SerializeToString,
                response_deserializer=None,
                _registered_method=True,
            )
        try:
            grpc.channel_ready_future(self._channel).result(
                timeout=max(deadline - time.monotonic(), 0.1)
            )
        except grpc.FutureTimeoutError:
            self._close_channel()
            why = "no gRPC connection could be made"
            if self.tls is None and serves_tls(self.endpoint):
                why = "it serves TLS and this client connects without: give it the game's CA"
            raise UEConnectionError(
                self.endpoint,
                "StartGymConnector",
                f"did not answer StartGymConnector within {self.startup_timeout_s:g} s ({why})",
            ) from None
        remaining = max(deadline - time.monotonic(), 0.1)
        self._call(
            "StartGymConnector",
            self._require_stub().StartGymConnector,
            pb.GymConnectorStartRequest(autoreset_type=autoreset),
            remaining,
            wait_for_ready=True,
        )
        self._session_open = True

    def close(self) -> None:
        """Send CLOSED (best effort, short deadline) and release the channel. Idempotent."""
        if self._channel is None:
            return
        try:
            if self._session_open:
                self._session_open = False
                self._call(
                    "UpdateState(CLOSED)",
                    self._require_stub().UpdateState,
                    pb.StateUpdate(status=pb.CLOSED),
                    self.close_timeout_s,
                )
        except (UEConnectionError, UEProtocolError) as exc:
            # The game may already be gone; closing must not mask the original failure.
            log.warning("closing session: %s", exc)
        finally:
            self._close_channel()

    def __enter__(self) -> GymClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ calls

    def training_definition(self) -> pb.TrainingDefinition:
        return self._call(
            "RequestTrainingDefinition",
            self._require_stub().RequestTrainingDefinition,
            pb.TrainingDefinitionRequest(),
            self.request_timeout_s,
        )

    def update(self, update: pb.StateUpdate, operation: str = "UpdateState") -> pb.State:
        """Send a prepared StateUpdate (reset or step) and return the game's State."""
        self._require_stub()
        data = self._call(operation, self._update_raw, update, self.request_timeout_s)
        return parse_state(data, self.endpoint, operation)

    def reset(
        self, seeds: dict[int, int | None], options: dict[str, str] | None = None
    ) -> pb.State:
        """Reset the given environments (index -> seed or None)."""
        update = pb.StateUpdate()
        envs = update.reset.environments
        update.reset.SetInParent()  # an empty reset must still set the oneof
        for index, seed in seeds.items():
            settings = envs[index]
            if seed is not None:
                settings.seed = int(seed)
            if options:
                settings.options.update(options)
        return self.update(update, "UpdateState(reset)")

    def step(self, update: pb.StateUpdate) -> pb.State:
        return self.update(update, "UpdateState(step)")

    # ------------------------------------------------------------------ internals

    def _require_stub(self) -> pb_grpc.GymServiceStub:
        if self._stub is None:
            raise UEConnectionError(
                self.endpoint, "UpdateState", "is not connected (session closed or never opened)"
            )
        return self._stub

    def _call(
        self,
        operation: str,
        method,
        request,
        timeout_s: float,
        wait_for_ready: bool = False,
    ):
        try:
            return method(request, timeout=timeout_s, wait_for_ready=wait_for_ready)
        except grpc.RpcError as exc:
            raise self._translate(exc, operation, timeout_s) from exc

    def _translate(self, exc: grpc.RpcError, operation: str, timeout_s: float) -> Exception:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return UEConnectionError(
                self.endpoint, operation, f"did not answer {operation} within {timeout_s:g} s"
            )
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return UEConnectionError(
                self.endpoint, operation, f"went away during {operation}: {details}"
            )
        return UEProtocolError(
            self.endpoint, operation, f"gRPC status {code.name if code else code}: {details}"
        )

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None
        self._update_raw = None
        self._session_open = False


def parse_state(data: bytes, endpoint: str, operation: str) -> pb.State:
    """A reply's bytes as a State message; anything else is the game's protocol error."""
    try:
        return pb.State.FromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise UEProtocolError(
            endpoint, operation, f"reply of {len(data)} bytes is not a State message ({exc})"
        ) from None
