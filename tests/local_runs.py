"""Running the real `uerl local` CLI as a subprocess, watching its whole process tree."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proc_tree import StartedProcesses, TreeSampler

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# pytest-timeout's limit of each test using conftest's `readme_local_run` (a session
# fixture, so without a `deadline` of its own): its run (`make local`, three iterations:
# about a minute idle, up to 5x that on a loaded host) ends before, with room to stop.
README_RUN_TIMEOUT_S = 1200


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


def start(
    started: StartedProcesses, run_dir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`uerl local ARGS`, owned by `started` (stopped with it)."""
    return started.popen(
        uerl_local_argv(run_dir, *args),
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_local(
    run_dir: Path, *args: str, timeout_s: float = 300, env: dict[str, str] | None = None
) -> LocalRun:
    """`uerl local ARGS` to its end, stopped after `timeout_s` (give it one that ends before
    pytest-timeout's, see `proc_tree.Deadline`). Whatever else ends this call early
    (pytest-timeout, Ctrl-C), nothing it started is left running. After a normal exit
    nothing is stopped here: what the run left running is the tests' to find."""
    started = time.monotonic()
    owned = StartedProcesses()
    proc = start(owned, run_dir, *args, env=env)
    try:
        with TreeSampler(proc.pid) as sampler:
            try:
                output, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                owned.stop()
                output, _ = proc.communicate()
                raise AssertionError(
                    f"uerl local did not finish in {timeout_s:.0f}s:\n{output}"
                ) from None
    except BaseException:
        owned.stop()
        raise
    return LocalRun(
        proc.returncode,
        output,
        run_dir,
        time.monotonic() - started,
        sampler.pids - {proc.pid},
        sampler.peak_rss_bytes,
        args,
    )
