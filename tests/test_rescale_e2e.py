"""Live rescale end to end: games and env runners join and leave a PPO run while it trains.

`uerl local` trains while `uerl local scale` takes it 2 -> 4 -> 1 -> 0 -> 3, then is
stopped by Ctrl-C two iterations after the last change (its final checkpoint); that
checkpoint resumes with 3 runners, continuing the run (this module is where `--resume` is
proven on a PPO run). The cluster case runs `uerl train --endpoints FILE` against `uerl
local serve`: the file is what the ConfigMap is on the Ray head, re-read between
iterations, bad versions of it included. Games that join are proven by the rescaled run:
`uerl local`'s driver follows its run directory's endpoints.json with the same watch
(`EndpointsWatch`) as `uerl train --endpoints`.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import run_events
from host_speed import guard
from local_runs import PROJECT_ROOT, LocalRun, run_local, start
from proc_tree import Deadline, StartedProcesses, TreeSampler, survivors

# A hang guard for each module fixture's set-up (a run rescaled four times; a served
# cluster and a driver following its endpoints: minutes idle, up to 5x that beside the Go
# build and the Kubernetes tier) with the first test, as for each test. Each wait below has
# its own generous cap and the fixtures' waits end before it (`module_deadline`).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# A ceiling the run does not reach: it must outlast the four changes (scaling takes
# wall-clock time, so an idle machine's fast iterations use more of them: an idle CI
# rehearsal needed about 45 before the last change at 1,000 steps an iteration, about 1 s,
# and an iteration of 500 takes about half that). The test stops it by Ctrl-C once the
# last change has run two iterations: nothing after that is asserted.
ITERATIONS = 200
# Small iterations: every assertion on their size is relative to BATCH.
BATCH = 500
FAST = ["--train-batch-size", str(BATCH), "--minibatch-size", "100", "--num-epochs", "1"]
MAX_RUNNERS = 4  # the most the run has: 2 -> 4 -> 1 -> 0 -> 3


def _iterations(text: str) -> list[tuple[int, int, int]]:
    """(iteration, healthy, total) of each `iteration` event with runners in `text`."""
    return [
        (int(e["iteration"]), int(e["runners"][0]), int(e["runners"][1]))
        for e in run_events.iterations(text)
        if e.get("runners")
    ]


@dataclass
class Console:
    """A process's output, read as it comes (lines kept in order)."""

    proc: subprocess.Popen[str]
    deadline: Deadline | None = None
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: str, *, after: int = 0, timeout_s: float = guard(600)) -> int:
        """Index of the first line from `after` on that matches `pattern`, within
        `timeout_s` and the module's deadline (when given)."""
        if self.deadline is not None:
            timeout_s = self.deadline.left(timeout_s)
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for i in range(after, len(self.lines)):
                    if re.search(pattern, self.lines[i]):
                        return i
                if self.proc.poll() is not None and not self._reading():
                    break
                if not self._changed.wait(timeout=max(0.0, deadline - time.monotonic())):
                    break
        raise AssertionError(f"never saw {pattern!r}:\n" + "\n".join(self.lines))

    def wait_iterations(self, count: int, *, after: int) -> int:
        """Index of the `count`-th progress line after line `after` (the driver has read the
        endpoints again by then: it does so before every iteration)."""
        at = after
        for _ in range(count):
            at = self.wait_for(r"^iter ", after=at + 1)
        return at

    def _reading(self) -> bool:
        return self.proc.stdout is not None and not self.proc.stdout.closed

    def iterations_after(self, index: int) -> list[tuple[int, int, int]]:
        """(iteration, healthy, total) of the `iteration` events after line `index`."""
        return _iterations("\n".join(self.lines[index + 1 :]))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def scale(run_dir: Path, workers: int) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "local", "scale", str(workers),
         "--run-dir", str(run_dir), "--timeout", f"{guard(600):.0f}"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=guard(660),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@dataclass
