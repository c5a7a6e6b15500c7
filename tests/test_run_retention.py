"""A run's storage does not fill up (issue 54, item 8): old checkpoints are deleted
(`runs.keep_checkpoints`, the one `latest` names and the best kept too) on the claim, in
the head's staging and in the bucket; the head's staging volume has a size limit; and a
run says when its storage runs low."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import fake_bucket
import pytest
from fake_bucket import FakeBucket
from run_fakes import SavingAlgo, meta

from infra import manifests
from infra.endpoints import Endpoints, RunStorage
from infra.manifests import pod_security
from infra.topology import Topology
from training.run import checkpoints, metrics
from training.runstore import stored_run
from training.runstore.stored_run import StoredRun, open_stored_run

RUN = "r"
# Episode return mean per iteration: iteration 2 is the run's best.
RETURNS = {1: 1.0, 2: 9.0, 3: 2.0, 4: math.nan, 5: 3.0, 6: 4.0}


def runs_endpoints(uri: str, keep: int) -> Endpoints:
    runs = RunStorage(uri=uri, keep_checkpoints=keep)
    return Topology().endpoints().model_copy(update={"runs": runs})


def train(stored: StoredRun, iterations: range) -> None:
    """What the driver does each iteration: its row, a checkpoint, then `store()`."""
    rows = metrics.read_csv(stored.run_dir / "metrics.csv")
    for iteration in iterations:
        rows.append(metrics.IterationRow(iteration, iteration * 100, 1, 1.0, 1.0,
                                         RETURNS[iteration], 1.0, 1.0))  # fmt: skip
        metrics.write_csv(stored.run_dir / "metrics.csv", rows)
        checkpoints.save(SavingAlgo(), stored.run_dir / "checkpoints", meta(iteration))
        stored.sync()


def kept(directory: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in directory.glob("checkpoint_*"))


def test_a_run_on_the_claim_keeps_the_newest_checkpoints_and_the_best(tmp_path: Path) -> None:
    stored = open_stored_run(runs_endpoints(f"file://{tmp_path}", 2), RUN, resume=None, log=print)
    train(stored, range(1, 7))
    assert stored.close()
    assert kept(tmp_path / RUN / "checkpoints") == [2, 5, 6]
    assert checkpoints.resolve("latest", tmp_path / RUN / "checkpoints").name.endswith("6")


@pytest.fixture
def bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBucket:
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head")
    return fake_bucket.install(monkeypatch)


def stored_checkpoints(bucket: FakeBucket) -> list[int]:
    names = {k.split("/")[4] for k in bucket.objects if k.startswith(f"b/p/{RUN}/checkpoints/c")}
    return sorted(int(name.split("_")[1]) for name in names)


def test_the_bucket_deletes_the_checkpoints_retention_removed(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    stored = open_stored_run(runs_endpoints("s3://b/p", 2), RUN, resume=None, log=print)
    for iteration in range(1, 7):
        train(stored, range(iteration, iteration + 1))
        assert stored.mirror is not None and stored.mirror.wait_idle(10)
    assert stored.close()
    assert kept(tmp_path / "head" / RUN / "checkpoints") == [2, 5, 6]
    assert stored_checkpoints(bucket) == [2, 5, 6]
    assert bucket.text(f"b/p/{RUN}/checkpoints/latest") == "checkpoint_000006"


def test_a_resumed_run_deletes_what_an_earlier_attempt_stored_past_retention(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = open_stored_run(runs_endpoints("s3://b/p", 10), RUN, resume=None, log=print)
    train(first, range(1, 6))
    assert first.close()
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head-2")
    second = open_stored_run(runs_endpoints("s3://b/p", 2), RUN, resume="auto", log=print)
    train(second, range(6, 7))
    assert second.close()
    assert stored_checkpoints(bucket) == [2, 5, 6]


def test_the_bucket_keeps_the_checkpoint_its_latest_names(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    stored = open_stored_run(runs_endpoints("s3://b/p", 1), RUN, resume=None, log=print)
    never_whole: list[str] = []

    def check(key: str) -> None:
        named = bucket.text(f"b/p/{RUN}/checkpoints/latest")
        if named and f"b/p/{RUN}/checkpoints/{named}/uerl.json" not in bucket.objects:
            never_whole.append(named)

    bucket.on_upload = check
    original_delete = bucket.delete_file

    def delete_then_check(path: str) -> None:
        original_delete(path)
        check(path)

    bucket.delete_file = delete_then_check  # type: ignore[method-assign]
    train(stored, range(1, 7))
    assert stored.close()
    assert never_whole == []


def test_a_run_says_when_its_storage_runs_low(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = open_stored_run(runs_endpoints(f"file://{tmp_path}", 2), RUN, resume=None, log=print)
    lines: list[str] = []
    stored.log = lines.append  # type: ignore[attr-defined]
    real = shutil.disk_usage

    def nearly_full(path: Any) -> Any:
        usage = real(path)
        return type(usage)(total=20 * 2**30, used=20 * 2**30 - 300 * 2**20, free=300 * 2**20)

    monkeypatch.setattr(shutil, "disk_usage", nearly_full)
    train(stored, range(1, 3))
    stored.close()
    low = [line for line in lines if "free" in line]
    assert len(low) == 1, lines  # said once, not every iteration
    assert "300 MiB free" in low[0] and "runs.keep_checkpoints" in low[0]


def test_the_heads_staging_volume_has_a_size_limit_from_the_topology() -> None:
    built = manifests.build(Topology.parse({"runs": {"staging_size": "8Gi"}}))
    pod = built.raycluster["spec"]["headGroupSpec"]["template"]["spec"]
    tmp = next(v for v in pod["volumes"] if v["name"] == pod_security.TMP_VOLUME)
    assert tmp["emptyDir"] == {"sizeLimit": "8Gi"}


def test_a_resumed_run_deletes_the_checkpoints_an_earlier_attempt_stored_in_part(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = open_stored_run(runs_endpoints("s3://b/p", 10), RUN, resume=None, log=print)
    train(first, range(1, 6))
    assert first.close()
    # What a head lost mid-round leaves: an upload cut before its uerl.json, and a
    # deletion cut after it.
    run = f"b/p/{RUN}/checkpoints"
    bucket.objects[f"{run}/checkpoint_000009/algorithm_state.pkl"] = b"half"
    del bucket.objects[f"{run}/checkpoint_000003/uerl.json"]
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head-2")
    lines: list[str] = []
    second = open_stored_run(runs_endpoints("s3://b/p", 10), RUN, resume="auto", log=lines.append)
    train(second, range(6, 7))
    assert second.close()
    assert stored_checkpoints(bucket) == [1, 2, 4, 5, 6]
    said = [line for line in lines if "stored in part" in line]
    assert said and "checkpoint_000003, checkpoint_000009" in said[0], lines


def test_the_first_round_of_an_attempt_keeps_the_checkpoint_the_stored_latest_names(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = open_stored_run(runs_endpoints("s3://b/p", 10), RUN, resume=None, log=print)
    train(first, range(1, 6))
    assert first.close()
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head-2")
    pointer = f"b/p/{RUN}/checkpoints/latest"
    never_whole: list[str] = []
    original_delete = bucket.delete_file

    def delete_then_check(path: str) -> None:
        original_delete(path)
        named = bucket.text(pointer)
        if named and f"b/p/{RUN}/checkpoints/{named}/uerl.json" not in bucket.objects:
            never_whole.append(named)

    bucket.delete_file = delete_then_check  # type: ignore[method-assign]
    # The resumed attempt keeps 1: checkpoint 5 (what the bucket's latest names) is
    # removed on the head once checkpoint 6 is saved, before 6 is stored.
    second = open_stored_run(runs_endpoints("s3://b/p", 1), RUN, resume="auto", log=print)
    train(second, range(6, 7))
    assert second.close()
    assert never_whole == []
    assert bucket.text(pointer) == "checkpoint_000006"
