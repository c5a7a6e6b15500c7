"""Argument types: a value out of range or of the wrong shape is refused by argparse
itself, before anything starts, as `uerl X: error: argument --flag: ...` with exit
status 2.

`int()` alone lets `--port 99999` wrap into another port and `--envs 0` fail from inside a
game; a name that becomes a path or a job's id (`--run-name ../x`) would be refused by
the cluster only, after a job was made; these name the flag the user typed and what it
takes.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import NoReturn
from urllib.parse import urlsplit

from training.runstore.location import RUN_NAME, RUN_NAME_LIMITS, RUN_NAME_RULE

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


def matching(pattern: re.Pattern[str], rule: str, *, kind: str) -> Callable[[str], str]:
    """A name `pattern` matches whole; `rule` says what one is, in the error and --help."""

    def parse(text: str) -> str:
        if not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{text!r}: {rule}")
        return text

    parse.__name__ = kind
    return parse


def http_url(text: str) -> str:
    """An http(s) URL with a host (and a port in range, if given): the job API's address.
    Ray's client takes anything and fails at each request, which a supervisor retries."""
    if any(c.isspace() or not c.isprintable() for c in text):
        # urlsplit keeps it in the path; Ray's client fails at each request, retried.
        raise argparse.ArgumentTypeError(f"{text!r}: a URL has no whitespace")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not an http(s) URL with a host, e.g. http://uerl-head-svc:8265"
        )
    try:
        port = parts.port  # a ValueError past 65535 or not a number
    except ValueError:
        port = 0
    if port == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the port must be from 1 to {MAX_PORT}")
    return text


http_url.__name__ = "URL"

# A Ray job's submission id: it names the job's log file and is typed in `ray job logs`.
SUBMISSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SUBMISSION_ID_LIMITS = RUN_NAME_LIMITS  # the same shape: a file name, typed in commands
SUBMISSION_ID_RULE = f"a submission id is {SUBMISSION_ID_LIMITS}"

# The ones most flags use.
port = int_in(1, MAX_PORT)
port_or_any = int_in(0, MAX_PORT, meaning=" (0: any free port)")
positive_int = int_in(1)
non_negative_int = int_in(0)
positive_float = float_above(0.0)
non_negative_float = float_in(0.0, math.inf)
probability = float_in(0.0, 1.0)
run_name = matching(RUN_NAME, RUN_NAME_RULE, kind="run name")
submission_id = matching(SUBMISSION_ID, SUBMISSION_ID_RULE, kind="submission id")


class ArgumentsRefused(ValueError):
    """What argparse would have said of another command's flags, as one line."""


def parse_for(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)` for flags passed on to another command (`uerl submit --
    train ...`): a refusal is an ArgumentsRefused with argparse's own message, for the
    caller to say in its one line, instead of that command's usage and exit."""

    def refuse(message: str) -> NoReturn:
        raise ArgumentsRefused(message)

    parser.error = refuse  # type: ignore[method-assign]
    return parser.parse_args(argv)