class RescaledRun:
    returncode: int
    console: Console
    run_dir: Path
    pids: set[int]
    # Index of each change's "rescale: A -> B" line, and B.
    changes: list[tuple[int, int]]
    # metrics.csv as the run left it (the resume below adds to it).
    rows: list[dict[str, str]]

    @property
    def events(self) -> list[dict]:
        path = self.run_dir / "game_events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def rescaled(tmp_path_factory: pytest.TempPathFactory, module_deadline: Deadline) -> RescaledRun:
    run_dir = tmp_path_factory.mktemp("rescale")
    owned = StartedProcesses()
    proc = start(owned, run_dir, "--workers", "2", "--iterations", str(ITERATIONS), *FAST)
    console = Console(proc, module_deadline)
    changes: list[tuple[int, int]] = []
    try:
        with TreeSampler(proc.pid) as sampler:
            at = console.wait_for(r"^iter\s+3 ")
            for before, workers in [(2, 4), (4, 1), (1, 0), (0, 3)]:
                scale(run_dir, workers)
                if workers == 0:
                    at = console.wait_for("sampling paused until a game joins", after=at)
                    changes.append((console.wait_for(rf"rescale: {before} -> 0 ", after=0), 0))
                    time.sleep(3)  # paused a while: no iteration in between
                    continue
                at = console.wait_for(rf"^rescale: {before} -> {workers} env runners", after=at)
                changes.append((at, workers))
                # Two iterations at the new size before the next change (or the stop).
                at = console.wait_iterations(2, after=at)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=module_deadline.left(guard(600)))
            console.wait_for(r"^uerl local: finished in", after=at)
    finally:
        owned.stop()
    rows = metrics_rows(run_dir)
    return RescaledRun(proc.returncode, console, run_dir, sampler.pids - {proc.pid}, changes, rows)


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_the_rescaled_run_stops_on_ctrl_c_with_a_final_checkpoint(rescaled: RescaledRun) -> None:
    assert rescaled.returncode == 130, rescaled.console.text
    last = rescaled.console.iterations_after(-1)[-1][0]
    latest = rescaled.run_dir / "checkpoints" / "latest"
    assert latest.read_text() == f"checkpoint_{last:06d}", rescaled.console.text


def test_each_change_is_one_line_naming_the_games_that_joined_or_left(
    rescaled: RescaledRun,
) -> None:
    lines = [rescaled.console.lines[i] for i, _ in rescaled.changes]
    assert re.match(r"rescale: 2 -> 4 env runners \(ue-3, ue-4 joined\) in [\d.]+ s$", lines[0])
    assert re.match(r"rescale: 4 -> 1 env runners \(ue-2, ue-3, ue-4 left\) in", lines[1])
    assert re.match(r"rescale: 1 -> 0 env runners \(ue-1 left\) in", lines[2])
    assert re.match(r"rescale: 0 -> 3 env runners \(ue-1, ue-2, ue-3 joined\) in", lines[3])


def test_the_progress_line_follows_the_new_size_within_two_iterations(
    rescaled: RescaledRun,
) -> None:
    for index, workers in rescaled.changes:
        if workers == 0:
            continue
        following = rescaled.console.iterations_after(index)[:2]
        assert (workers, workers) in [(h, t) for _, h, t in following], (
            rescaled.console.lines[index],
            following,
        )


def test_sampling_pauses_with_no_game_and_resumes_when_games_return(
    rescaled: RescaledRun,
) -> None:
    text = rescaled.console.text
    assert "rescale: no game left (0 env runners): sampling paused until a game joins" in text
    assert re.search(r"rescale: sampling again after [\d.]+ s paused", text)


def test_every_game_that_was_present_served_steps(rescaled: RescaledRun) -> None:
    games = json.loads((rescaled.run_dir / "games.json").read_text())
    assert sorted(games) == ["ue-1", "ue-2", "ue-3", "ue-4"]
    assert all(stats["steps"] > 0 for stats in games.values()), games


def test_game_events_record_each_change_and_when_new_runners_first_sampled(
    rescaled: RescaledRun,
) -> None:
    changes = [e for e in rescaled.events if e["kind"] == "rescale"]
    assert [(e["runners_before"], e["runners_after"]) for e in changes] == [
        (2, 4), (4, 1), (1, 0), (0, 3)
    ]  # fmt: skip
    assert [e["joined"] for e in changes] == [[3, 4], [], [], [1, 2, 3]]
    sampling = [e for e in rescaled.events if e["kind"] == "joined_sampling"]
    assert sorted(e["slot"] for e in sampling) == [1, 2, 3, 3, 4]
    for event in sampling:
        print(
            f"ue-{event['slot']}: sampling {event['seconds_since_change']:.1f} s after the change"
        )
        # Sampled after the change, not never: 120 s was 2.6x an idle run's slowest, and
        # under that a loaded host's (up to 5x) could fail it.
        assert 0 < event["seconds_since_change"] < guard(600)


