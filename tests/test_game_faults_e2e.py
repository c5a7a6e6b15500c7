"""Games die, hang and come back while `uerl local` trains: training goes on, or stops clearly.

Faults are real signals to the real mock game processes `uerl local` started
(SIGKILL; SIGSTOP then SIGCONT), found through the CLI's own process tree.
"""

from __future__ import annotations

import json
import random
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
import run_events
from host_speed import guard
from local_runs import LocalRunWatcher, retry_signal
from proc_tree import Deadline, StartedProcesses, TreeSampler

from training.local import processes

FAULT_LINE = re.compile(r"game of env runner (\d+) \(.*\) failed")
BACK_LINE = re.compile(r"game of env runner (\d+) \(.*\) is back")
# Iterations of 500 env steps where a test only needs the run to be going: training's
# defaults (2,000 per iteration) would only make it wait longer for the same iteration.
SMALL_BATCH = ("--train-batch-size", "500", "--minibatch-size", "100")


def _mtime(path: Path) -> float:
    return path.stat().st_mtime


# Half of training's default batch: the five SIGSTOPs (about 23 s in all) must still end
# well before iteration 22 while the other runners keep iterating.
TEN_FAULTS_BATCH = ("--train-batch-size", "1000")


# Hang guards: a 24-iteration run with ten faults; a loaded host (beside a Go build and the
# Kubernetes tier) runs it up to 5x slower than idle. (Its checkpoints resuming: proven once,
# by tests/test_rescale_e2e.py.)
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_training_survives_ten_random_game_faults_with_every_runner_back(
    tmp_path: Path, started: StartedProcesses, deadline: Deadline
) -> None:
    # The faults are due after iterations 2..14 (rng 7), but this thread waits out each
    # SIGSTOP (about 23 s in all), so on a fast host the last ends some iterations after 14.
    # The rest shows every runner back.
    iterations = 24
    run = LocalRunWatcher(
        started,
        deadline,
        tmp_path,
        "--workers", "3", "--iterations", str(iterations), "--checkpoint-every", "5",
        "--request-timeout", "2", "--seed", "0", *TEN_FAULTS_BATCH,
    )  # fmt: skip
    rng = random.Random(7)
    # Faults follow the run's progress lines, one or two iterations apart from iteration
    # 2 on: the last is due after iteration 20 at the latest, whatever the machine's pace.
    due = [2]
    for _ in range(9):
        due.append(due[-1] + rng.randint(1, 2))
    faults: list[tuple[str, str]] = []
    with TreeSampler(run.proc.pid) as sampler:
        for k, after_iteration in enumerate(due):
            run.wait_iteration(after_iteration, timeout_s=guard(600))
            name = f"ue-{rng.randint(1, 3)}"
            if k % 2 == 0:
                retry_signal(run, name, signal.SIGKILL)
                faults.append((name, "SIGKILL"))
            else:
                stopped = retry_signal(run, name, signal.SIGSTOP)
                time.sleep(rng.uniform(3.0, 6.0))  # longer than the 2 s RPC deadline
                stopped.send_signal(signal.SIGCONT)
                faults.append((name, "SIGSTOP+SIGCONT"))
        print(f"the faults ended after iteration {run.iteration} of {iterations}")
        assert run.iteration < iterations - 2, "faults must end before the run does"
        code = run.finish(timeout_s=guard(1200))
    output = run.output
    assert code == 0, output
    # Every fault the runners saw was followed by a recovery of that runner.
    last_event: dict[str, str] = {}
    for line in run.lines:
        if (m := FAULT_LINE.search(line)) is not None:
            last_event[m.group(1)] = "fault"
        elif (m := BACK_LINE.search(line)) is not None:
            last_event[m.group(1)] = "back"
    assert len(re.findall(FAULT_LINE, output)) >= 5, (faults, output)
    assert set(last_event.values()) == {"back"}, (last_event, output)
    # One plain line per game restart; no Ray traceback on the console.
    kills = sum(1 for _, how in faults if how == "SIGKILL")
    assert output.count("killed by SIGKILL; restart") == kills, output
    assert "Traceback" not in output
    # The last iteration ran with every runner's game answering, and every game served
    # steps after its last restart (the stats of its newest process).
    final = run_events.iterations(output)[-1]
    assert (final["iteration"], final["runners"], final["unknown"]) == (iterations, [3, 3], 0), (
        output
    )
    for name in ("ue-1", "ue-2", "ue-3"):
        stats = sorted((tmp_path / "games").glob(f"{name}*.stats.json"), key=_mtime)
        assert json.loads(stats[-1].read_text())["steps"] > 0, (name, stats)
    assert processes.alive(sampler.pids - {run.proc.pid}) == set()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_game_past_its_restart_cap_stops_training_with_a_final_checkpoint(
    tmp_path: Path, started: StartedProcesses, deadline: Deadline
) -> None:
    run = LocalRunWatcher(
        started, deadline, tmp_path, "--workers", "2", "--iterations", "50", "--game-restarts", "0",
        *SMALL_BATCH,
    )  # fmt: skip
    with TreeSampler(run.proc.pid) as sampler:
        run.wait_iteration(2, timeout_s=guard(600))
        retry_signal(run, "ue-1", signal.SIGKILL)
        code = run.finish(timeout_s=guard(600))
    output = run.output
    assert code == 1, output
    assert "giving up: game ue-1" in output and "cap 0" in output
    assert "uerl local: gave up: game ue-1" in output
    last = run_events.iterations(output)[-1]["iteration"]
    assert (tmp_path / "checkpoints" / f"checkpoint_{last:06d}").is_dir(), output
    assert processes.alive(sampler.pids - {run.proc.pid}) == set()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_no_game_answering_for_the_limit_stops_training_naming_every_game(
    tmp_path: Path, started: StartedProcesses, deadline: Deadline
) -> None:
    run = LocalRunWatcher(
        started,
        deadline,
        tmp_path,
        "--workers", "2", "--iterations", "50", "--game-down-limit", "6",
        "--request-timeout", "2", "--sample-timeout", "10", *SMALL_BATCH,
    )  # fmt: skip
    stopped: list[psutil.Process] = []
    try:
        with TreeSampler(run.proc.pid) as sampler:
            run.wait_iteration(2, timeout_s=guard(600))
            stopped = [retry_signal(run, n, signal.SIGSTOP) for n in ("ue-1", "ue-2")]
            started = time.monotonic()
            code = run.finish(timeout_s=guard(600))
            gave_up_after = time.monotonic() - started
    finally:
        for process in stopped:
            if process.is_running():
                process.send_signal(signal.SIGCONT)
    output = run.output
    assert code == 1, output
    assert "gave up: no game has answered for" in output
    assert f"127.0.0.1:{run.ports['ue-1']}" in output and f"127.0.0.1:{run.ports['ue-2']}" in output
    # The driver decides on the games' own down time: past the limit, and within about one
    # iteration's sample timeout of it (two, for a report that lands just before the limit).
    reported = re.search(r"no game has answered for (\d+) s", output)
    assert reported is not None and 6 <= int(reported.group(1)) < 6 + 2 * 10, output
    # Then the final checkpoint and Ray's shutdown, at the machine's pace: CI's run beside the
    # Kubernetes tier took 46 s in all, so this bound (over 6x that) only tells a stop from a
    # hang.
    assert gave_up_after < guard(300), gave_up_after
    assert (tmp_path / "checkpoints" / "latest").exists()
    assert processes.alive(sampler.pids - {run.proc.pid}) == set()
