"""One writer, fenced (issue 63, item 1): two writers of one run, on a claim and in a
bucket (in memory, tests/fake_bucket.py; SeaweedFS's conditional PUT in
tests/k8s/test_run_storage.py). A writer whose clock is ahead does not take a live
writer's run; a writer paused past its lease's TTL finds it taken when it wakes, writes
nothing more of the run and ends; of two writers starting in the same instant one takes
the run. Afterwards the stored run is one writer's. Each failed before the fence (the
lease was judged by comparing two clocks, read back after 0.2 s, and checked at the
run's end only)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fake_bucket
import pytest
from fake_bucket import FakeBucket
from run_fakes import meta

from infra.endpoints import Endpoints, RunStorage
from infra.topology import Topology
from training.run import checkpoints
from training.runstore import lease, listing, stored_run
from training.runstore.lease import LeaseLost
from training.runstore.location import RunStorageUnavailable
from training.runstore.stored_run import StoredRun, open_stored_run

RUN = "r"
TTL_S = 0.6
RENEW_S = 0.05


BUCKETS: dict[Path, FakeBucket] = {}  # the test's bucket, by its tmp_path


class WriterAlgo:
    """Saves a checkpoint that says which writer saved it."""

    def __init__(self, who: str) -> None:
        self.who = who

    def save_to_path(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "state.bin").write_text(self.who)


@pytest.fixture(params=["claim", "bucket"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    # A short lease: a renewal, a TTL watched out and a loss seen in a moment.
    monkeypatch.setattr(lease, "TTL_S", TTL_S)
    monkeypatch.setattr(lease, "RENEW_S", RENEW_S)
    monkeypatch.setattr(lease, "WATCH_S", RENEW_S)
    if request.param == "bucket":
        BUCKETS[tmp_path] = fake_bucket.install(monkeypatch)
    (tmp_path / "claim").mkdir()
    yield str(request.param)
    BUCKETS.pop(tmp_path, None)


def endpoints(store: str, tmp_path: Path) -> Endpoints:
    uri = "s3://b/p" if store == "bucket" else f"file://{tmp_path / 'claim'}"
    return Topology().endpoints().model_copy(update={"runs": RunStorage(uri=uri)})


def writer(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> tuple[StoredRun, list[str], list[int]]:
    """A writer of the run on its own head (a bucket run's staging is the head's), its
    log, and the exit statuses it was ended with (the process is not ended here)."""
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / f"head-{name}")
    lines: list[str] = []
    opened = open_stored_run(endpoints(store, tmp_path), RUN, resume="auto", log=lines.append)
    ended: list[int] = []
    assert opened.lease is not None
    opened.lease.end_process = ended.append
    return opened, lines, ended


def stored_text(store: str, tmp_path: Path, relative: str) -> str | None:
    if store == "bucket":
        return BUCKETS[tmp_path].text(f"b/p/{RUN}/{relative}")
    path = tmp_path / "claim" / RUN / relative
    return path.read_text() if path.is_file() else None


def write(stored: StoredRun, who: str, iteration: int) -> None:
    """One iteration's writes of a run, as the driver makes them: its row, a checkpoint
    with `latest`, then storing (retention, the mirror)."""
    stored.fence()
    stored.run_dir.mkdir(parents=True, exist_ok=True)
    (stored.run_dir / "metrics.csv").write_text(f"iteration,writer\n{iteration},{who}\n")
    checkpoints.save(
        WriterAlgo(who), stored.run_dir / "checkpoints", meta(iteration), fence=stored.fence
    )
    stored.sync()
    if stored.mirror is not None:
        assert stored.mirror.wait_idle(10)


def until(check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def test_a_writer_whose_clock_is_61_s_ahead_does_not_take_a_live_writers_run(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _, _ = writer(store, tmp_path, monkeypatch, "a")
    try:
        real = time.time
        # The second head's clock: 61 s ahead of the first's (which renews on its thread).
        ahead = lambda: real() + (0 if threading.current_thread().name == "uerl-run-lease" else 61)  # noqa: E731
        monkeypatch.setattr(lease.time, "time", ahead)
        with pytest.raises(RunStorageUnavailable, match="being written by writer"):
            writer(store, tmp_path, monkeypatch, "b")
        monkeypatch.setattr(lease.time, "time", real)
        first.fence()  # still the first writer's
        write(first, "a", 1)
    finally:
        assert first.close()
    assert stored_text(store, tmp_path, "metrics.csv") == "iteration,writer\n1,a\n"


def test_a_writer_paused_past_its_ttl_stops_writing_and_ends_once_another_took_the_run(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, a_log, a_ended = writer(store, tmp_path, monkeypatch, "a")
    write(a, "a", 1)
    assert a.lease is not None and a.lease._thread is not None
    a.lease._stop.set()  # A pauses: no renewal (a starved thread, a paused VM)
    a.lease._thread.join()
    b, b_log, _ = writer(store, tmp_path, monkeypatch, "b")  # watched A for its TTL, took it
    assert any("taking over the run from writer" in line for line in b_log), b_log
    write(b, "b", 2)
    # A wakes and goes on as if nothing happened: none of it reaches the store (on the
    # claim its first write is refused; a bucket run's goes to its staging, and its
    # mirror refuses to upload it), and from then on every write of it is refused...
    with contextlib.suppress(LeaseLost):
        write(a, "a", 3)
    with pytest.raises(LeaseLost, match="took the run's lease"):
        a.fence()
    # ...and its renewals, once back, end it within one more period (exit status 1).
    a.lease._stop = threading.Event()
    a.lease.keep_renewed()
    until(lambda: a_ended == [1])
    assert any("ending the process (exit status 1)" in line for line in a_log), a_log
    assert not a.close()  # the run is not this writer's: not stored whole by it
    write(b, "b", 4)
    assert b.close()
    # The stored run is B's alone.
    assert stored_text(store, tmp_path, "metrics.csv") == "iteration,writer\n4,b\n"
    assert stored_text(store, tmp_path, "checkpoints/latest") == "checkpoint_000004"
    for iteration in (2, 4):
        state = stored_text(store, tmp_path, f"checkpoints/checkpoint_{iteration:06d}/state.bin")
        assert state == "b", iteration
    assert stored_text(store, tmp_path, "checkpoints/checkpoint_000003/uerl.json") is None
    held = json.loads(stored_text(store, tmp_path, listing.lease_name(2)) or "{}")
    assert held["holder"] == b.lease.holder and held["released"] is True  # type: ignore[union-attr]


def test_of_two_writers_starting_in_the_same_instant_one_takes_the_run(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both find the run free before either creates its lease: the worst interleaving.
    both_listed = threading.Barrier(2, timeout=10)
    for cls in (lease.FileLease, lease.ObjectLease):
        listed = cls.generations

        def generations(self: object, listed: object = listed) -> list[int]:
            found: list[int] = listed(self)  # type: ignore[operator]
            if threading.current_thread().name.startswith("writer-"):
                both_listed.wait()
            return found

        monkeypatch.setattr(cls, "generations", generations)
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head")
    took: list[StoredRun] = []
    refused: list[str] = []

    def start() -> None:
        try:
            took.append(open_stored_run(endpoints(store, tmp_path), RUN, resume=None, log=print))
        except RunStorageUnavailable as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=start, name=f"writer-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(took) == 1 and len(refused) == 1, (took, refused)
    assert "at the same moment; try again" in refused[0]
    write(took[0], "one", 1)
    assert took[0].close()
    assert stored_text(store, tmp_path, "metrics.csv") == "iteration,writer\n1,one\n"


def test_on_a_claim_without_hard_links_the_lease_is_still_created_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    store = lease.FileLease(tmp_path / "r")
    assert store.create(1, '{"holder": "a"}') is True
    assert store.create(1, '{"holder": "b"}') is False
    assert store.read(1) == '{"holder": "a"}' and store.generations() == [1]
    assert [p.name for p in (tmp_path / "r" / "lease").iterdir()] == ["000000001.json"]


def test_a_bucket_without_conditional_writes_is_refused_at_start_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.runstore.bucket import S3Location
    from training.runstore.location import RunStorageError

    bucket = fake_bucket.install(monkeypatch)
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head")

    def no_conditional_put(self: S3Location, key: str, data: bytes) -> bool:
        raise NotImplementedError(
            "endpoints runs.uri (topology runs): s3://b/p: the store does not take "
            "conditional writes (If-None-Match), which the run's lease needs"
        )

    monkeypatch.setattr(S3Location, "put_if_absent", no_conditional_put)
    with pytest.raises(RunStorageError, match=r"^--run-name r: endpoints runs.uri .*If-None-Match"):
        open_stored_run(endpoints("bucket", tmp_path), RUN, resume=None, log=print)
    assert not [k for k in bucket.objects if "/lease/" in k]
