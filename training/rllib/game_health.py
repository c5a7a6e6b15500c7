"""What one env runner knows about its game: up or down since when, and what happened.

The env runner owns one `GameHealth`. It records a fault when a call to the game
fails and a recovery when a new session works again; the driver drains the
events after each iteration (`report()`) to print one line per failure and
recovery, and reads `down_for_s` to decide when to give up. Plain data only:
it crosses process boundaries as a dict.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

EventKind = Literal["fault", "recovery"]


@dataclass(frozen=True)
class HealthEvent:
    kind: EventKind
    at: float  # wall clock (time.time()): events come from several processes
    message: str
    down_for_s: float = 0.0  # recovery only: how long the game was unusable


@dataclass
class GameHealth:
    runner_index: int
    endpoint: str
    slot: int = 0  # the game slot (1..Y) the runner serves; its index unless rescaled
    down_since: float | None = None
    faults: int = 0
    last_error: str = ""
    # Wall time of the first sampled step after the latest recovery (benchmarks read it).
    last_recovery_at: float | None = None
    # Wall time this runner's first sample returned (a rescale's figures read it).
    first_sample_at: float | None = None
    events: list[HealthEvent] = field(default_factory=list)
    # Why this run cannot train on this game at all (one line); the driver stops the run.
    refused: str = ""

    @property
    def healthy(self) -> bool:
        return self.down_since is None

    def fault(self, message: str, *, now: float | None = None) -> None:
        """The game failed a call. Only the first fault of an outage is an event."""
        now = time.time() if now is None else now
        self.last_error = message
        if self.down_since is None:
            self.down_since = now
            self.faults += 1
            self.events.append(HealthEvent("fault", now, message))

    def recovered(self, *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self.down_since is None:
            return
        down = now - self.down_since
        self.down_since = None
        self.last_recovery_at = now
        self.events.append(HealthEvent("recovery", now, "sampling again", down_for_s=down))

    def refuse(self, message: str) -> None:
        """The game cannot be trained as this run asks (not a fault: waiting cannot fix
        it). The first reason is kept."""
        self.refused = self.refused or message

    def down_for_s(self, *, now: float | None = None) -> float:
        if self.down_since is None:
            return 0.0
        return (time.time() if now is None else now) - self.down_since

    def report(self) -> dict[str, Any]:
        """A snapshot for the driver; hands over (and forgets) the events so far."""
        out = {
            "runner_index": self.runner_index,
            "endpoint": self.endpoint,
            "slot": self.slot,
            "healthy": self.healthy,
            "down_for_s": self.down_for_s(),
            "faults": self.faults,
            "last_error": self.last_error,
            "refused": self.refused,
            "last_recovery_at": self.last_recovery_at,
            "first_sample_at": self.first_sample_at,
            "events": [asdict(e) for e in self.events],
        }
        self.events = []
        return out
