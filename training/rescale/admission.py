"""New games waiting to join a running training: retried with backoff, given up on in time.

A game named by the endpoints may not answer yet (its pod is starting, its Ray node
has not joined). Each slot is tried when due; failures back off (1, 2, 4 ... 10 s),
and a slot that has not answered within the preflight timeout is given up on until
the endpoints change again (or, see `Rescaler`, the cluster's worker nodes do). A game
that answers with other spaces is refused at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from training.rescale.plan import game_name

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 10.0


@dataclass
class Candidate:
    slot: int
    first_seen: float
    next_try: float
    attempts: int = 0
    last_error: str = ""


class Admission:
    def __init__(self, give_up_after_s: float, *, clock: Callable[[], float] = time.monotonic):
        self.give_up_after_s = give_up_after_s
        self.clock = clock
        self.waiting: dict[int, Candidate] = {}
        self.given_up: set[int] = set()

    def want(self, slots: Iterable[int]) -> None:
        """The slots that need a runner now; others stop waiting."""
        wanted = set(slots)
        now = self.clock()
        self.waiting = {s: c for s, c in self.waiting.items() if s in wanted}
        for slot in wanted - set(self.waiting) - self.given_up:
            self.waiting[slot] = Candidate(slot, first_seen=now, next_try=now)

    def endpoints_changed(self) -> None:
        """A new endpoints object: games given up on get another chance."""
        self.given_up.clear()

    def due(self) -> list[int]:
        now = self.clock()
        return sorted(s for s, c in self.waiting.items() if c.next_try <= now)

    def failed(self, slot: int, error: str, *, refuse: bool = False) -> str | None:
        """Record a failed try; a line on the first one and when the slot is given up on
        (or refused)."""
        candidate = self.waiting[slot]
        now = self.clock()
        candidate.attempts += 1
        candidate.last_error = error
        waited = now - candidate.first_seen
        if refuse or waited >= self.give_up_after_s:
            del self.waiting[slot]
            self.given_up.add(slot)
            if refuse:
                return f"rescale: {game_name(slot)} refused: {error}; the run goes on without it"
            return (
                f"rescale: gave up on {game_name(slot)} after {waited:.0f} s and "
                f"{candidate.attempts} tries (preflight timeout {self.give_up_after_s:g} s): "
                f"{error}; the run goes on without it"
            )
        delay = min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** (candidate.attempts - 1))
        candidate.next_try = now + delay
        if candidate.attempts == 1:
            return (
                f"rescale: waiting for {game_name(slot)}: {error}; trying again for up to "
                f"{self.give_up_after_s:g} s"
            )
        return None

    def starting(self, slot: int) -> None:
        """Its runner is being built: not due again unless that fails (`failed`)."""
        self.waiting[slot].next_try = float("inf")

    def admitted(self, slot: int) -> None:
        self.waiting.pop(slot, None)

    def waiting_for_s(self, slot: int) -> float:
        return self.clock() - self.waiting[slot].first_seen
