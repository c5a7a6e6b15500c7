"""Turning failures into one clear message (no deep library traceback on the console)."""

from __future__ import annotations

import traceback
from pathlib import Path

from infra.endpoints import EndpointsError
from training.policies.configurations import PolicyConfigurationError
from training.preflight.checks import PreflightError
from training.preflight.discovery import DiscoveryError
from training.protocol.errors import UEError
from training.rllib.hparams import HyperparameterError
from training.run.checkpoints import CheckpointError
from training.run.driver import EnvRunnersDidNotStart
from training.run.opponents import OpponentError

# Errors whose message already says what is wrong and where.
USER_ERRORS: tuple[type[BaseException], ...] = (
    PreflightError,
    DiscoveryError,
    EnvRunnersDidNotStart,
    CheckpointError,
    HyperparameterError,
    EndpointsError,
    PolicyConfigurationError,
    OpponentError,
    UEError,
)
MAX_LINES = 8


def describe(
    exc: BaseException, *, traceback_file: Path | None = None, what: str = "training"
) -> str:
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    text = f"{what} failed: {type(exc).__name__}: " + "\n  ".join(lines[:MAX_LINES])
    if len(lines) > MAX_LINES:
        text += "\n  ..."
    if traceback_file is not None:
        traceback_file.parent.mkdir(parents=True, exist_ok=True)
        traceback_file.write_text("".join(traceback.format_exception(exc)))
        text += f"\n  full traceback: {traceback_file}"
    return text
