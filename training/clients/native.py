"""uerl's compiled game client (`native/`, Rust exposed with PyO3): is it built?

`make setup` builds it when cargo is on the machine. It is chosen automatically for
plaintext games (`training.clients.choice`); `UERL_GAME_CLIENT=python` forces gRPC
Python, `=native` insists on this one. Without it every path works the same, slower.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType

from training.clients.native_step_codec import NativeStepCodec
from training.clients.native_transport import NativeTransport

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
