"""One writer per run (issue 54, item 9): a run's lease (`lease/` in the store) is
taken at the start and renewed while it trains; a second live writer is refused, a dead
one's lease is taken over, and a new run cannot take a used name. On the claim and in a
bucket (in memory, tests/fake_bucket.py)."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import fake_bucket
import pytest
from fake_bucket import FakeBucket
from run_fakes import SavingAlgo, meta

from infra.endpoints import Endpoints, RunStorage
from infra.topology import Topology
from training.run import checkpoints
from training.runstore import atomic, listing, stored_run
from training.runstore.location import RunStorageError
from training.runstore.stored_run import StoredRun, open_stored_run

RUN = "r"
try:
    from training.runstore import lease
except ImportError:  # before the fix: the tests fail on what they check, not on this
    lease = types.ModuleType("lease")


@pytest.fixture(params=["claim", "bucket"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The store a test's runs go to: `claim` (a directory) or `bucket`."""
    # A short lease, so a test sees one renewed and one run out in a moment.
    monkeypatch.setattr(lease, "TTL_S", 0.6, raising=False)
    monkeypatch.setattr(lease, "RENEW_S", 0.05, raising=False)
    if request.param == "bucket":
        monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head")
        monkeypatch.setattr(StoredRun, "_bucket", fake_bucket.install(monkeypatch), raising=False)
    else:
        (tmp_path / "claim").mkdir()
    return str(request.param)


def endpoints(store: str, tmp_path: Path) -> Endpoints:
    uri = "s3://b/p" if store == "bucket" else f"file://{tmp_path / 'claim'}"
    return Topology().endpoints().model_copy(update={"runs": RunStorage(uri=uri)})


def bucket() -> FakeBucket:
    return StoredRun._bucket  # type: ignore[attr-defined,no-any-return]


def lease_texts(store: str, tmp_path: Path) -> dict[int, str]:
    """The run's lease files' texts, by generation."""
    if store == "bucket":
        prefix = f"b/p/{RUN}/"
        found = {
            listing.lease_generation(key[len(prefix) :]): data.decode()
            for key, data in bucket().objects.items()
            if key.startswith(prefix)
        }
    else:
        found = {
            listing.lease_generation(path.relative_to(tmp_path / "claim" / RUN).as_posix()):
            path.read_text()
            for path in (tmp_path / "claim" / RUN).glob("lease/*")
        }  # fmt: skip
    return {generation: text for generation, text in found.items() if generation is not None}


def stored_lease(store: str, tmp_path: Path) -> dict[str, object] | None:
    """The lease a reader takes for the run's (None: released, or none)."""
    text = listing.held_lease(dict(lease_texts(store, tmp_path)))
    return None if text is None else dict(json.loads(text))


def plant_lease(store: str, tmp_path: Path, *, renewed_ago_s: float) -> None:
    """Another writer's lease (generation 1), renewed `renewed_ago_s` ago by its clock,
    and not since."""
    text = json.dumps(
        {
            "holder": "other",
            "host": "head-0",
            "generation": 1,
            "beat": 3,
            "renewed_at": time.time() - renewed_ago_s,
            "ttl_s": 0.6,
        }
    )
    if store == "bucket":
        bucket().objects[f"b/p/{RUN}/{listing.lease_name(1)}"] = text.encode()
    else:
        path = tmp_path / "claim" / RUN / listing.lease_name(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def write_some_of_a_run(stored: StoredRun) -> None:
    stored.run_dir.mkdir(parents=True, exist_ok=True)
    (stored.run_dir / "metrics.csv").write_text("iteration\n1\n")
    stored.sync()
    if stored.mirror is not None:
        assert stored.mirror.wait_idle(10)


def test_a_new_run_with_a_used_name_is_refused_naming_resume_auto(
    store: str, tmp_path: Path
) -> None:
    first = open_stored_run(endpoints(store, tmp_path), RUN, resume=None, log=print)
    write_some_of_a_run(first)
    assert first.close()
    with pytest.raises(RunStorageError, match=r"^--run-name r: .*--resume auto"):
        open_stored_run(endpoints(store, tmp_path), RUN, resume=None, log=print)


def test_a_run_a_live_writer_holds_is_refused_as_worth_retrying(store: str, tmp_path: Path) -> None:
    first = open_stored_run(endpoints(store, tmp_path), RUN, resume="auto", log=print)
    try:
        with pytest.raises(Exception, match=r"--run-name r: .*written by .*lease") as refused:
            open_stored_run(endpoints(store, tmp_path), RUN, resume="auto", log=print)
        assert type(refused.value).__name__ == "RunStorageUnavailable"  # exit 1, not 2
    finally:
        first.close()


def test_a_dead_writers_lease_is_taken_over_saying_so(store: str, tmp_path: Path) -> None:
    plant_lease(store, tmp_path, renewed_ago_s=5.0)
    lines: list[str] = []
    stored = open_stored_run(endpoints(store, tmp_path), RUN, resume="auto", log=lines.append)
    try:
        lease = stored_lease(store, tmp_path)
        assert lease is not None and lease["holder"] != "other"
        assert any("taking over" in line and "other" in line for line in lines), lines
    finally:
        stored.close()


def test_a_resumed_run_waits_out_the_lease_of_a_writer_that_stopped_renewing(
    store: str, tmp_path: Path
) -> None:
    plant_lease(store, tmp_path, renewed_ago_s=0.0)  # its head lost a moment ago
    stored = open_stored_run(endpoints(store, tmp_path), RUN, resume="auto", log=print)
    stored.close()


def test_the_lease_is_renewed_while_the_run_goes_on(store: str, tmp_path: Path) -> None:
    stored = open_stored_run(endpoints(store, tmp_path), RUN, resume="auto", log=print)
    try:
        first = stored_lease(store, tmp_path)
        time.sleep(0.3)
        again = stored_lease(store, tmp_path)
        assert first is not None and again is not None
        assert int(str(again["beat"])) > int(str(first["beat"]))  # what a watcher reads
    finally:
        stored.close()


def test_the_lease_is_released_at_the_end(store: str, tmp_path: Path) -> None:
    stored = open_stored_run(endpoints(store, tmp_path), RUN, resume="auto", log=print)
    assert stored_lease(store, tmp_path) is not None
    assert stored.close()
    assert stored_lease(store, tmp_path) is None  # released: the next writer takes it at once
    assert len(lease_texts(store, tmp_path)) == 1  # kept: the generations only grow


def test_a_save_leaves_another_writers_checkpoint_in_progress_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with atomic.directory(tmp_path / "checkpoint_000010") as theirs:  # writer A, saving
        theirs.mkdir()
        (theirs / "module_state.pkl").write_text("A's")
        monkeypatch.setattr(atomic, "WRITER", "b", raising=False)  # writer B, saving too
        checkpoints.save(SavingAlgo(), tmp_path, meta(10))
        assert (theirs / "module_state.pkl").read_text() == "A's"
