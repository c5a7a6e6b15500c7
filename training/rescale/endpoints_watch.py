"""The endpoints file re-read between iterations, keeping the last good object.

On the Ray head the file is a mounted ConfigMap: the kubelet swaps it in place
(a symlink flip), so it is opened anew every time, never cached by handle or mtime.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from infra.endpoints import Endpoints, EndpointsError

# What a running training can follow; any other change applies at the next start.
LIVE_FIELDS = frozenset({"num_env_runners"})


class EndpointsWatch:
    def __init__(self, path: Path, current: Endpoints) -> None:
        self.path = path
        self.current = current
        self._last_text: str | None = None
        self._last_problem: str | None = None
        with contextlib.suppress(OSError):  # unreadable now: reported by poll()
            self._last_text = path.read_text()

    def poll(self) -> tuple[Endpoints | None, list[str]]:
        """(the new endpoints if the file changed to a valid object, lines to print).

        An unreadable or invalid file is reported once per distinct problem and the
        last good endpoints stay in force."""
        try:
            text = self.path.read_text()
        except OSError as exc:
            return None, self._problem(f"cannot read {self.path}: {exc.strerror}")
        if text == self._last_text:
            return None, []
        try:
            endpoints = Endpoints.from_json(text, source=str(self.path))
        except EndpointsError as exc:
            return None, self._problem(str(exc))
        self._last_text = text
        self._last_problem = None
        if endpoints == self.current:
            return None, []
        lines = []
        others = sorted(
            name
            for name in Endpoints.model_fields
            if name not in LIVE_FIELDS and getattr(endpoints, name) != getattr(self.current, name)
        )
        if others:
            lines.append(
                f"endpoints: {', '.join(others)} changed in {self.path}; a running training "
                "follows only the number of games (num_env_runners): the rest applies when "
                "training starts again"
            )
        previous = self.current
        self.current = previous.model_copy(update={"num_env_runners": endpoints.num_env_runners})
        return (self.current if self.current != previous else None), lines

    def _problem(self, message: str) -> list[str]:
        if message == self._last_problem:
            return []
        self._last_problem = message
        return [
            f"endpoints: {message}; keeping the last good one "
            f"({self.current.num_env_runners} game(s))"
        ]
