"""Client for one Schola-enabled UE game instance.

Unlike Schola's reference client, every call has a deadline and keepalive is on,
so a game that hangs or dies surfaces as a `UEConnectionError` naming the
endpoint and the operation instead of a hung trainer. Calls go through a
`Transport` (gRPC Python, or uerl's compiled client) as bytes; this class owns
the session and the messages.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from training.clients.choice import open_transport
from training.clients.grpcio_transport import CHANNEL_OPTIONS
from training.clients.unreachable import why_unreachable
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.errors import UEConnectionError, UEProtocolError
from training.protocol.transport import MAX_MESSAGE_BYTES, RESET, STEP, CallError, Transport
from training.tls.config import TLSConfig
from training.tls.handshake import check_handshake, split_endpoint

log = logging.getLogger(__name__)

M = TypeVar("M", bound=ProtoMessage)

__all__ = ["CHANNEL_OPTIONS", "MAX_MESSAGE_BYTES", "GymClient", "parse_state"]

SERVICE = "/Schola.GymService/"
UPDATE_STATE = SERVICE + "UpdateState"


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
        transport: str | None = None,
    ) -> None:
        split_endpoint(endpoint)  # a ValueError naming it, not the transport's own error
        self.endpoint = endpoint
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.close_timeout_s = close_timeout_s
        self.tls = tls
        # "auto" | "native" | "python"; None: the UERL_GAME_CLIENT setting.
        self.transport_choice = transport
        self._transport: Transport | None = None
        self._session_open = False

    @property
    def transport(self) -> Transport | None:
        """What carries the calls; None while not connected (or after close)."""
        return self._transport

    @property
    def transport_name(self) -> str | None:
        """Which transport carries the calls ("native" or "python"), once connected."""
        return None if self._transport is None else self._transport.name

    # ------------------------------------------------------------------ lifecycle

    def connect(self, autoreset: int = pb.NEXT_STEP) -> None:
        """Wait (up to the start timeout) for the game, then StartGymConnector."""
        deadline = time.monotonic() + self.startup_timeout_s
        if self._transport is None and self.tls is not None:
            # gRPC would retry a TLS failure until the deadline and then say only
            # that no connection could be made: this names the cause at once.
            check_handshake(self.endpoint, self.tls, timeout_s=self.startup_timeout_s)
        if self._transport is None:
            self._transport = open_transport(self.endpoint, self.tls, self.transport_choice)
        if not self._transport.wait_ready(max(deadline - time.monotonic(), 0.1)):
            self._close_transport()
            why = (
                why_unreachable(self.endpoint)
                if self.tls is None
                else "no gRPC connection could be made"
            )
            raise UEConnectionError(
                self.endpoint,
                "StartGymConnector",
                f"did not answer StartGymConnector within {self.startup_timeout_s:g} s ({why})",
            )
        remaining = max(deadline - time.monotonic(), 0.1)
        request = pb.GymConnectorStartRequest(autoreset_type=autoreset)
        self._call("StartGymConnector", request.SerializeToString(), remaining)
        self._session_open = True

    def close(self) -> None:
        """Send CLOSED (best effort, short deadline) and release the channel. Idempotent."""
        if self._transport is None:
            return
        try:
            if self._session_open:
                self._session_open = False
                request = pb.StateUpdate(status=pb.CLOSED).SerializeToString()
                self._call("UpdateState(CLOSED)", request, self.close_timeout_s)
        except (UEConnectionError, UEProtocolError) as exc:
            # The game may already be gone; closing must not mask the original failure.
            log.warning("closing session: %s", exc)
        finally:
            self._close_transport()

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
        operation = "RequestTrainingDefinition"
        data = self._call(
            operation, pb.TrainingDefinitionRequest().SerializeToString(), self.request_timeout_s
        )
        return _parse(pb.TrainingDefinition, data, self.endpoint, operation)

    def update(self, update: pb.StateUpdate, operation: str = "UpdateState") -> pb.State:
        """Send a prepared StateUpdate (reset or step) and return the game's State."""
        data = self.update_bytes(update.SerializeToString(), operation)
        return parse_state(data, self.endpoint, operation)

    def update_bytes(self, request: bytes, operation: str = STEP) -> bytes:
        """UpdateState with an encoded request; the reply's bytes, for the step codecs."""
        return self._call(operation, request, self.request_timeout_s)

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
        return self.update(update, RESET)

    def step(self, update: pb.StateUpdate) -> pb.State:
        return self.update(update, STEP)

    # ------------------------------------------------------------------ internals

    def _call(self, operation: str, request: bytes, timeout_s: float) -> bytes:
        if self._transport is None:
            raise UEConnectionError(
                self.endpoint,
                operation,
                f"is not connected for {operation} (session closed or never opened)",
            )
        method = SERVICE + operation.split("(", 1)[0]
        try:
            return self._transport.call(method, request, timeout_s)
        except CallError as exc:
            raise self._translate(exc, operation, timeout_s) from exc

    def failure(self, exc: CallError, operation: str) -> Exception:
        """The error to raise for a failed request-timeout call (UEConnectionError/...)."""
        return self._translate(exc, operation, self.request_timeout_s)

    def _translate(self, exc: CallError, operation: str, timeout_s: float) -> Exception:
        if exc.code == "DEADLINE_EXCEEDED":
            return UEConnectionError(
                self.endpoint, operation, f"did not answer {operation} within {timeout_s:g} s"
            )
        if exc.code in ("UNAVAILABLE", "CANCELLED"):
            return UEConnectionError(
                self.endpoint, operation, f"went away during {operation}: {exc.details}"
            )
        return UEProtocolError(self.endpoint, operation, f"gRPC status {exc.code}: {exc.details}")

    def _close_transport(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._transport = None
        self._session_open = False


def _parse(kind: type[M], data: bytes, endpoint: str, operation: str) -> M:
    try:
        return kind.FromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise UEProtocolError(
            endpoint,
            operation,
            f"reply of {len(data)} bytes is not a {kind.__name__} message ({exc})",
        ) from None


def parse_state(data: bytes, endpoint: str, operation: str) -> pb.State:
    """A reply's bytes as a State message; anything else is the game's protocol error."""
    return _parse(pb.State, data, endpoint, operation)
