"""Which client carries a game's calls: the compiled one when it is built and the game
is plaintext, gRPC Python otherwise; `UERL_GAME_CLIENT` overrides."""

from __future__ import annotations

import os

from training.clients import native
from training.clients.grpcio_transport import GrpcioTransport
from training.protocol.errors import UEConnectionError
from training.protocol.step_codec import PythonStepCodec, StepCodec
from training.protocol.step_layout import StepLayout
from training.protocol.transport import Transport
from training.tls.config import TLSConfig

# `UERL_GAME_CLIENT`: "auto" (compiled when built and the game is plaintext), "native"
# (compiled or fail), "python" (gRPC Python always).
CLIENT_ENV = "UERL_GAME_CLIENT"
CLIENT_CHOICES = ("auto", "native", "python")


def client_choice() -> str:
    choice = os.environ.get(CLIENT_ENV, "auto").strip().lower() or "auto"
    if choice not in CLIENT_CHOICES:
        raise ValueError(f"{CLIENT_ENV}={choice!r}: expected one of {', '.join(CLIENT_CHOICES)}")
    return choice


def open_transport(endpoint: str, tls: TLSConfig | None, choice: str | None = None) -> Transport:
    """The transport `choice` (default: `UERL_GAME_CLIENT`) selects for this game."""
    choice = choice or client_choice()
    if choice == "python" or (choice == "auto" and (tls is not None or not native.available())):
        return GrpcioTransport(endpoint, tls)
    if tls is not None:
        raise UEConnectionError(
            endpoint, "connect", f"needs TLS, which {CLIENT_ENV}=native does not speak yet"
        )
    return native.NativeTransport(endpoint)


def open_step_codec(layout: StepLayout, choice: str | None = None) -> StepCodec:
    """The compiled codec when built (and not `UERL_GAME_CLIENT=python`), else Python's."""
    choice = choice or client_choice()
    if choice == "python" or (choice == "auto" and not native.available()):
        return PythonStepCodec(layout)
    return native.NativeStepCodec(layout)
