"""Sampling a process tree while it runs: every pid it ever had, and its peak memory.
Stopping everything a test started, found by a tag in the processes' environment."""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

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


def survivors(pids: set[int], *, wait_s: float = 30.0) -> set[int]:
    """Pids still running (not zombies) after up to `wait_s` (generous: a loaded host's
    Ray processes take seconds to exit; nothing left ends it at once)."""
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


# ----------------------------------------------------- what the tests start, stopped

# Every process the suite starts carries this session's tag in its environment (set on
# pytest's own environment, so inherited by everything started from it, Ray's workers
# and jobs included); each process a test starts through `StartedProcesses` also carries
# its own tag. Found by tag, a process tree is complete: also the descendants that were
# re-parented to init after their parent died. Never a match on names.
TEST_SESSION_ENV = "UERL_TEST_SESSION"
TEST_PROCESS_ENV = "UERL_TEST_PROCESS"
# SIGTERM, then this long to exit (a `uerl local` run checkpoints and stops its nodes).
STOP_GRACE_S = 60.0
# A test's own waits end this long before pytest-timeout fires: room to stop what it started.
STOP_MARGIN_S = STOP_GRACE_S + 30.0


def new_tag() -> str:
    return f"{os.getpid()}-{secrets.token_hex(6)}"


def carrying(name: str, value: str) -> list[psutil.Process]:
    """Live processes (zombies count as gone) whose environment holds `name=value`."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(name) == value:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def describe(proc: psutil.Process) -> str:
    try:
        argv = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        argv = "?"
    return f"pid {proc.pid}: {argv[:160]}"


def kill_all(procs: list[psutil.Process], *, wait_s: float = 10.0) -> list[psutil.Process]:
    """SIGKILL each (by pid); the ones still running after `wait_s`."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _, still = psutil.wait_procs(procs, timeout=wait_s)
    return [p for p in still if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


class StartedProcesses:
    """The processes a test (or a fixture) starts, all stopped by `stop()`: SIGTERM to each
    one started, up to `grace_s` for them to exit, then SIGKILL to every process carrying
    one of their tags. A context manager, and the `started` fixtures' object."""

    def __init__(self, *, grace_s: float = STOP_GRACE_S) -> None:
        self.grace_s = grace_s
        self._started: list[tuple[subprocess.Popen[Any], str]] = []

    def popen(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        tag = new_tag()
        tagged = {**(os.environ if env is None else env), TEST_PROCESS_ENV: tag}
        proc: subprocess.Popen[Any] = subprocess.Popen(list(argv), env=tagged, **kwargs)
        self._started.append((proc, tag))
        return proc

    def leftovers(self) -> list[psutil.Process]:
        """Processes of these trees still running."""
        return [p for _, tag in self._started for p in carrying(TEST_PROCESS_ENV, tag)]

    def stop(self) -> list[str]:
        """Stop them all; what survived SIGKILL (nothing, normally)."""
        for proc, _ in self._started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for proc, _ in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        survivors = kill_all(self.leftovers())
        for proc, _ in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._started.clear()
        return [describe(p) for p in survivors]

    def __enter__(self) -> StartedProcesses:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        survivors = self.stop()
        if survivors and exc is None:
            raise RuntimeError("processes survived SIGKILL:\n  " + "\n  ".join(survivors))


class Deadline:
    """When a test's own waits must give up: before pytest-timeout fails the test, with
    `STOP_MARGIN_S` left to stop what it started."""

    def __init__(self, timeout_s: float | None) -> None:
        self.at = math.inf if not timeout_s else time.monotonic() + timeout_s - STOP_MARGIN_S

    @staticmethod
    def configured(config: Any) -> float:
        """pytest-timeout's limit where no mark sets one: `--timeout`, else PYTEST_TIMEOUT,
        else the ini file's `timeout` (its own order)."""
        for value in (
            config.getoption("timeout", None),
            os.environ.get("PYTEST_TIMEOUT"),
            config.getini("timeout"),
        ):
            if value not in (None, ""):
                return float(value)
        return 0.0

    @classmethod
    def for_item(cls, node: Any, config: Any) -> Deadline:
        marker = node.get_closest_marker("timeout")
        if marker is not None and marker.args:
            return cls(float(marker.args[0]))
        return cls(cls.configured(config))

    def left(self, at_most: float = math.inf) -> float:
        """Seconds left (at most `at_most`); AssertionError once none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise AssertionError("out of time: pytest-timeout would fire before this wait ends")
        return min(left, at_most)
