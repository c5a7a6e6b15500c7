"""Errors raised when talking to a Schola game; every message names the endpoint and operation."""

from __future__ import annotations


class UEError(RuntimeError):
    """Base class: something went wrong between us and one UE game instance."""

    def __init__(self, endpoint: str, operation: str, detail: str) -> None:
        self.endpoint = endpoint
        self.operation = operation
        self.detail = detail
        super().__init__(f"UE game at {endpoint}: {operation}: {detail}")


class UEConnectionError(UEError):
    """The game is unreachable, did not answer in time, or went away mid-call."""

    def __init__(self, endpoint: str, operation: str, detail: str) -> None:
        super().__init__(endpoint, operation, detail)
        # Override the generic wording with the one operators grep for.
        self.args = (f"UE game at {endpoint} {detail} (during {operation})",)

    def __str__(self) -> str:
        return str(self.args[0])


class UEProtocolError(UEError):
    """The game answered, but with something that violates the protocol or our expectations."""