def test_episodes_cut_by_a_removal_are_never_counted(rescaled: RescaledRun) -> None:
    # Runners removed mid-episode (4 -> 1, 1 -> 0) took episodes with them that their
    # games never ended: RLlib counts exactly the episodes the games ended, no more.
    games = json.loads((rescaled.run_dir / "games.json").read_text())
    ended = sum(stats["episodes_ended"] for stats in games.values())
    counted = int(rescaled.rows[-1]["episodes_total"])
    assert counted == ended, (counted, ended)


def test_the_iteration_after_each_change_samples_one_train_batch(rescaled: RescaledRun) -> None:
    """docs/kubernetes.md: "The train batch is split over the runners there are now, so an
    iteration stays the same size." Also prints (with -s) each change's time and the next
    iteration's, against the run's median."""
    rows = {int(r["iteration"]): r for r in rescaled.rows}
    times = {i: float(r["time_s"]) for i, r in rows.items()}
    median = statistics.median(times.values())
    changes = [e for e in rescaled.events if e["kind"] == "rescale"]
    sizes = {}
    for (index, _), event in zip(rescaled.changes, changes, strict=True):
        following = rescaled.console.iterations_after(index)
        assert following, rescaled.console.lines[index]
        first = following[0][0]
        if first - 1 in rows:
            steps = int(rows[first]["env_steps_total"]) - int(rows[first - 1]["env_steps_total"])
            sizes[f"{event['runners_before']} -> {event['runners_after']}"] = steps
        print(
            f"{event['runners_before']} -> {event['runners_after']}: applied in "
            f"{event['seconds']:.2f} s; next iteration {times[first]:.2f} s (median {median:.2f} s)"
        )
    # One train batch (BATCH env steps), split in whole fragments: at most one step more
    # per runner; never a batch sized for the runners before the change.
    assert sizes and all(BATCH <= steps <= BATCH + MAX_RUNNERS for steps in sizes.values()), sizes


def test_nothing_is_left_running(rescaled: RescaledRun) -> None:
    assert survivors(rescaled.pids) == set()


# -- the rescaled run's final checkpoint resumed, with 3 runners, for two iterations -------


@dataclass
class ResumedRun:
    run: LocalRun
    last: int  # the rescaled run's last iteration, its final checkpoint's

    @property
    def rows(self) -> list[dict[str, str]]:
        return metrics_rows(self.run.run_dir)


@pytest.fixture(scope="module")
def resumed(request: pytest.FixtureRequest, rescaled: RescaledRun) -> ResumedRun:
    # Not `module_deadline`: that was set for the rescaled run, before this one starts.
    deadline = Deadline.for_item(request.node, request.config)
    last = rescaled.console.iterations_after(-1)[-1][0]
    run = run_local(
        rescaled.run_dir, "--workers", "3", "--resume", "latest",
        "--iterations", str(last + 2), *FAST, timeout_s=deadline.left(),
    )  # fmt: skip
    return ResumedRun(run, last)


def test_a_checkpoint_taken_after_a_rescale_resumes_with_the_new_size(
    resumed: ResumedRun,
) -> None:
    output, last = resumed.run.output, resumed.last
    assert resumed.run.returncode == 0, output
    assert _iterations(output) == [(last + 1, 3, 3), (last + 2, 3, 3)]


def test_the_resumed_run_says_where_it_continues_from(resumed: ResumedRun) -> None:
    checkpoint = resumed.run.checkpoints / f"checkpoint_{resumed.last:06d}"
    assert f"resumed from {checkpoint}: iteration {resumed.last}, " in resumed.run.output


def test_the_resumed_run_continues_the_env_step_count(
    rescaled: RescaledRun, resumed: ResumedRun
) -> None:
    before = int(rescaled.rows[-1]["env_steps_total"])
    after = [int(r["env_steps_total"]) for r in resumed.rows[resumed.last :]]
    # Each iteration adds one batch to the checkpoint's count: no restart at 0.
    assert before < after[0] < after[1], (before, after)
    assert after[0] - before < before, (before, after)


def test_the_resumed_run_continues_the_iterations_and_keeps_the_earlier_metrics(
    rescaled: RescaledRun, resumed: ResumedRun
) -> None:
    rows = resumed.rows
    assert [int(r["iteration"]) for r in rows] == list(range(1, resumed.last + 3))
    assert rows[: resumed.last] == rescaled.rows


def test_the_resumed_run_writes_its_final_checkpoint(resumed: ResumedRun) -> None:
    latest = (resumed.run.checkpoints / "latest").read_text()
    assert latest == f"checkpoint_{resumed.last + 2:06d}", resumed.run.output


