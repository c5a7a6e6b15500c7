"""The contract of a game transport: raw request bytes in, raw reply bytes out.

The implementations live in `training.clients` (gRPC Python and uerl's compiled client);
both raise `CallError` with the gRPC status name, so `GymClient` turns failures into the
same `UEConnectionError`/`UEProtocolError` whichever carried them.
"""

from __future__ import annotations

from typing import Protocol

# The largest message either side sends or accepts (a step of many environments).
MAX_MESSAGE_BYTES = 100 * 1024 * 1024
# The operations errors name: an UpdateState call either steps or resets.
STEP = "UpdateState(step)"
RESET = "UpdateState(reset)"


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
