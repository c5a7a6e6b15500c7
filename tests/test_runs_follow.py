"""`uerl runs pull RUN --follow`: a local copy kept in step with a stored run while it
trains, against each store: a directory on this machine (`--dir`), the runs claim read
through the head (`uerl runs pack --manifest|--only` run for real in a subprocess, as in
test_runs_pull.py) and a bucket (tests/fake_bucket.py). The store changes between two
polls (the follow's `sleep`), so each poll sees what a training wrote since the last.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import fake_bucket
import pytest
from fake_bucket import FakeBucket
from host_speed import guard
from proc_tree import Deadline, StartedProcesses
from test_runs_pull import claim_runs, files, make_run

from infra.endpoints import RunStorage
from training.commands.runs import main as runs_main
from training.runs.bucket_reader import BucketRuns
from training.runs.directory_reader import DirectoryRuns
from training.runs.follow import FollowedStore, follow
from training.runstore import listing
from training.runstore.location import RunStorageError

ROOT = Path(__file__).resolve().parent.parent
LEASE = '{"holder": "w", "host": "h", "generation": 1, "beat": 0, "renewed_at": 1.0, "ttl_s": 60.0}'
LEASE_FILE = listing.lease_name(1)  # the run's writer's (generation 1)
RELEASED = LEASE.replace("}", ', "released": true}')
EVENTS = "tensorboard/events.out.tfevents.1"


class Training:
    """A run as a training grows it, in a directory store: each step appends to its
    events and metrics and may save a checkpoint; the last one ends the run (its lease
    released, as StoredRun.close does after the last files are stored)."""

    def __init__(self, root: Path) -> None:
        self.run = make_run(root, "r1", 1)
        (self.run / LEASE_FILE).parent.mkdir()
        (self.run / LEASE_FILE).write_text(LEASE)
        self.steps: list[Callable[[], None]] = []

    def append(self, relative: str, data: bytes) -> Callable[[], None]:
        def step() -> None:
            with (self.run / relative).open("ab") as fh:
                fh.write(data)

        return step

    def write(self, relative: str, data: bytes) -> Callable[[], None]:
        def step() -> None:
            (self.run / relative).parent.mkdir(parents=True, exist_ok=True)
            (self.run / relative).write_bytes(data)

        return step

    def end(self) -> None:
        (self.run / LEASE_FILE).write_text(RELEASED)

    def sleep(self, seconds: float) -> None:
        assert self.steps, "the follow polled again after the run ended"
        self.steps.pop(0)()


def run_follow(store: FollowedStore, training: Training, into: Path) -> list[str]:
    lines: list[str] = []
    report = follow(store, "r1", into, interval_s=1, log=lines.append, sleep=training.sleep)
    assert report.finished and not training.steps
    return lines


def follows_a_training(store: FollowedStore, training: Training, into: Path) -> None:
    """New files, a growing one (grown in place: TensorBoard's open handle reads on), a
    rewritten one, a new checkpoint and the run's end, seen poll by poll."""
    events = into / EVENTS
    inodes: list[int] = []
    training.steps = [
        lambda: inodes.append(events.stat().st_ino),
        training.append(EVENTS, b"\x01" * 32),
        training.write("logs/ray.log", b"started\n"),
        training.write("metrics.csv", b"iteration,return\n1,0.5\n2,0.7\n3,0.9\n"),
        training.end,
    ]
    (into.parent).mkdir(parents=True, exist_ok=True)
    run_follow(store, training, into)
    assert events.stat().st_ino == inodes[0]  # grown, not replaced
    run_files = {rel: data for rel, data in files(training.run).items() if rel != LEASE_FILE}
    assert files(into) == run_files  # the lease released: the run ended


def test_a_directory_stores_run_is_followed_to_its_end(tmp_path: Path) -> None:
    training = Training(tmp_path / "store")
    follows_a_training(DirectoryRuns(tmp_path / "store"), training, tmp_path / "copy" / "r1")


def test_a_supervised_runs_failed_attempt_is_followed_into_the_next_one(tmp_path: Path) -> None:
    # Issue 63, item 13. Before: the failed attempt released (deleted) its lease and the
    # follow ended, while the supervisor's next attempt went on training the run.
    training = Training(tmp_path / "store")
    failed = LEASE.replace("}", ', "released": true, "ended": 1, "supervised": true}')
    lease2 = training.run / listing.lease_name(2)
    training.steps = [
        training.write(LEASE_FILE, failed.encode()),  # attempt 1 failed (its head lost)
        training.append(EVENTS, b"\x01" * 8),  # nothing new for a poll or two
        lambda: lease2.write_text(LEASE.replace('"generation": 1', '"generation": 2')),
        training.write("metrics.csv", b"iteration,return\n1,0.5\n2,0.7\n"),  # attempt 2
        lambda: lease2.write_text(RELEASED.replace('"generation": 1', '"generation": 2')),
    ]
    into = tmp_path / "copy" / "r1"
    into.parent.mkdir(parents=True)
    run_follow(DirectoryRuns(tmp_path / "store"), training, into)
    assert (into / "metrics.csv").read_bytes() == b"iteration,return\n1,0.5\n2,0.7\n"
    assert training.steps == []  # followed to the run's end, after attempt 2


def test_a_claims_run_is_followed_through_the_head(tmp_path: Path) -> None:
    training = Training(tmp_path / "store")
    store, calls = claim_runs(tmp_path / "store")
    follows_a_training(store, training, tmp_path / "copy" / "r1")
    packs = [command for _, command in calls if "--only" in command]
    # Only what changed is packed: the first poll everything, then one file a poll.
    assert packs[1][packs[1].index("--only") + 1 :] == [EVENTS]
    assert any("checkpoints/checkpoint_000001/" in command for command in packs[0])


def test_a_new_checkpoint_arrives_and_pruned_ones_and_the_users_files_stay(
    tmp_path: Path,
) -> None:
    training = Training(tmp_path / "store")
    into = tmp_path / "copy" / "r1"
    into.mkdir(parents=True)
    (into / "notes.txt").write_text("mine")
    from run_fakes import SavingAlgo, meta

    from training.run import checkpoints

    def second_checkpoint() -> None:
        checkpoints.save(SavingAlgo(size=1000), training.run / "checkpoints", meta(2))
        import shutil

        shutil.rmtree(training.run / "checkpoints" / "checkpoint_000001")  # retention

    training.steps = [second_checkpoint, training.end]
    run_follow(DirectoryRuns(tmp_path / "store"), training, into)
    assert (into / "notes.txt").read_text() == "mine"
    names = sorted(p.name for p in (into / "checkpoints").iterdir())
    assert names == ["checkpoint_000001", "checkpoint_000002", "latest"]
    assert (into / "checkpoints" / "latest").read_text() == "checkpoint_000002"


def test_a_follow_ends_at_once_on_a_run_that_has_ended(tmp_path: Path) -> None:
    training = Training(tmp_path / "store")
    training.end()
    run_follow(DirectoryRuns(tmp_path / "store"), training, tmp_path / "copy" / "r1")
    assert (tmp_path / "copy" / "r1" / "metrics.csv").is_file()


def test_following_a_run_the_store_lacks_is_refused_naming_the_runs(tmp_path: Path) -> None:
    Training(tmp_path / "store")
    with pytest.raises(RunStorageError, match=r"'r2': no such run .*runs: r1"):
        follow(DirectoryRuns(tmp_path / "store"), "r2", tmp_path / "copy" / "r2")


# ---- a bucket (in memory) ------------------------------------------------------------


def test_a_buckets_run_is_followed_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket: FakeBucket = fake_bucket.install(monkeypatch)
    run = make_run(tmp_path / "made", "r1", 1)
    for path in sorted(run.rglob("*")):
        if path.is_file():
            bucket.objects[f"b/p/r1/{path.relative_to(run).as_posix()}"] = path.read_bytes()
    bucket.objects[f"b/p/r1/{LEASE_FILE}"] = LEASE.encode()
    events = f"b/p/r1/{EVENTS}"

    def grow() -> None:
        bucket.objects[events] += b"\x02" * 16

    def new_file() -> None:
        bucket.objects["b/p/r1/logs/ray.log"] = b"started\n"

    def end() -> None:
        bucket.objects[f"b/p/r1/{LEASE_FILE}"] = RELEASED.encode()

    steps = [grow, new_file, end]

    def sleep(seconds: float) -> None:
        steps.pop(0)()

    into = tmp_path / "copy" / "r1"
    store = BucketRuns(RunStorage(uri="s3://b/p"), log=print)
    report = follow(store, "r1", into, interval_s=1, log=print, sleep=sleep)
    assert report.finished and not steps
    copied = {f"b/p/r1/{rel}": data for rel, data in files(into).items()}
    run_files = {key: data for key, data in bucket.objects.items() if "/lease/" not in key}
    assert copied == run_files  # the lease released: the run ended


def test_a_store_that_stops_answering_mid_follow_is_said_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket: FakeBucket = fake_bucket.install(monkeypatch)
    bucket.objects["b/p/r1/metrics.csv"] = b"iteration\n1\n"
    bucket.objects[f"b/p/r1/{LEASE_FILE}"] = LEASE.encode()

    def down(path: str) -> None:
        raise OSError("AWS Error NETWORK_CONNECTION during ListObjectsV2: 503")

    def outage() -> None:
        bucket.on_request = down

    def back() -> None:
        bucket.on_request = lambda path: None
        bucket.objects["b/p/r1/metrics.csv"] = b"iteration\n1\n2\n"
        bucket.objects[f"b/p/r1/{LEASE_FILE}"] = RELEASED.encode()

    steps = [outage, back]
    lines: list[str] = []
    store = BucketRuns(RunStorage(uri="s3://b/p"), log=print)
    report = follow(
        store, "r1", tmp_path / "r1", log=lines.append, sleep=lambda s: steps and steps.pop(0)()
    )
    assert report.finished
    assert (tmp_path / "r1" / "metrics.csv").read_bytes() == b"iteration\n1\n2\n"
    assert any("did not answer" in line for line in lines), lines
    assert any("answers again" in line for line in lines), lines


# ---- the command -----------------------------------------------------------------------


def test_follow_refuses_replace_and_interval_without_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["pull", "r1", "--dir", str(tmp_path)]
    for extra in (["--follow", "--replace"], ["--interval", "5"], ["--follow", "--interval", "0"]):
        with pytest.raises(SystemExit) as exited:
            runs_main([*base, *extra])
        assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--interval: only with --follow" in err and "at least 1 second" in err


def test_pack_manifest_and_only_are_what_a_follow_reads_on_the_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Training(tmp_path)
    assert runs_main(["pack", "r1", "--dir", str(tmp_path), "--manifest"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["lease"] == LEASE and manifest["latest"] == "checkpoint_000001"
    assert "metrics.csv" in manifest["files"]
    assert not [relative for relative in manifest["files"] if relative.startswith("lease")]
    _, planned = listing.plan(
        tmp_path, "r1", latest_only=False, only=["metrics.csv", "checkpoints/"]
    )
    assert {rel for rel, _ in planned} >= {"metrics.csv"}
    assert all(rel == "metrics.csv" or rel.startswith("checkpoints/") for rel, _ in planned)


def start_follow(started: StartedProcesses, store: Path, to: Path) -> subprocess.Popen[str]:
    return started.popen(
        [sys.executable, "-m", "training.cli", "runs", "pull", "r1", "--dir", str(store),
         "--to", str(to), "--follow", "--interval", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(path: Path, deadline: Deadline) -> None:
    while not path.exists():
        deadline.left()
        time.sleep(0.1)


def test_ctrl_c_ends_a_follow_at_once_with_exit_0_and_its_summary(
    tmp_path: Path, started: StartedProcesses, deadline: Deadline
) -> None:
    Training(tmp_path / "store")
    proc = start_follow(started, tmp_path / "store", tmp_path / "copy")
    wait_for(tmp_path / "copy" / "r1" / "checkpoints" / "latest", deadline)
    time.sleep(1.5)  # into its wait between two polls, or its next poll
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=guard(10))
    took = time.monotonic() - sent
    assert proc.returncode == 0, err
    assert took < guard(3), took
    assert "Traceback" not in err
    (summary,) = [line for line in err.splitlines() if "stopped (Ctrl-C)" in line]
    assert "file(s)" in summary and str(tmp_path / "copy" / "r1") in summary


def test_a_follow_ends_by_itself_when_the_run_ends(
    tmp_path: Path, started: StartedProcesses, deadline: Deadline
) -> None:
    training = Training(tmp_path / "store")
    proc = start_follow(started, tmp_path / "store", tmp_path / "copy")
    wait_for(tmp_path / "copy" / "r1" / "checkpoints" / "latest", deadline)
    training.append("metrics.csv", b"4,1.0\n")()
    training.end()
    _, err = proc.communicate(timeout=deadline.left(guard(30)))
    assert proc.returncode == 0, err
    assert "the run has ended" in err.splitlines()[-1], err
    assert (tmp_path / "copy" / "r1" / "metrics.csv").read_bytes().endswith(b"4,1.0\n")