# -- the cluster case: `uerl train --endpoints FILE`, the file the ConfigMap is ------------


def cli_env() -> dict[str, str]:
    # This driver talks to the served cluster only, with its auth mode.
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}


def publish(path: Path, text: str) -> None:
    """As the kubelet updates a mounted ConfigMap: the whole file at once."""
    tmp = path.with_name(".endpoints.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def with_games(text: str, games: int) -> str:
    return json.dumps(json.loads(text) | {"num_env_runners": games}, indent=2)


@dataclass
class FollowedRun:
    returncode: int
    console: Console
    marks: dict[str, int]


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory, module_deadline: Deadline) -> FollowedRun:
    serve_dir = tmp_path_factory.mktemp("serve")
    train_dir = tmp_path_factory.mktemp("train")
    owned = StartedProcesses()
    marks: dict[str, int] = {}
    try:
        serve = owned.popen(
            [sys.executable, "-m", "training.cli", "local", "serve", "--workers", "1",
             "--learners", "0", "--run-dir", str(serve_dir)],
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        Console(serve, module_deadline).wait_for("Ctrl-C stops everything")
        endpoints_file = serve_dir / "endpoints.json"
        good = endpoints_file.read_text()
        game_port = json.loads(good)["port"] + 2  # per_worker: game 2's port
        train = owned.popen(
            [sys.executable, "-m", "training.cli", "train", "--endpoints", str(endpoints_file),
             "--run-dir", str(train_dir), "--iterations", "200", "--preflight-timeout", "5",
             *FAST],
            cwd=PROJECT_ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        console = Console(train, module_deadline)
        at = console.wait_for(r"^iter\s+2 ")
        # 1. A broken file: reported once, the last good endpoints stay.
        publish(endpoints_file, "{half a file")
        at = marks["invalid"] = console.wait_for("keeping the last good one", after=at)
        # 2. A second game that never answers: awaited, then given up on.
        publish(endpoints_file, with_games(good, 2))
        at = marks["waiting"] = console.wait_for("rescale: waiting for ue-2", after=at)
        at = marks["gave_up"] = console.wait_for("rescale: gave up on ue-2", after=at)
        publish(endpoints_file, good)
        at = console.wait_iterations(2, after=at)
        # 3. A second game with other spaces: refused at once.
        other = owned.popen(
            [sys.executable, "-m", "training.cli", "mock-ue", "--host", "127.0.0.1",
             "--port", str(game_port), "--env", "Pendulum-v1"],
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        Console(other, module_deadline).wait_for("mock-ue listening on")
        publish(endpoints_file, with_games(good, 2))
        at = marks["refused"] = console.wait_for("rescale: ue-2 refused", after=at)
        other.terminate()
        other.wait(timeout=guard(60))
        publish(endpoints_file, good)
        # Two iterations on the good file again, then Ctrl-C. (A game that joins: the
        # rescaled run's 2 -> 4 and 0 -> 3, followed by the same watch.)
        at = console.wait_iterations(2, after=at)
        train.send_signal(signal.SIGINT)
        train.wait(timeout=module_deadline.left(guard(600)))
        console.wait_for(r"^interrupted in ", after=at)
    finally:
        owned.stop()
    return FollowedRun(train.returncode, console, marks)


def test_a_driver_following_an_endpoints_file_trains_until_stopped(followed: FollowedRun) -> None:
    assert followed.returncode == 130, followed.console.text


def test_a_broken_endpoints_file_is_reported_and_the_last_good_one_kept(
    followed: FollowedRun,
) -> None:
    line = followed.console.lines[followed.marks["invalid"]]
    assert "is not JSON" in line and "keeping the last good one (1 game(s))" in line
    after = followed.console.iterations_after(followed.marks["invalid"])
    assert after[0][1:] == (1, 1)


def test_a_new_game_that_never_answers_is_given_up_on_and_the_run_goes_on(
    followed: FollowedRun,
) -> None:
    line = followed.console.lines[followed.marks["gave_up"]]
    assert "after the preflight timeout" in line or "preflight timeout 5 s" in line
    assert line.endswith("the run goes on without it")
    assert followed.console.iterations_after(followed.marks["gave_up"])[0][1:] == (1, 1)


def test_a_new_game_with_other_spaces_is_refused(followed: FollowedRun) -> None:
    line = followed.console.lines[followed.marks["refused"]]
    assert "defines agents" in line and "other spaces than the run's game" in line
