"""Errors raised when talking to a Schola game; every message names the endpoint and operation."""

from __future__ import annotations


class UEError(RuntimeError):
    """Something went wrong between us and one UE game instance."""

    def __init__(self, endpoint: str, operation: str, detail: str) -> None:
        self.endpoint = endpoint
        self.operation = operation
        self.detail = detail
        super().__init__(self._format())

    def _format(self) -> str:
        return f"UE game at {self.endpoint}: {self.operation}: {self.detail}"

    def __reduce__(self) -> tuple:
        # Keep the structured fields when Ray ships the exception between processes.
        return (type(self), (self.endpoint, self.operation, self.detail))


class UEConnectionError(UEError):
    """The game is unreachable, did not answer in time, or went away mid-call.

    `detail` is a verb phrase, e.g. "did not answer StartGymConnector within 5 s".
    """

    def _format(self) -> str:
        return f"UE game at {self.endpoint} {self.detail}"


class UETLSError(UEConnectionError):
    """The game answered, but TLS with it cannot work (wrong CA, expired or misnamed
    certificate, plaintext game, refused client certificate): retrying will not help."""

    def __init__(self, endpoint: str, detail: str, operation: str = "TLS") -> None:
        super().__init__(endpoint, operation, detail)

    def _format(self) -> str:
        return f"UE game at {self.endpoint} {self.detail}"

    def __reduce__(self) -> tuple:
        return (type(self), (self.endpoint, self.detail, self.operation))


class UEProtocolError(UEError):
    """The game answered, but with something that breaks the protocol or our expectations."""

    def _format(self) -> str:
        return f"UE game at {self.endpoint} answered {self.operation} wrongly: {self.detail}"


class UEGameRefused(UEProtocolError):
    """The game answered within the protocol, but this run cannot train on it as asked
    (e.g. the single-agent path on a game that leaves its agent out of a step). Not a
    fault: the game answers the same way after a reconnect, so the run is refused."""
