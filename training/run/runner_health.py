"""The driver's view of its env runners' games: progress counts, event lines, giving up.

After each iteration the driver asks every env runner for its `GameHealth`
report (a short, bounded call; a runner still busy keeps its last report) and
feeds them here. The board turns events into one plain line each, counts
healthy runners for the progress line and says when to give up: every game
down for longer than the limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RunnerHealthBoard:
    def __init__(self, total: int, *, give_up_after_s: float) -> None:
        self.total = total
        self.give_up_after_s = give_up_after_s
        # Latest report per runner index; a runner not heard from yet counts as healthy
        # (it was built, so its game answered then).
        self.latest: dict[int, dict[str, Any]] = {}

    def update(self, reports: Iterable[dict[str, Any]]) -> list[str]:
        """Take fresh reports; return one line per fault or recovery they carry."""
        lines: list[str] = []
        for report in reports:
            index = int(report["runner_index"])
            self.latest[index] = report
            game = f"game of env runner {index} ({report['endpoint']})"
            for event in report.get("events", []):
                if event["kind"] == "fault":
                    lines.append(
                        f"{game} failed: {event['message']}; the other runners go on, "
                        "this one reconnects when the game answers"
                    )
                else:
                    lines.append(
                        f"{game} is back after {event['down_for_s']:.1f} s: sampling again"
                    )
        return lines

    @property
    def healthy(self) -> int:
        down = sum(1 for r in self.latest.values() if not r["healthy"])
        return self.total - down

    def down_games(self) -> list[str]:
        return [
            f"runner {i} ({r['endpoint']}): down {r['down_for_s']:.0f} s, last error: "
            f"{r['last_error']}"
            for i, r in sorted(self.latest.items())
            if not r["healthy"]
        ]

    def give_up_reason(self) -> str | None:
        """Why training should stop now, or None: no game answered for too long."""
        if self.total == 0 or len(self.latest) < self.total:
            return None
        reports = list(self.latest.values())
        if any(r["healthy"] for r in reports):
            return None
        shortest = min(r["down_for_s"] for r in reports)
        if shortest < self.give_up_after_s:
            return None
        return (
            f"no game has answered for {shortest:.0f} s (limit {self.give_up_after_s:g} s, "
            "--game-down-limit):\n  " + "\n  ".join(self.down_games())
        )
