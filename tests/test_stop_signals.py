"""A Ctrl-C or SIGTERM is never lost while `uerl local` starts things.

Before training a signal aborts by raising from its handler, and Python drops what a
handler raises inside a fork's Python callbacks (logging's `_releaseLock` after every
`preexec_fn` fork). CI saw "Exception ignored in: <function _releaseLock>" and then a
`uerl local` silent for 18 minutes after its SIGTERM: the abort, raised before the release,
had left logging's module lock held by the main thread, and `ray.init`'s threads waited on
it for ever. The signals are held while a child is forked and recorded (no handler runs
inside the fork), and an abort dropped anyway still aborts before training starts.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from host_speed import guard

from training.run.stop import StopRequest

# A SIGTERM sent from the parent's after-fork callback: the worst moment, inside the fork.
SIGNAL_INSIDE_THE_FORK = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from training.local import processes
    from training.run.stop import StopRequest, signals_held

    fired = []
    def sigterm_once():
        if not fired:
            fired.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
    os.register_at_fork(after_in_parent=sigterm_once)

    started = []
    try:
        with StopRequest():
            with signals_held():
                started.append(processes.spawn(["sleep", "60"], log_path=Path(sys.argv[1])))
            print("went on", flush=True)
    except KeyboardInterrupt:
        print(f"aborted with {len(started)} recorded", flush=True)
    finally:
        print(f"left running: {sorted(processes.terminate(started, grace_s=5))}", flush=True)
    """
)


def test_a_sigterm_inside_a_fork_aborts_once_the_child_is_recorded(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SIGNAL_INSIDE_THE_FORK, str(tmp_path / "child.log")],
        capture_output=True,
        text=True,
        timeout=guard(30),
    )
    assert "Exception ignored" not in out.stderr, out.stderr
    assert out.stdout.splitlines() == ["aborted with 1 recorded", "left running: []"], out


def test_a_spawned_child_starts_with_no_signal_blocked(tmp_path: Path) -> None:
    from training.local import processes

    proc = processes.spawn(["sleep", "60"], log_path=tmp_path / "child.log")
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        blocked = int(next(line for line in status.splitlines() if line.startswith("SigBlk:"))
                      .split()[1], 16)  # fmt: skip
        assert blocked & (1 << (signal.SIGTERM - 1)) == 0
        assert blocked & (1 << (signal.SIGINT - 1)) == 0
    finally:
        assert processes.terminate([proc], grace_s=5) == set()


def test_a_signal_whose_abort_was_dropped_aborts_when_training_would_start() -> None:
    stop = StopRequest()
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGTERM, None)  # where Python would print and drop it
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        stop.begin_graceful()
    assert not stop.graceful


def test_a_game_given_up_before_training_ends_the_run_as_failed_not_aborted() -> None:
    stop = StopRequest()
    stop.fail("game ue-1 gave up")
    stop.begin_graceful()  # no abort: the loop sees the failure and ends the run with it
    assert stop.graceful and stop.requested and stop.failure == "game ue-1 gave up"
