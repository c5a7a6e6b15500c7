"""Runs in an S3-compatible bucket, against a real object store (SeaweedFS, object_store.py):
a bucket, credentials or endpoint the run cannot use is refused at start naming the
field; a run is mirrored whole, checkpoint before pointer; a stored run comes back to
resume; a store gone for 30 s delays storing but leaves no broken checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from controlplane import REPO, free_ports
from host_speed import guard
from object_store import ObjectStore
from pyarrow import fs
from run_fakes import SavingAlgo, meta
from store_changes import bucket_changes

from infra.endpoints import RunStorage
from infra.topology import Topology
from training.run import checkpoints, metrics
from training.runs.bucket_reader import BucketRuns
from training.runstore.bucket import S3Location, check
from training.runstore.bucket_mirror import Mirror
from training.runstore.bucket_restore import restore
from training.runstore.location import RunStorageError, RunStorageUnavailable

# pyproject's limit, scaled here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(guard(600))]

BUCKET = "runs"
PREFIX = "uerl-runs"


@pytest.fixture(scope="module")
def store() -> Iterator[ObjectStore]:
    with ObjectStore(buckets=[BUCKET]) as running:
        yield running


@pytest.fixture
def credentials(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)


def location(store: ObjectStore, bucket: str = BUCKET) -> S3Location:
    return S3Location.of(runs(store, bucket))


def runs(store: ObjectStore, bucket: str = BUCKET) -> RunStorage:
    return RunStorage(
        uri=f"s3://{bucket}/{PREFIX}", s3_endpoint=store.endpoint, s3_region="us-east-1"
    )


def stored_keys(store: ObjectStore, run_name: str) -> list[str]:
    root = f"{BUCKET}/{PREFIX}/{run_name}"
    infos = store.filesystem().get_file_info(fs.FileSelector(root, recursive=True))
    return sorted(i.path[len(root) + 1 :] for i in infos if i.type == fs.FileType.File)


def write_run(run_dir: Path, iterations: tuple[int, ...]) -> None:
    rows = []
    for iteration in iterations:
        checkpoints.save(SavingAlgo(size=4096), run_dir / "checkpoints", meta(iteration))
        rows.append(metrics.IterationRow(iteration, iteration * 100, 1, 1.0, 1.0, 0.0, 1.0, 1.0))
    metrics.write_csv(run_dir / "metrics.csv", rows)


def test_a_bucket_that_does_not_exist_is_refused_naming_the_field(
    store: ObjectStore, credentials: None
) -> None:
    with pytest.raises(RunStorageError, match=r"^runs\.s3\.bucket: bucket 'no-such-runs'"):
        check(location(store, "no-such-runs"), "r1")


def test_wrong_credentials_are_refused_naming_the_secret(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", store.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(RunStorageError, match=r"^runs\.s3\.credentials_secret: .* refused"):
        check(location(store), "r1")


def test_an_unreachable_store_is_an_outage_naming_the_endpoint_not_bad_input(
    credentials: None,
) -> None:
    dead = RunStorage(
        uri=f"s3://{BUCKET}/{PREFIX}", s3_endpoint=f"http://127.0.0.1:{free_ports(1)[0]}"
    )
    # An outage (exit 1, which the supervisor retries), not bad input; no wait here.
    with pytest.raises(RunStorageUnavailable, match=r"runs\.s3\.endpoint: .* cannot be reached"):
        check(S3Location.of(dead), "r1", wait_s=0)


def test_a_run_is_stored_whole_and_its_latest_checkpoint_read_back(
    store: ObjectStore, credentials: None, tmp_path: Path
) -> None:
    write_run(tmp_path, (5, 10))
    mirror = Mirror(location(store), "whole", tmp_path, log=print)
    mirror.sync()
    assert mirror.close(timeout_s=60)
    assert stored_keys(store, "whole") == sorted(
        p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()
    )
    assert stored_latest(store, "whole") == "checkpoint_000010"


def test_a_stored_run_comes_back_with_its_latest_checkpoint_only(
    store: ObjectStore, credentials: None, tmp_path: Path
) -> None:
    write_run(tmp_path / "first", (5, 10))
    mirror = Mirror(location(store), "back", tmp_path / "first", log=print)
    mirror.sync()
    assert mirror.close(timeout_s=60)
    lines: list[str] = []
    assert restore(location(store), "back", tmp_path / "again", lines.append)
    again = tmp_path / "again"
    assert sorted(p.name for p in (again / "checkpoints").iterdir()) == [
        "checkpoint_000010",
        "latest",
    ]
    latest = checkpoints.resolve("latest", again / "checkpoints")
    assert checkpoints.read_meta(latest).iteration == 10
    assert [r.iteration for r in metrics.read_csv(again / "metrics.csv")] == [5, 10]
    assert "checkpoint checkpoint_000010" in lines[0]


def test_nothing_to_restore_of_a_run_never_stored(
    store: ObjectStore, credentials: None, tmp_path: Path
) -> None:
    assert not restore(location(store), "never", tmp_path, print)


def test_a_store_gone_for_30_seconds_delays_storing_and_leaves_no_broken_checkpoint(
    store: ObjectStore, credentials: None, tmp_path: Path
) -> None:
    lines: list[str] = []
    write_run(tmp_path, (5,))
    mirror = Mirror(location(store), "outage", tmp_path, log=lines.append)
    mirror.sync()
    assert mirror.wait_idle(60)
    outage = threading.Thread(target=store.pause, args=(30,))
    outage.start()
    time.sleep(1)
    write_run(tmp_path, (5, 10))  # the training goes on: a checkpoint meanwhile
    started = time.monotonic()
    mirror.sync()  # returns at once: storing never holds up the caller
    # Waiting on the store would take the rest of its 30 s pause: 10 s tells them apart
    # on any host (a slow one is not a blocked call).
    assert time.monotonic() - started < 10
    outage.join()
    assert any(line.startswith("run storage: cannot store") for line in lines), lines
    # Back, and before the mirror caught up: `latest` names a whole checkpoint.
    named = stored_latest(store, "outage")
    assert f"checkpoints/{named}/uerl.json" in stored_keys(store, "outage")
    assert mirror.close(timeout_s=120), lines
    assert any(line.startswith("run storage: storing again after") for line in lines), lines
    assert stored_latest(store, "outage") == "checkpoint_000010"


@pytest.mark.parametrize("hostile", ["../escaped.txt", "checkpoints/../../escaped.txt"])
def test_a_key_leading_outside_the_run_is_refused_or_never_stored(
    store: ObjectStore, credentials: None, tmp_path: Path, hostile: str
) -> None:
    write_run(tmp_path / "run", (5,))
    mirror = Mirror(location(store), "hostile", tmp_path / "run", log=print)
    mirror.sync()
    assert mirror.close(timeout_s=60)
    try:
        with store.filesystem().open_output_stream(f"{BUCKET}/{PREFIX}/hostile/{hostile}") as out:
            out.write(b"planted")
    except (OSError, ValueError):  # the store (or pyarrow) refuses it: nothing to read
        pass
    # AWS S3 keeps such a key as it is; SeaweedFS refuses `..` parts: either way no
    # reader of the bucket writes outside the run.
    held = hostile in stored_keys(store, "hostile")
    again, pulled = tmp_path / "deep" / "again", tmp_path / "deep" / "pulled"
    pulled.mkdir(parents=True)
    if held:
        with pytest.raises(RunStorageError, match="leads outside"):
            restore(location(store), "hostile", again, print)
        with pytest.raises(RunStorageError, match="leads outside"):
            BucketRuns(runs(store)).pull("hostile", pulled, latest_only=False, total=None)
    else:
        assert restore(location(store), "hostile", again, print)
        BucketRuns(runs(store)).pull("hostile", pulled, latest_only=False, total=None)
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert not (tmp_path / "escaped.txt").exists()


def stored_latest(store: ObjectStore, run_name: str) -> str:
    path = f"{BUCKET}/{PREFIX}/{run_name}/checkpoints/latest"
    with store.filesystem().open_input_stream(path) as stream:
        return stream.read().decode()


def test_uerl_train_refuses_a_missing_bucket_before_anything_starts(
    store: ObjectStore, tmp_path: Path
) -> None:
    endpoints = Topology().endpoints().model_copy(update={"runs": runs(store, "no-such-runs")})
    path = tmp_path / "endpoints.json"
    path.write_text(endpoints.to_json())
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "training.cli", "train", "--endpoints", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=guard(300),
        env={**os.environ, **store.environment()},
    )  # fmt: skip
    # Printed, not asserted: the time is mostly Python's imports, the host's speed. What
    # "before anything starts" means is seen in the output: no Ray was started.
    print(f"figure uerl train refusing a missing bucket, s: {time.monotonic() - start:.1f}")
    assert result.returncode == 2, result.stderr
    assert "uerl train: runs.s3.bucket: bucket 'no-such-runs' does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Started a local Ray instance" not in result.stdout + result.stderr


# ---- `uerl runs` on a bucket: listed and pulled from this machine ---------------------


def _endpoints_file(store: ObjectStore, tmp_path: Path, bucket: str = BUCKET) -> Path:
    endpoints = Topology().endpoints().model_copy(update={"runs": runs(store, bucket)})
    path = tmp_path / "endpoints.json"
    path.write_text(endpoints.to_json())
    return path


def _uerl_runs(store: ObjectStore, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "training.cli", "runs", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=guard(300),
        env={**os.environ, **store.environment()},
    )  # fmt: skip


def test_uerl_runs_lists_a_buckets_runs_with_their_latest_checkpoint(
    store: ObjectStore, credentials: None, tmp_path: Path
) -> None:
    write_run(tmp_path / "run", (3, 6))
    mirror = Mirror(location(store), "listed", tmp_path / "run", log=print)
    mirror.sync()
    assert mirror.close(timeout_s=60)
    result = _uerl_runs(store, "list", "--endpoints", str(_endpoints_file(store, tmp_path)))
    assert result.returncode == 0, result.stderr
    row = next(line.split() for line in result.stdout.splitlines() if line.startswith("listed "))
    assert row[1:4] == ["checkpoint_000006", "6", "600"], result.stdout
    assert f"in s3://{BUCKET}/{PREFIX}" in result.stderr


def test_uerl_runs_pulls_a_buckets_run_whole_or_its_latest_checkpoint(
    store: ObjectStore, credentials: None, tmp_path: Path
) -> None:
    write_run(tmp_path / "run", (3, 6))
    mirror = Mirror(location(store), "pulled", tmp_path / "run", log=print)
    mirror.sync()
    assert mirror.close(timeout_s=60)
    endpoints = str(_endpoints_file(store, tmp_path))
    whole = _uerl_runs(store, "pull", "pulled", "--endpoints", endpoints, "--to", f"{tmp_path}/a")
    assert whole.returncode == 0, whole.stderr
    assert tree(tmp_path / "a" / "pulled") == tree(tmp_path / "run")
    assert "pulled pulled (checkpoint checkpoint_000006)" in whole.stderr
    latest = _uerl_runs(
        store, "pull", "pulled", "--endpoints", endpoints, "--latest", "--to", f"{tmp_path}/b"
    )
    assert latest.returncode == 0, latest.stderr
    pulled = tmp_path / "b" / "pulled" / "checkpoints"
    assert sorted(p.name for p in pulled.iterdir()) == ["checkpoint_000006", "latest"]
    assert checkpoints.read_meta(checkpoints.resolve("latest", pulled)).iteration == 6


def tree(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file()
    }


def test_uerl_runs_names_the_bucket_that_does_not_exist(store: ObjectStore, tmp_path: Path) -> None:
    path = _endpoints_file(store, tmp_path, "no-such-runs")
    result = _uerl_runs(store, "list", "--endpoints", str(path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("uerl runs: runs.s3.bucket: bucket 'no-such-runs'"), (
        result.stderr
    )


def test_the_stores_conditional_put_creates_a_lease_once_whoever_races_for_it(
    store: ObjectStore, credentials: None
) -> None:
    # The fence's bucket half (training.runstore.lease): SeaweedFS honours If-None-Match,
    # so of writers creating one lease generation in the same instant exactly one does.
    where = location(store)
    key = where.key("race", "lease", "000000001.json")
    made: list[bool] = []
    start = threading.Barrier(4, timeout=guard(30))

    def create(who: int) -> None:
        start.wait()
        made.append(where.put_if_absent(key, f'{{"holder": "{who}"}}'.encode()))

    racers = [threading.Thread(target=create, args=(who,)) for who in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(guard(60))
    assert sorted(made) == [False, False, False, True]
    assert where.put_if_absent(key, b"again") is False
    with store.filesystem().open_input_stream(key) as stream:
        holder = stream.read().decode()
    assert holder in [f'{{"holder": "{who}"}}' for who in range(4)]


def test_a_paused_writer_stores_nothing_once_another_took_its_bucket_run(
    store: ObjectStore, credentials: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.runstore import lease, stored_run
    from training.runstore.lease import LeaseLost

    monkeypatch.setattr(lease, "TTL_S", 1.0)
    monkeypatch.setattr(lease, "RENEW_S", 0.2)
    monkeypatch.setattr(lease, "WATCH_S", 0.2)
    endpoints = Topology().endpoints().model_copy(update={"runs": runs(store)})

    def open_on(head: str) -> stored_run.StoredRun:
        monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / head)
        opened = stored_run.open_stored_run(endpoints, "fenced", resume="auto", log=print)
        assert opened.lease is not None
        opened.lease.end_process = lambda status: None
        return opened

    a = open_on("head-a")
    assert a.lease is not None and a.lease._thread is not None
    a.lease._stop.set()  # A pauses past its TTL
    a.lease._thread.join()
    b = open_on("head-b")
    write_run(b.run_dir, (1,))
    b.sync()
    assert b.mirror is not None and b.mirror.wait_idle(guard(30))
    write_run(a.run_dir, (1, 2))  # A wakes and writes on
    a.sync()  # its mirror reads the store's generations first: not one upload
    assert a.mirror is not None and a.mirror.wait_idle(guard(30))
    with pytest.raises(LeaseLost):
        a.fence()  # and the run's next write is refused
    assert not a.close()
    assert b.close()
    assert "checkpoints/checkpoint_000002/uerl.json" not in stored_keys(store, "fenced")
    assert [k for k in stored_keys(store, "fenced") if k.startswith("lease/")] == [
        "lease/000000002.json"
    ]


def test_a_store_killed_and_started_again_holds_what_it_had(store: ObjectStore) -> None:
    # The bucket schedule's STORE fault (object_store.ObjectStore.kill_and_restart).
    key = f"{BUCKET}/{PREFIX}/killed/kept.txt"
    with store.filesystem().open_output_stream(key) as out:
        out.write(b"kept")
    store.kill_and_restart(1.0)
    with store.filesystem().open_input_stream(key) as stream:
        assert stream.read() == b"kept"


def test_the_stores_own_stream_says_each_change_of_a_runs_latest(store: ObjectStore) -> None:
    # What the fault schedule's checker follows in a bucket (store_changes.bucket_changes).
    s3, root = store.filesystem(), f"{BUCKET}/{PREFIX}/followed"
    seen = threading.Semaphore(0)
    changes = 0
    deadline = time.monotonic() + guard(60)
    with bucket_changes(store, root, seen.release):
        # Written until three changes are said: the stream may start after the first.
        while changes < 3 and time.monotonic() < deadline:
            with s3.open_output_stream(f"{root}/checkpoints/latest") as out:
                out.write(f"checkpoint_{changes:06d}".encode())
            with s3.open_output_stream(f"{root}/checkpoints/other.txt") as out:
                out.write(b"not the pointer")
            if seen.acquire(timeout=1.0):
                changes += 1
    assert changes == 3
