"""Sampling a process tree while it runs: every pid it ever had, and its peak memory."""

from __future__ import annotations

import threading
import time
from types import TracebackType

import psutil


class TreeSampler:
    """Polls `pid` and its descendants every `interval_s` in a background thread."""

    def __init__(self, pid: int, *, interval_s: float = 0.25) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.pids: set[int] = set()
        self.peak_rss_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                procs = []
            rss = 0
            for proc in procs:
                self.pids.add(proc.pid)
                try:
                    rss += proc.memory_info().rss
                except psutil.Error:
                    continue
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            time.sleep(self.interval_s)


def survivors(pids: set[int], *, wait_s: float = 10.0) -> set[int]:
    """Pids still running (not zombies) after up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
            except psutil.NoSuchProcess:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)
