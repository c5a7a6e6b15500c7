"""The driver's view of its env runners' games: progress counts, event lines, giving up.

After each iteration the driver asks every env runner for its `GameHealth`
report (a short, bounded call) and feeds them here. The board turns events into
one plain line each, counts runners for the progress line and says when to give
up: a runner that refused its game (its episodes cannot be trained as the run asks), or
every game down for longer than the limit.

A runner is healthy only if it answered this round and its game answered. One
that did not answer this round (busy, dead, restarting) or never answered at all
is unknown, counted apart: its last report says nothing about its game now.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RunnerHealthBoard:
    def __init__(self, total: int, *, give_up_after_s: float) -> None:
        self.total = total
        self.give_up_after_s = give_up_after_s
        # Latest report per runner index (possibly from an earlier round).
        self.latest: dict[int, dict[str, Any]] = {}
        # Runners that answered the latest round.
        self.fresh: set[int] = set()

    def update(self, reports: Iterable[dict[str, Any]]) -> list[str]:
        """Take this round's reports; return one line per fault or recovery they carry.
        Runners missing from `reports` become unknown until they answer again."""
        lines: list[str] = []
        self.fresh = set()
        for report in reports:
            index = int(report["runner_index"])
            self.latest[index] = report
            self.fresh.add(index)
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

    def follow(self, runner_indices: list[int]) -> None:
        """The run's runners after a rescale: counts follow them; reports of runners
        that left are forgotten."""
        keep = set(runner_indices)
        self.total = len(keep)
        self.latest = {i: r for i, r in self.latest.items() if i in keep}
        self.fresh &= keep

    @property
    def healthy(self) -> int:
        """Runners that answered this round with their game answering."""
        return sum(1 for i in self.fresh if self.latest[i]["healthy"])

    @property
    def unknown(self) -> int:
        """Runners that did not answer this round (or never did)."""
        return self.total - len(self.fresh)

    def fresh_reports(self) -> dict[int, dict[str, Any]]:
        return {i: self.latest[i] for i in sorted(self.fresh)}

    def down_games(self) -> list[str]:
        return [
            f"runner {i} ({r['endpoint']}): down {r['down_for_s']:.0f} s, last error: "
            f"{r['last_error']}"
            for i, r in sorted(self.latest.items())
            if not r["healthy"]
        ]

    def give_up_reason(self) -> str | None:
        """Why training should stop now, or None: a runner refused its game (at once), or
        no game answered for too long."""
        for index, report in sorted(self.latest.items()):
            if report.get("refused"):
                return f"env runner {index} ({report['endpoint']}): {report['refused']}"
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
