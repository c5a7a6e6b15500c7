"""Running the real `uerl local` CLI as a subprocess, watching its whole process tree."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from host_speed import guard
from proc_tree import Deadline, StartedProcesses, TreeSampler
from run_events import iterations

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class LocalRun:
    returncode: int
    output: str
    run_dir: Path
    wall_s: float
    pids: set[int] = field(default_factory=set)
    peak_rss_bytes: int = 0
    args: tuple[str, ...] = ()

    @property
    def games(self) -> dict[str, dict[str, Any]]:
        return json.loads((self.run_dir / "games.json").read_text())

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


def uerl_local_argv(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "training.cli", "local", "--run-dir", str(run_dir), *args]


def wait_for_line(proc: subprocess.Popen[str], needle: str, *, timeout_s: float) -> str:
    """Read `proc`'s output until a line contains `needle`; return what was read."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"never saw {needle!r}:\n{''.join(seen)}")


def make_local_argv(run_dir: Path, *args: str) -> list[str]:
    """README's first command: `make local ARGS="..."` (the virtualenv built already)."""
    return ["make", "local", f"ARGS={' '.join([*args, '--run-dir', str(run_dir)])}"]


def start(
    started: StartedProcesses,
    run_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    through_make: bool = False,
) -> subprocess.Popen[str]:
    """`uerl local ARGS` (or `make local ARGS=...`), owned by `started` (stopped with it)."""
    argv = make_local_argv(run_dir, *args) if through_make else uerl_local_argv(run_dir, *args)
    if through_make:  # not the jobserver of a `make test` this runs under
        env = {**(os.environ if env is None else env), "MAKEFLAGS": ""}
    return started.popen(
        argv,
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def to_its_end(
    owned: StartedProcesses, proc: subprocess.Popen[str], timeout_s: float, what: str
) -> str:
    """`proc`'s output once it has ended, within `timeout_s`; past it, or whatever else
    ends this call early (pytest-timeout, Ctrl-C), everything `owned` started is stopped."""
    try:
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            owned.stop()
            output, _ = proc.communicate()
            raise AssertionError(f"{what} did not finish in {timeout_s:.0f}s:\n{output}") from None
    except BaseException:
        owned.stop()
        raise
    return output


def run_local(
    run_dir: Path,
    *args: str,
    timeout_s: float = 300,
    env: dict[str, str] | None = None,
    through_make: bool = False,
) -> LocalRun:
    """`uerl local ARGS` (`through_make`: as `make local ARGS=...`) to its end, stopped
    after `timeout_s` (give it one that ends before pytest-timeout's, see
    `proc_tree.Deadline`). Whatever else ends this call early (pytest-timeout, Ctrl-C),
    nothing it started is left running. After a normal exit nothing is stopped here:
    what the run left running is the tests' to find."""
    started = time.monotonic()
    owned = StartedProcesses()
    proc = start(owned, run_dir, *args, env=env, through_make=through_make)
    with TreeSampler(proc.pid) as sampler:
        output = to_its_end(owned, proc, timeout_s, "uerl local")
    return LocalRun(
        proc.returncode,
        output,
        run_dir,
        time.monotonic() - started,
        sampler.pids - {proc.pid},
        sampler.peak_rss_bytes,
        tuple(make_local_argv(run_dir, *args)) if through_make else args,
    )


GAMES_LINE = re.compile(r"games (.*) \(up in")
# `runners H/T`, then `, U unknown` when some runners did not report that iteration.


class LocalRunWatcher:
    """Runs `uerl local` (owned by `started`: stopped with it, however the test ends),
    keeps its output lines, finds its game processes by port. Every wait ends by
    `deadline`, before pytest-timeout's."""

    def __init__(
        self, started: StartedProcesses, deadline: Deadline, run_dir: Path, *args: str
    ) -> None:
        self.proc = start(started, run_dir, *args)
        self.deadline = deadline
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self.iteration = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if (m := GAMES_LINE.search(line)) is not None:
                for item in m.group(1).split(", "):
                    name, endpoint = item.split("=")
                    self.ports[name] = int(endpoint.rsplit(":", 1)[1])
            for event in iterations(line):
                self.iteration = int(event["iteration"])

    def game(self, name: str) -> psutil.Process:
        """The live process of game `name` now (a restart gives it a new pid)."""
        port = str(self.ports[name])
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                argv = child.cmdline()
            except psutil.Error:
                continue
            if "mock-ue" in argv and argv[argv.index("--port") + 1] == port:
                return child
        raise LookupError(f"no live process for {name} (port {port})")

    def wait_iteration(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + self.deadline.left(timeout_s)
        while self.iteration < n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never reached iteration {n}:\n" + self.output)
            time.sleep(0.1)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def finish(self, timeout_s: float) -> int:
        try:
            code = self.proc.wait(timeout=self.deadline.left(timeout_s))
        except subprocess.TimeoutExpired:
            raise AssertionError("uerl local did not finish:\n" + self.output) from None
        self._reader.join(timeout=10)
        return code


def retry_signal(watcher: LocalRunWatcher, name: str, sig: signal.Signals) -> psutil.Process:
    """Signal the game's current process (it may be between restarts for a moment)."""
    deadline = time.monotonic() + guard(60)  # a restart on a loaded host
    while True:
        try:
            process = watcher.game(name)
            process.send_signal(sig)
            return process
        except (LookupError, psutil.NoSuchProcess):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
