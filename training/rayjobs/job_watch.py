"""A job's status polled until it ends, its head is found replaced, or the job API has
not answered for a bound: the one loop `uerl submit` and `uerl supervise` follow a job
with. What each then says and does is theirs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from training.rayjobs.job_client import TERMINAL, job_gone, status_name

# How a watch ended, beside a terminal status (TERMINAL).
GONE = "GONE"  # the job API answered it has no such job: a new head
UNANSWERED = "UNANSWERED"  # no answer for the bound
LEFT = "LEFT"  # the caller's `leave` said so


@dataclass(frozen=True)
class Watched:
    """How a watch ended: `status` is a terminal status or GONE, UNANSWERED, LEFT."""

    status: str
    error: BaseException | None = None  # GONE, UNANSWERED: the job API's last error
    # GONE: how long the API had not answered before it said so (None: it had answered);
    # UNANSWERED: how long it had not.
    unanswered_s: float | None = None
    running: str = ""  # LEFT: the job's status then


def watch(
    status_of: Callable[[], Any],
    *,
    poll_s: float,
    no_answer_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    before_poll: Callable[[], None] | None = None,
    leave: Callable[[str], bool] | None = None,
    say: Callable[[str], None] | None = None,
    finish: Callable[[], None] | None = None,
) -> Watched:
    """Polls `status_of()` every `poll_s` until the job ends. `before_poll` runs before
    each poll (a Ctrl-C sent on as a stop); `leave(status)`, on each status not
    terminal, ends the watch when True; `say` hears when the API stops and starts
    answering; `finish` runs once the status is terminal (the log read after it is
    whole), best effort: the end is returned whether or not it could."""
    unanswered_since: float | None = None
    while True:
        if before_poll is not None:
            before_poll()
        try:
            status = status_name(status_of())
        except Exception as exc:  # the port-forward, the head: retried, bounded
            if job_gone(exc):  # an answer, not its absence: waiting brings nothing
                away = None if unanswered_since is None else clock() - unanswered_since
                return Watched(GONE, exc, away)
            if unanswered_since is None:
                unanswered_since = clock()
                if say is not None:
                    say(f"the Ray head's job API does not answer: {exc}")
            elif clock() - unanswered_since > no_answer_s:
                return Watched(UNANSWERED, exc, clock() - unanswered_since)
            sleep(poll_s)
            continue
        if unanswered_since is not None:
            if say is not None:
                say(
                    f"the Ray head's job API answers again after {clock() - unanswered_since:.0f} s"
                )
            unanswered_since = None
        if status in TERMINAL:
            if finish is not None:
                with contextlib.suppress(Exception):
                    finish()
            return Watched(status)
        if leave is not None and leave(status):
            return Watched(LEFT, running=status)
        sleep(poll_s)
