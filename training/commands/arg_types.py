"""Argument types for the numeric flags: a value out of range is refused by argparse itself,
before anything starts, as `uerl X: error: argument --flag: ...` with exit status 2.

`int()` alone lets `--port 99999` wrap into another port and `--envs 0` fail from inside a
game; these name the flag the user typed and the range it takes.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_PORT = 65535


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text}: not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: not a finite number")
    return value


def int_in(low: int, high: int | None = None, *, meaning: str = "") -> Callable[[str], int]:
    """A whole number from `low` to `high` (no upper bound when None)."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value}: must be {bounds}{meaning}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in its own messages
    return parse


def float_above(low: float) -> Callable[[str], float]:
    """A finite number greater than `low`."""

    def parse(text: str) -> float:
        value = float(_number(text, float))
        if value <= low:
            raise argparse.ArgumentTypeError(f"{text}: must be greater than {low:g}")
        return value

    parse.__name__ = "number"
    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """A finite number from `low` to `high`, both included."""

    def parse(text: str) -> float:
        value = float(_number(text, float))
        if not low <= value <= high:
            bounds = f"at least {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(f"{text}: must be {bounds}")
        return value

    parse.__name__ = "number"
    return parse


# The ones most flags use.
port = int_in(1, MAX_PORT)
port_or_any = int_in(0, MAX_PORT, meaning=" (0: any free port)")
positive_int = int_in(1)
non_negative_int = int_in(0)
positive_float = float_above(0.0)
non_negative_float = float_in(0.0, math.inf)
probability = float_in(0.0, 1.0)
