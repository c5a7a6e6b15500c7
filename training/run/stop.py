"""Ctrl-C / SIGTERM handling shared by `uerl train` and `uerl local`.

Before training starts a signal aborts at once (KeyboardInterrupt: the `with`
blocks stop whatever was started). Once iterations run, the first signal asks
for a clean stop (finish the iteration, write the final checkpoint), and a
second one aborts. `fail(reason)` asks for the same clean stop from code (e.g.
`uerl local` giving up on a game), and the run then ends with an error.

Python drops what a signal handler raises when the handler runs inside a fork's Python
callbacks (logging's `_releaseLock`) or a `__del__`: it prints "Exception ignored" and
goes on (and, raised before `_releaseLock` released it, leaves logging's lock held: other
threads then block on it for ever, as `ray.init`'s did). So a fork is made with the signals
held (`signals_held`), and a signal whose abort was dropped anyway still aborts at the next
step (`abort_if_signalled`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait, blocked in this thread, until the block ends, and
    then arrive (a handler's abort raised from the `with`). Around a fork and what records
    its child: the abort then never runs inside the fork's callbacks, and what was started
    is recorded before it unwinds. A child forked inside must `release_signals()`."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def release_signals() -> None:
    """In a child between fork and exec: unblock what `signals_held` blocked (the mask
    survives exec; a child with SIGTERM blocked would never stop on it)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


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

    def abort_if_signalled(self) -> None:
        """Abort now (KeyboardInterrupt) if a signal came while aborting was the answer:
        its handler's raise may have been dropped (see the module's docstring)."""
        if self.requested and self.failure is None and not self.graceful:
            raise KeyboardInterrupt(self.signal_name)

    def begin_graceful(self) -> None:
        """Training starts: from now on a first signal asks for a clean stop."""
        self.abort_if_signalled()
        self.graceful = True

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
