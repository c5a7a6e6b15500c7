"""When to restart a game that exited, as a kubelet would: backoff, cap, reset when stable.

The delay doubles from `initial_s` up to `max_delay_s` (the kubelet's
CrashLoopBackOff does the same from 10 s to 5 min; games here restart faster).
A game that stayed up for `stable_after_s` starts over at the initial delay.
Past `max_restarts` the game is given up on, and so is training.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RestartPolicy:
    max_restarts: int = 10
    initial_s: float = 0.5
    max_delay_s: float = 8.0
    stable_after_s: float = 60.0
    restarts: int = field(default=0, init=False)
    _streak: int = field(default=0, init=False)

    def next_delay(self, *, uptime_s: float) -> float | None:
        """Seconds to wait before the next start, or None once the cap is reached."""
        if self.restarts >= self.max_restarts:
            return None
        if uptime_s >= self.stable_after_s:
            self._streak = 0
        delay = min(self.initial_s * 2**self._streak, self.max_delay_s)
        self._streak += 1
        self.restarts += 1
        return delay
