"""uerl's compiled game client: the transport and the step codec in Rust (`native/`).

`make setup` builds it (tonic + prost, exposed with PyO3) when cargo is on the machine.
It is chosen automatically for plaintext games; `UERL_GAME_CLIENT=python` forces gRPC
Python, `=native` insists on this one. Without it every path works the same, slower.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType

from training.native_client.step_codec import NativeStepCodec
from training.native_client.transport import NativeTransport

__all__ = ["NativeStepCodec", "NativeTransport", "available", "module"]


@cache
def module() -> ModuleType | None:
    try:
        import uerl_native
    except ImportError:
        return None
    return uerl_native


def available() -> bool:
    return module() is not None
