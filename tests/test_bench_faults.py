"""`uerl bench-faults`: faults follow the run's progress lines, and one that never happened
is reported as such, never as a measured row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from host_speed import guard

from training.bench.game_faults import Fault, _inject, _report, follow


@pytest.fixture
def game_process() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A child of this process whose command line is a mock game's on port 45123
    (what the bench looks for in `uerl local`'s process tree)."""
    port = 45123
    script = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "mock-ue", "--port", str(port)], stdout=subprocess.PIPE
    )
    # Popen returns once exec began, before the kernel has set the new command line
    # (/proc/PID/cmdline reads empty for a moment); a line from the child means it is set.
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def _progress(iterations: int, port: int) -> list[str]:
    return [
        f"uerl local: Ray at 127.0.0.2:6379, games ue-1=127.0.0.1:{port} (up in 1.0s)\n",
        *(
            f"iter {i:4d} | env steps {i * 2000:>9,} | runners 1/1\n"
            for i in range(1, iterations + 1)
        ),
    ]


def _wait_status(process: psutil.Process, status: str, timeout_s: float = guard(30)) -> None:
    deadline = time.monotonic() + timeout_s
    while process.status() != status:
        assert time.monotonic() < deadline, f"status {process.status()}, not {status}"
        time.sleep(0.02)


def test_a_fault_whose_game_has_no_process_is_marked_not_injected() -> None:
    fault = Fault("kill", "ue-1", 1, after_iteration=3)
    _inject(fault, os.getpid(), 45999, stop_s=0.1)  # this process has no game child
    assert fault.sent_at is None and not fault.injected
    assert fault.not_injected == "no live process of ue-1 on port 45999"


def test_a_stop_fault_is_sent_after_its_iteration_to_the_games_process(
    game_process: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = game_process
    fault = Fault("stop", "ue-1", 1, after_iteration=2)
    before = time.time()
    follow(_progress(3, port), [fault], os.getpid(), stop_s=0.5)
    assert fault.sent_at is not None and fault.sent_at >= before
    assert fault.not_injected is None
    game = psutil.Process(proc.pid)
    _wait_status(game, psutil.STATUS_STOPPED)
    _wait_status(game, psutil.STATUS_SLEEPING)  # SIGCONT after stop_s
    assert fault.answered_at is not None and fault.answered_at - fault.sent_at >= 0.5


def test_a_fault_whose_iteration_never_came_is_marked_not_injected() -> None:
    fault = Fault("kill", "ue-1", 1, after_iteration=9)
    follow(_progress(4, 45999), [fault], os.getpid(), stop_s=0.1)
    assert fault.sent_at is None
    assert fault.not_injected == "the run ended at iteration 4, before 9"


def test_the_report_shows_a_fault_not_injected_as_such_and_counts_it_in_no_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "metrics.csv").write_text(
        "iteration,time_s\n1,9.0\n2,3.0\n3,3.0\n4,5.0\n5,3.0\n6,4.0\n7,3.0\n"
    )
    # Runner 1 recovered once, before the bench's faults: no fault of the bench caused it.
    events = [
        {"runner_index": 1, "kind": "recovery", "at": 50.0, "down_for_s": 1.0},
        {"runner_index": 2, "kind": "recovery", "at": 102.5, "down_for_s": 2.0},
    ]
    (tmp_path / "game_events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    missed = Fault("kill", "ue-1", 1, after_iteration=3, not_injected="no live process")
    done = Fault("kill", "ue-2", 2, after_iteration=5, sent_at=100.0, answered_at=101.0)
    assert _report([missed, done], tmp_path) == 1
    rows = capsys.readouterr().out.splitlines()
    assert rows[1] == "baseline iteration (median of unfaulted, from 2): 3.00 s"
    assert rows[3] == "1     kill     ue-1    not injected: no live process"
    assert rows[4].split() == ["2", "kill", "ue-2", "6", "4.00s", "+1.00s", "1.50s"]
    assert rows[5] == "mean extra per fault +1.00 s; mean game-answers-to-runner-samples 1.50 s"
