"""A run's events as the tests read them from its log: the `uerl-event: {...}` lines
(training.runstore.events documents them). Read here on their own, not through the
product's reader, so that a fault in that reader cannot pass unseen."""

from __future__ import annotations

import json
from typing import Any

PREFIX = "uerl-event: "


def event_lines(text: str, kind: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(line, event) of each event of `kind` (any: None) in `text`, in order; a line may
    carry a prefix before the event (the supervisor's `uerl supervise: `)."""
    found = []
    for line in text.splitlines():
        start = line.find(PREFIX)
        if start < 0:
            continue
        try:
            event = json.loads(line[start + len(PREFIX) :])
        except ValueError:  # a line cut by a log read mid-write
            continue
        if isinstance(event, dict) and (kind is None or event.get("event") == kind):
            found.append((line, event))
    return found


def events(text: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The events of `kind` (any: None) in `text`, in order."""
    return [event for _, event in event_lines(text, kind)]


def iterations(text: str) -> list[dict[str, Any]]:
    """The `iteration` events: {iteration, env_steps, steps_per_s, return_mean (None
    before an episode ended), time_s, runners ([healthy, total] or None), unknown}."""
    return events(text, "iteration")
