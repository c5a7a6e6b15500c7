"""Ctrl-C / SIGTERM handling shared by `uerl train` and `uerl local`.

Before training starts a signal aborts at once (KeyboardInterrupt: the `with`
blocks stop whatever was started). Once iterations run, the first signal asks
for a clean stop (finish the iteration, write the final checkpoint), and a
second one aborts. `fail(reason)` asks for the same clean stop from code (e.g.
`uerl local` giving up on a game), and the run then ends with an error.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequest:
    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self.graceful = False
        self.failure: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        # Signal handlers can only be set from the main thread (e.g. not under
        # some test runners' worker threads); elsewhere the defaults stay.
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def fail(self, reason: str) -> None:
        """Stop after this iteration (final checkpoint) and end the run as failed.
        Safe from any thread; the first reason wins."""
        if self.failure is None:
            self.failure = reason
        self.requested = True

    def reinstall(self) -> None:
        """Take the signals back after `ray.init`, whose core worker installs a C++
        SIGTERM handler that aborts the process without cleanup."""
        if self._previous:
            for sig in SIGNALS:
                signal.signal(sig, self._handle)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.graceful and not self.requested:
            self.requested = True
            self.signal_name = name
            print(
                f"\n{name}: stopping after this iteration and writing a final checkpoint "
                "(again to abort)",
                file=sys.stderr,
                flush=True,
            )
            return
        self.requested = True
        self.signal_name = name
        raise KeyboardInterrupt(name)
