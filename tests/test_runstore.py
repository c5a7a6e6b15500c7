"""The run storage's local guarantees (training/runstore): files and checkpoints are whole
or absent, a run's name and place are checked before it starts, and a bucket's mirror
uploads each checkpoint before the pointer to it. The bucket itself is tested against a
real object store in tests/k8s/test_run_storage.py."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import fake_bucket
import pytest
from fake_bucket import FakeBucket
from host_speed import guard
from run_fakes import SavingAlgo, meta
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from infra.endpoints import RunStorage
from infra.topology import Topology
from training.run import checkpoints, metrics
from training.run.tensorboard import TensorBoardWriter
from training.runstore import atomic, attempts, bucket_mirror, listing, stored_run
from training.runstore import bucket as bucket_store
from training.runstore.bucket import S3Location
from training.runstore.bucket_mirror import Mirror
from training.runstore.bucket_restore import restore
from training.runstore.location import (
    RunStorageError,
    RunStorageUnavailable,
    check_room,
    check_run_name,
)
from training.runstore.stored_run import StoredRun, open_stored_run


def test_a_saved_checkpoint_is_named_by_latest_with_its_metadata(tmp_path: Path) -> None:
    path = checkpoints.save(SavingAlgo(), tmp_path, meta(5))
    assert path == tmp_path / "checkpoint_000005"
    assert (tmp_path / "latest").read_text() == "checkpoint_000005"
    assert checkpoints.read_meta(path).iteration == 5


def test_a_save_cut_short_leaves_no_checkpoint_and_latest_as_it_was(tmp_path: Path) -> None:
    checkpoints.save(SavingAlgo(), tmp_path, meta(5))
    with pytest.raises(OSError, match="No space left"):
        checkpoints.save(SavingAlgo(fail=True), tmp_path, meta(10))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000005", "latest"]
    assert checkpoints.resolve("latest", tmp_path) == tmp_path / "checkpoint_000005"


def test_the_next_save_removes_what_a_killed_save_left(tmp_path: Path) -> None:
    left = tmp_path / f"{atomic.PARTIAL_PREFIX}dead-checkpoint_000010"
    left.mkdir(parents=True)
    # Unchanged since its writer died (a save in progress would be adding files).
    dead_since = time.time() - atomic.LEFTOVER_STALE_S - 1
    os.utime(left, (dead_since, dead_since))
    checkpoints.save(SavingAlgo(), tmp_path, meta(15))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000015", "latest"]


def test_saving_an_iteration_again_replaces_its_checkpoint_whole(tmp_path: Path) -> None:
    checkpoints.save(SavingAlgo(), tmp_path, meta(5))
    (tmp_path / "checkpoint_000005" / "stale").write_text("from the first save")
    checkpoints.save(SavingAlgo(), tmp_path, meta(5))
    assert not (tmp_path / "checkpoint_000005" / "stale").exists()


def test_a_file_written_whole_replaces_the_old_one_and_leaves_no_partial(tmp_path: Path) -> None:
    target = tmp_path / "metrics.csv"
    atomic.write_text(target, "old")
    atomic.write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]


def test_metrics_are_rewritten_whole_each_iteration(tmp_path: Path) -> None:
    row = metrics.IterationRow(1, 100, 2, 1.0, 100.0, 0.5, 10.0, 200.0)
    path = tmp_path / "metrics.csv"
    metrics.write_csv(path, [row])
    metrics.write_csv(path, [row, metrics.IterationRow(2, 200, 4, 1.0, 100.0, 0.7, 10.0, 200.0)])
    assert [r.iteration for r in metrics.read_csv(path)] == [1, 2]


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden", "x" * 101, "tab\tname"])
def test_a_run_name_that_is_not_one_path_segment_is_refused(name: str) -> None:
    with pytest.raises(RunStorageError, match="--run-name"):
        check_run_name(name)


def test_run_storage_not_mounted_here_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(RunStorageError, match=r"runs\.uri .*not mounted here"):
        check_room(tmp_path / "absent")


def test_a_run_on_the_claim_goes_under_its_name(tmp_path: Path) -> None:
    endpoints = (
        Topology().endpoints().model_copy(update={"runs": RunStorage(uri=f"file://{tmp_path}")})
    )
    stored = open_stored_run(endpoints, "ppo-1", resume=None, log=print)
    assert stored.run_dir == tmp_path / "ppo-1"
    assert stored.mirror is None


def test_a_bucket_uri_names_bucket_prefix_and_store() -> None:
    location = S3Location.of(
        RunStorage(uri="s3://game-runs/team/a", s3_endpoint="http://s3:8333", s3_region="eu")
    )
    assert (location.bucket, location.prefix, location.endpoint, location.region) == (
        "game-runs",
        "team/a",
        "http://s3:8333",
        "eu",
    )
    assert location.uri("run", "metrics.csv") == "s3://game-runs/team/a/run/metrics.csv"


def test_the_mirror_uploads_a_checkpoint_before_its_metadata_and_latest_last(
    tmp_path: Path,
) -> None:
    for iteration in (5, 10):
        checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(iteration))
    (tmp_path / "metrics.csv").write_text("iteration\n")
    (tmp_path / f"{atomic.PARTIAL_PREFIX}metrics.csv").write_text("half")
    mirror = Mirror(S3Location("b", "p", None, None), "run", tmp_path, log=print)
    order = [relative for relative, _ in mirror._changed()]
    assert order == [
        "checkpoints/checkpoint_000005/module_state.pkl",
        "checkpoints/checkpoint_000010/module_state.pkl",
        "metrics.csv",
        "checkpoints/checkpoint_000005/uerl.json",
        "checkpoints/checkpoint_000010/uerl.json",
        "checkpoints/latest",
    ]


def resume_asked(argv: list[str]) -> str | None:
    from training.commands.train import build_parser
    from training.commands.training_options import options_from_args

    return options_from_args(build_parser().parse_args(argv), name="uerl").resume


def test_resume_auto_starts_a_run_that_has_no_checkpoint(tmp_path: Path) -> None:
    assert resume_asked(["--run-dir", str(tmp_path), "--resume", "auto"]) is None


def test_resume_auto_continues_a_run_from_its_newest_checkpoint(tmp_path: Path) -> None:
    checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(5))
    assert resume_asked(["--run-dir", str(tmp_path), "--resume", "auto"]) == "latest"


# ---- a bucket (in memory, tests/fake_bucket.py) while the run goes on ----------------

LOCATION = S3Location("b", "p", None, None)
RUN = "r"


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> FakeBucket:
    return fake_bucket.install(monkeypatch)


def key(relative: str) -> str:
    return f"b/p/{RUN}/{relative}"


def unwhole_latest(bucket: FakeBucket, local: Path) -> str | None:
    """What is wrong with the bucket's `checkpoints/latest`, if anything: it must name a
    checkpoint every file of which (as the run wrote it, here) the bucket holds."""
    named = bucket.text(key("checkpoints/latest"))
    if named is None:
        return None
    directory = local / "checkpoints" / named
    files = [p.relative_to(local).as_posix() for p in directory.rglob("*") if p.is_file()]
    missing = [f for f in files if key(f) not in bucket.objects]
    if not files or missing:
        return f"latest names {named}, the bucket lacks {missing or 'all of it'}"
    return None


def store(local: Path) -> None:
    mirror = Mirror(LOCATION, RUN, local, log=print)
    mirror.sync()
    assert mirror.close(timeout_s=30)


def test_latest_stored_while_the_driver_saves_names_the_checkpoint_the_round_stored(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(5))
    broken: list[str] = []

    def driver_saves_meanwhile(stored: str) -> None:
        if stored == key("checkpoints/checkpoint_000005/module_state.pkl"):
            checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(10))
        broken.extend(filter(None, [unwhole_latest(bucket, tmp_path)]))

    bucket.on_upload = driver_saves_meanwhile
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print)
    mirror.sync()
    assert mirror.wait_idle(30)
    assert broken == []
    assert bucket.text(key("checkpoints/latest")) == "checkpoint_000005"
    assert mirror.close(timeout_s=30)  # the next round stores 10 and then its pointer
    assert bucket.text(key("checkpoints/latest")) == "checkpoint_000010"


@pytest.mark.parametrize("seed", range(3))
def test_latest_in_the_bucket_names_a_whole_checkpoint_after_every_upload(
    seed: int, tmp_path: Path, bucket: FakeBucket
) -> None:
    rng = random.Random(seed)  # one interleaving per seed, the same every time
    iteration = 0
    broken: list[str] = []

    def driver_step() -> None:
        nonlocal iteration
        action = rng.choice(("save", "save", "metrics", "log", "nothing"))
        if action == "save":
            iteration += 1
            algo = SavingAlgo(size=rng.randint(1, 4000))
            checkpoints.save(algo, tmp_path / "checkpoints", meta(iteration))
        elif action == "metrics":
            atomic.write_text(tmp_path / "metrics.csv", "iteration\n" + "1\n" * iteration)
        elif action == "log":
            with (tmp_path / "game_events.jsonl").open("a") as fh:
                fh.write('{"event": "x"}\n')

    def check_then_drive(stored: str) -> None:
        broken.extend(filter(None, [unwhole_latest(bucket, tmp_path)]))
        for _ in range(rng.choice((0, 0, 1, 2))):
            driver_step()

    driver_step()
    bucket.on_upload = check_then_drive
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print)
    for _ in range(12):
        driver_step()
        mirror.sync()
        assert mirror.wait_idle(30)
    bucket.on_upload = lambda stored: None  # the driver stops: the last rounds catch up
    assert mirror.close(timeout_s=30)
    assert broken == []
    newest = (tmp_path / "checkpoints" / "latest").read_text()
    assert bucket.text(key("checkpoints/latest")) == newest


class TwoFileAlgo:
    """A checkpoint of two data files, as RLlib's are of many."""

    def save_to_path(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "a.pkl").write_bytes(b"a" * 64)
        (Path(path) / "b.pkl").write_bytes(b"b" * 64)


def test_latest_never_names_a_checkpoint_a_file_of_which_was_pruned_mid_upload(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    # Issue 63, item 5. Before: a data file gone at its upload (retention's rmtree on the
    # driver's thread) was skipped, uerl.json still went, and `latest` named the
    # checkpoint: whole by every reader, unresumable.
    checkpoints.save(TwoFileAlgo(), tmp_path / "checkpoints", meta(3))
    listed = tmp_path / "checkpoints" / "checkpoint_000003"

    def prune_the_rest(stored: str) -> None:
        if stored == key("checkpoints/checkpoint_000003/a.pkl"):
            (listed / "b.pkl").unlink()  # retention deleting it while the round uploads

    bucket.on_upload = prune_the_rest
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print)
    mirror.sync()
    assert mirror.wait_idle(30)
    assert bucket.text(key("checkpoints/latest")) is None
    meta_text = bucket.text(key("checkpoints/checkpoint_000003/uerl.json"))
    assert meta_text is not None and json.loads(meta_text)["files"] == {"a.pkl": 64, "b.pkl": 64}
    stored = {k.removeprefix(key("")): len(v) for k, v in bucket.objects.items()}
    assert listing.whole_checkpoint(None, stored, lambda rel: bucket.text(key(rel))) is None
    mirror.close(timeout_s=5)


def test_a_pointer_put_whose_answer_was_lost_keeps_the_checkpoint_it_may_name(
    tmp_path: Path, bucket: FakeBucket, quick_retries: None
) -> None:
    # Issue 63, item 6. Before: the PUT of `latest` timed out but landed; the mirror took
    # the old pointer for the stored one, and retention deleted the checkpoint the
    # bucket's `latest` named.
    checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(1))
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print)
    mirror.sync()
    assert mirror.wait_idle(30)
    broken: list[str] = []
    answers_lost = [True]

    def lost_answer(stored: str) -> None:
        named = bucket.text(key("checkpoints/latest"))
        if named and bucket.text(key(f"checkpoints/{named}/uerl.json")) is None:
            broken.append(f"latest names {named}, which the bucket does not hold")
        if stored == key("checkpoints/latest") and answers_lost[0]:
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject: timeout")

    bucket.on_upload = lost_answer
    checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(2))
    mirror.sync()
    deadline = time.monotonic() + 10
    while bucket.text(key("checkpoints/latest")) != "checkpoint_000002":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Retention (keep 1, two saves on) removes 2 while the bucket's `latest` names it.
    checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(3))
    shutil.rmtree(tmp_path / "checkpoints" / "checkpoint_000002")  # as retention.prune does
    mirror.remove({"checkpoint_000002"})
    time.sleep(0.3)  # rounds run, each pointer PUT landing without an answer
    assert broken == []
    assert key("checkpoints/checkpoint_000002/uerl.json") in bucket.objects
    answers_lost[0] = False
    assert mirror.close(timeout_s=30)
    assert bucket.text(key("checkpoints/latest")) == "checkpoint_000003"
    assert key("checkpoints/checkpoint_000002/uerl.json") not in bucket.objects  # then it goes
    assert broken == []


def test_restore_falls_back_to_the_newest_whole_checkpoint_when_latest_names_a_missing_one(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    for iteration in (5, 10):
        checkpoints.save(SavingAlgo(), tmp_path / "run" / "checkpoints", meta(iteration))
    store(tmp_path / "run")
    # What a lost head left: a pointer to 15, of which only a part was stored.
    bucket.objects[key("checkpoints/checkpoint_000015/module_state.pkl")] = b"part"
    bucket.objects[key("checkpoints/latest")] = b"checkpoint_000015"
    lines: list[str] = []
    assert restore(LOCATION, RUN, tmp_path / "again", lines.append)
    resumed = checkpoints.resolve("latest", tmp_path / "again" / "checkpoints")
    assert resumed.name == "checkpoint_000010"
    assert checkpoints.read_meta(resumed).iteration == 10
    assert any("checkpoint_000015" in line and "checkpoint_000010" in line for line in lines)


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_whole_one(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    for iteration in (5, 10):
        checkpoints.save(SavingAlgo(), tmp_path / "run" / "checkpoints", meta(iteration))
    store(tmp_path / "run")
    bucket.objects[key("checkpoints/checkpoint_000010/uerl.json")] = b'{"iterat'
    assert restore(LOCATION, RUN, tmp_path / "again", print)
    resumed = checkpoints.resolve("latest", tmp_path / "again" / "checkpoints")
    assert resumed.name == "checkpoint_000005"


@pytest.mark.parametrize(
    "hostile",
    ["../escaped.txt", "checkpoints/checkpoint_000005/../../../escaped.txt", "{tmp}/escaped.txt"],
)
def test_restore_refuses_a_key_that_leads_outside_the_run_and_writes_nothing(
    hostile: str, tmp_path: Path, bucket: FakeBucket
) -> None:
    checkpoints.save(SavingAlgo(), tmp_path / "run" / "checkpoints", meta(5))
    store(tmp_path / "run")
    relative = hostile.format(tmp=tmp_path)  # "{tmp}/..." makes a key with `//`
    bucket.objects[key(relative)] = b"planted"
    with pytest.raises(RunStorageError, match="leads outside") as refused:
        restore(LOCATION, RUN, tmp_path / "again", print)
    assert relative in str(refused.value)
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "again").exists()


def test_an_attempt_before_the_first_checkpoint_keeps_what_the_earlier_one_stored(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoints = Topology().endpoints().model_copy(update={"runs": RunStorage(uri="s3://b/p")})
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head-1")
    first = open_stored_run(endpoints, RUN, resume="auto", log=print)
    attempts.record(first.run_dir, 1, "", resumed_from=None, iteration=None)
    (first.run_dir / "logs").mkdir(parents=True)
    (first.run_dir / "logs" / "ray.log").write_text("attempt 1\n")
    assert first.close()
    # The head is lost before any checkpoint: the next attempt runs on a new head.
    monkeypatch.setattr(stored_run, "staging_root", lambda: tmp_path / "head-2")
    second = open_stored_run(endpoints, RUN, resume="auto", log=print)
    attempts.record(second.run_dir, 2, "the Ray head was lost", resumed_from=None, iteration=None)
    (second.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    with (second.run_dir / "logs" / "ray.log").open("a") as fh:  # as RayConsole writes it
        fh.write("attempt 2\n")
    assert second.close()
    record = bucket.text(key("attempts.jsonl")) or ""
    assert [json.loads(line)["attempt"] for line in record.splitlines()] == [1, 2]
    assert bucket.text(key("logs/ray.log")) == "attempt 1\nattempt 2\n"


def test_a_run_starting_over_plots_each_step_once_with_the_new_value(tmp_path: Path) -> None:
    lost = TensorBoardWriter(tmp_path)  # an attempt that got to 200 env steps, no checkpoint
    for iteration, steps in enumerate((100, 200), start=1):
        lost.write(metrics.IterationRow(iteration, steps, 1, 1.0, 1.0, 1.0, 1.0, 1.0), {})
    lost.close()
    StoredRun(tmp_path, str(tmp_path)).begin(resumed=False)
    again = TensorBoardWriter(tmp_path)  # as the driver makes it for a run not resumed
    again.write(metrics.IterationRow(1, 100, 1, 1.0, 1.0, 2.0, 1.0, 1.0), {})
    again.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("uerl/episode_return_mean")] == [(100, 2.0)]


# ---- a store that does not answer, at the start and at the end (issue 54, 4 and 5) ---

STORE_DOWN = "AWS Error SERVICE_UNAVAILABLE during HeadBucket operation: 503 Service Unavailable"


def down_for(bucket: FakeBucket, requests: int) -> None:
    """The store answers 503 to the next `requests` requests (-1: to every one)."""
    left = [requests]

    def fail(path: str) -> None:
        if left[0] != 0:
            left[0] -= 1
            raise OSError(STORE_DOWN)

    bucket.on_request = fail


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # raising=False: the constants are the fix's (the test fails, not errors, without it).
    monkeypatch.setattr(bucket_store, "STORE_RETRY_S", 0.01, raising=False)
    monkeypatch.setattr(bucket_store, "STORE_WAIT_S", 0.2, raising=False)
    monkeypatch.setattr(bucket_mirror, "RETRY_FIRST_S", 0.01)


def bucket_endpoints(tmp_path: Path) -> Path:
    path = tmp_path / "endpoints.json"
    runs = RunStorage(uri="s3://b/p")
    path.write_text(Topology().endpoints().model_copy(update={"runs": runs}).model_dump_json())
    return path


@pytest.mark.usefixtures("quick_retries")
def test_a_store_down_for_a_moment_at_the_start_is_waited_for(
    bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bucket_store, "STORE_WAIT_S", guard(60))  # tries, not time, judged
    down_for(bucket, 3)
    bucket_store.check(LOCATION, RUN)
    assert [k for k in bucket.objects if "write-check" in k] == []


@pytest.mark.usefixtures("quick_retries")
def test_a_restore_waits_for_a_store_down_for_a_moment(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bucket_store, "STORE_WAIT_S", guard(60))  # tries, not time, judged
    checkpoints.save(SavingAlgo(), tmp_path / "run" / "checkpoints", meta(5))
    store(tmp_path / "run")
    down_for(bucket, 2)
    assert restore(LOCATION, RUN, tmp_path / "again", print)
    assert checkpoints.resolve("latest", tmp_path / "again" / "checkpoints").name.endswith("5")


@pytest.mark.usefixtures("quick_retries")
def test_a_store_down_past_the_wait_is_unavailable_not_misconfigured(bucket: FakeBucket) -> None:
    down_for(bucket, -1)
    with pytest.raises(Exception, match=r"^runs\.s3\.endpoint|^endpoints runs") as raised:
        bucket_store.check(LOCATION, RUN)
    assert type(raised.value).__name__ == "RunStorageUnavailable"
    assert "no answer for 0 s" in str(raised.value)


@pytest.mark.usefixtures("quick_retries")
def test_train_exits_1_when_the_store_does_not_answer_at_the_start(
    tmp_path: Path, bucket: FakeBucket, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.commands import train

    down_for(bucket, -1)
    code = train.main(["--endpoints", str(bucket_endpoints(tmp_path)), "--run-name", RUN])
    assert code == 1, capsys.readouterr().err


@pytest.mark.usefixtures("quick_retries")
def test_runs_list_exits_1_when_the_bucket_does_not_answer(
    tmp_path: Path, bucket: FakeBucket, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.commands.runs import main as runs_main

    down_for(bucket, -1)
    assert runs_main(["list", "--endpoints", str(bucket_endpoints(tmp_path))]) == 1
    assert "503" in capsys.readouterr().err


def test_runs_list_exits_2_naming_the_field_when_the_bucket_does_not_exist(
    tmp_path: Path, bucket: FakeBucket, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.commands.runs import main as runs_main

    def no_bucket(path: str) -> None:
        raise OSError("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation")

    bucket.on_request = no_bucket
    assert runs_main(["list", "--endpoints", str(bucket_endpoints(tmp_path))]) == 2
    assert "runs.s3.bucket" in capsys.readouterr().err


def test_the_final_store_gives_up_within_the_grace_ray_gives_a_stopped_job(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.topology import JOB_STOP_GRACE_S

    down_for(bucket, -1)
    (tmp_path / "metrics.csv").write_text("iteration\n")
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print)
    waited: list[float | None] = []
    join = mirror._thread.join
    monkeypatch.setattr(mirror._thread, "join", lambda timeout=None: [waited.append(timeout)])
    assert not mirror.close()
    join(1.0)
    # The final checkpoint, the artefacts and Ray's shutdown come before it in the grace.
    assert waited and waited[0] is not None and waited[0] <= JOB_STOP_GRACE_S / 2


@pytest.mark.usefixtures("quick_retries")
def test_a_mirror_round_failing_with_any_error_is_said_at_once_and_retried(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    failures = [RuntimeError("a bug in a round")]

    def fail_once(path: str) -> None:
        if failures and path == key("metrics.csv"):
            raise failures.pop()

    bucket.on_request = fail_once
    (tmp_path / "metrics.csv").write_text("iteration\n")
    lines: list[str] = []
    mirror = Mirror(LOCATION, RUN, tmp_path, log=lines.append)
    mirror.sync()
    assert mirror.wait_idle(10)
    assert any("RuntimeError: a bug in a round" in line for line in lines), lines
    assert mirror.close(timeout_s=10)
    assert bucket.text(key("metrics.csv")) == "iteration\n"


class _StoreNotTaken:
    """A mirror whose final upload failed."""

    def close(self) -> bool:
        return False

    def sync(self) -> None:
        pass


def test_a_run_its_store_did_not_take_whole_does_not_end_succeeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.commands import train
    from training.run import outcome

    def opened(*args: object, **kwargs: object) -> StoredRun:
        return StoredRun(tmp_path / RUN, "s3://b/p/r", mirror=_StoreNotTaken())  # type: ignore[arg-type]

    monkeypatch.setattr(train, "open_stored_run", opened)
    monkeypatch.setattr(outcome, "train_and_report", lambda *args, **kwargs: 0)
    assert train.main(["--endpoints", str(bucket_endpoints(tmp_path)), "--run-name", RUN]) == 1


def test_a_file_that_only_grows_is_uploaded_at_most_once_a_minute_and_whole_at_close(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    # S3 has no append: each upload of a log sends it whole, so a log growing every
    # iteration would cost its whole size every round.
    now = [0.0]
    uploaded: list[float] = []
    bucket.on_upload = lambda stored: uploaded.append(now[0]) if stored == key("log.txt") else None
    log = tmp_path / "log.txt"
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print, clock=lambda: now[0])
    for second in range(0, 200, 10):  # a round every 10 s, the log longer each time
        now[0] = float(second)
        with log.open("a") as fh:
            fh.write(f"iter {second}\n")
        mirror.sync()
        assert mirror.wait_idle(30)
    assert uploaded == [0.0, 60.0, 120.0, 180.0]
    assert mirror.close(timeout_s=30)
    assert len(uploaded) == 5 and bucket.text(key("log.txt")) == log.read_text()


def test_a_file_rewritten_otherwise_is_uploaded_at_the_next_round(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    now = [0.0]
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print, clock=lambda: now[0])
    for text in ("a longer first text\n", "shorter\n"):  # not grown: not an append
        (tmp_path / "notes.txt").write_text(text)
        mirror.sync()
        assert mirror.wait_idle(30)
        assert bucket.text(key("notes.txt")) == text
    assert mirror.close(timeout_s=30)


def test_a_round_storing_a_checkpoint_stores_the_grown_files_with_it(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    # A run resumed from that checkpoint must find its metrics up to it in the bucket.
    now = [0.0]
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print, clock=lambda: now[0])
    for iteration in (1, 2):
        now[0] = float(iteration)
        rows = "".join(f"{i}\n" for i in range(1, iteration + 1))
        (tmp_path / "metrics.csv").write_text("iteration\n" + rows)
        checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(iteration))
        mirror.sync()
        assert mirror.wait_idle(30)
    assert bucket.text(key("metrics.csv")) == "iteration\n1\n2\n"
    assert mirror.close(timeout_s=30)


def test_the_attempts_record_is_stored_at_every_round(tmp_path: Path, bucket: FakeBucket) -> None:
    # A supervisor started on a new head numbers its attempts from the stored record.
    now = [0.0]
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print, clock=lambda: now[0])
    for attempt in (1, 2):
        now[0] = float(attempt)
        attempts.record(tmp_path, attempt, "r", resumed_from=None, iteration=None)
        mirror.sync()
        assert mirror.wait_idle(30)
    assert len((bucket.text(key("attempts.jsonl")) or "").splitlines()) == 2
    assert mirror.close(timeout_s=30)


def test_a_claim_that_does_not_answer_is_worth_retrying_not_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_answering(path: object) -> object:
        raise OSError(5, "Input/output error")  # a network volume's server gone

    monkeypatch.setattr("shutil.disk_usage", not_answering)
    with pytest.raises(Exception, match=r"^endpoints runs\.uri .*does not answer") as raised:
        check_room(tmp_path)
    assert type(raised.value).__name__ == "RunStorageUnavailable"


def test_train_exits_1_when_the_claims_mount_does_not_answer_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As a bucket that does not answer (exit 1, retried by a supervisor). Before: the
    # mount's EIO out of `is_dir()` ended `uerl train` in a traceback.
    from training.commands import train

    claim = tmp_path / "claim"
    is_dir = Path.is_dir

    def lost_server(self: Path) -> bool:
        if self == claim:
            raise OSError(5, "Input/output error")
        return is_dir(self)

    monkeypatch.setattr(Path, "is_dir", lost_server)
    endpoints = tmp_path / "endpoints.json"
    runs = RunStorage(uri=f"file://{claim}")
    endpoints.write_text(Topology().endpoints().model_copy(update={"runs": runs}).to_json())
    assert train.main(["--endpoints", str(endpoints), "--run-name", RUN]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"uerl train: endpoints runs.uri (topology runs): {claim} does not answer"
    )


def test_a_start_that_fails_leaves_nothing_of_a_new_run_in_the_bucket(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the start's Ray log was stored, so `uerl runs list` showed run r, and
    # `--run-name r` again was refused ("holds a run already").
    from training.commands import train
    from training.run import outcome

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the staging directory's root

    def fails_at_preflight(endpoints: object, options: Any, *, store: Any, **kwargs: object) -> int:
        log = options.run_dir / "logs" / "ray.log"
        log.parent.mkdir(parents=True)
        log.write_text("connecting\n")
        store()  # as the driver does on its way out
        deadline = time.monotonic() + 30
        while key("logs/ray.log") not in bucket.objects and time.monotonic() < deadline:
            time.sleep(0.05)
        assert key("logs/ray.log") in bucket.objects  # stored, as it was before the fix
        return 1

    monkeypatch.setattr(outcome, "train_and_report", fails_at_preflight)
    assert train.main(["--endpoints", str(bucket_endpoints(tmp_path)), "--run-name", RUN]) == 1
    assert [k for k in bucket.objects if k.startswith(f"b/p/{RUN}/")] == []
    assert not (tmp_path / "uerl-runs" / RUN).exists()


# ---- the store's lag, as the driver publishes it ------------------------------------


def test_a_bucket_holds_the_run_up_to_its_last_rounds_start_and_not_while_down(
    tmp_path: Path, bucket: FakeBucket, quick_retries: None
) -> None:
    (tmp_path / "metrics.csv").write_text("iteration\n1\n")
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print)
    assert mirror.stored_through is None  # nothing stored yet
    before = time.time()
    mirror.sync()
    assert mirror.wait_idle(30)
    first = mirror.stored_through
    assert first is not None and before <= first <= time.time()
    down_for(bucket, -1)
    (tmp_path / "game_events.jsonl").write_text("{}\n")  # new: a grown file may wait
    mirror.sync()
    time.sleep(0.3)  # rounds fail and retry meanwhile
    assert mirror.stored_through == first  # the lag grows while the store is down
    down_for(bucket, 0)
    mirror.sync()
    deadline = time.monotonic() + 30
    while mirror.stored_through == first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mirror.stored_through is not None and mirror.stored_through > first
    assert mirror.close(timeout_s=30)


def test_a_heads_stale_staging_is_cleared_and_the_buckets_run_resumed(
    tmp_path: Path, bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 63, item 12. Before: an earlier attempt's staging on the same head (its
    # container restarted in place keeps /tmp) was uploaded again, and its local `latest`,
    # which the bucket never had, resumed.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = open_stored_run(
        Topology().endpoints().model_copy(update={"runs": RunStorage(uri="s3://b/p")}),
        RUN, resume=None, log=print,
    )  # fmt: skip
    checkpoints.save(SavingAlgo(), first.run_dir / "checkpoints", meta(2))
    first.sync()
    assert first.close()
    staging = tmp_path / "uerl-runs" / RUN
    checkpoints.save(SavingAlgo(), staging / "checkpoints", meta(9))  # never uploaded
    lines: list[str] = []
    again = open_stored_run(
        Topology().endpoints().model_copy(update={"runs": RunStorage(uri="s3://b/p")}),
        RUN, resume="auto", log=lines.append,
    )  # fmt: skip
    try:
        assert (again.run_dir / "checkpoints" / "latest").read_text() == "checkpoint_000002"
        assert not (again.run_dir / "checkpoints" / "checkpoint_000009").exists()
        assert any("an earlier attempt on this head left" in line for line in lines), lines
    finally:
        again.close()
    assert key("checkpoints/checkpoint_000009/uerl.json") not in bucket.objects


def test_a_write_check_an_earlier_start_left_is_deleted_by_the_next(bucket: FakeBucket) -> None:
    # Issue 63, item 14. Before: a store gone between the check's write and its delete
    # left the key for good (one per start that met an outage).
    bucket.objects[key(".partial-0badc0de-write-check")] = b"uerl"
    bucket.objects[key("metrics.csv")] = b"iteration\n1\n"
    bucket_store.check(LOCATION, RUN, log=print)
    assert sorted(bucket.objects) == [key("metrics.csv")]


def test_a_key_pruned_while_it_is_restored_is_an_outage_to_retry_not_bad_input(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    # Issue 63, item 16. Before: pyarrow's FileNotFoundError for the vanished key (an
    # errno) was taken for this machine's disk: RunStorageError, exit status 2.
    checkpoints.save(TwoFileAlgo(), tmp_path / "run" / "checkpoints", meta(4))
    store(tmp_path / "run")
    gone = key("checkpoints/checkpoint_000004/b.pkl")

    def pruned_meanwhile(path: str) -> None:
        if path == key("checkpoints/checkpoint_000004/a.pkl"):
            bucket.objects.pop(gone, None)  # another writer's retention, mid-restore

    bucket.on_request = pruned_meanwhile
    with pytest.raises(RunStorageUnavailable, match="checkpoint_000004 was deleted while"):
        restore(LOCATION, RUN, tmp_path / "again", print)
    assert not (tmp_path / "again" / "checkpoints" / "latest").exists()


def test_a_store_back_from_an_outage_keeps_the_newest_checkpoints_until_newer_replace_them(
    tmp_path: Path, bucket: FakeBucket, quick_retries: None
) -> None:
    # CI, stop 69 (the bucket schedule, seed 260689278): the store killed and back, the
    # mirror's first round deleted what retention had removed meanwhile before it stored
    # the checkpoints saved in the outage; the bucket's `latest` (2) had lost the one
    # before it, though both were among the newest 2.
    keep = 2
    mirror = Mirror(LOCATION, RUN, tmp_path, log=print, keep_checkpoints=keep)
    stored = StoredRun(tmp_path, "s3://b/p/r", mirror, keep_checkpoints=keep)
    for iteration in (1, 2):
        checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(iteration))
        stored.sync()
        assert mirror.wait_idle(guard(30))
    assert bucket.text(key("checkpoints/latest")) == "checkpoint_000002"
    down_for(bucket, -1)
    for iteration in (3, 4):  # saved while the store is down; retention removes 1 and 2
        checkpoints.save(SavingAlgo(), tmp_path / "checkpoints", meta(iteration))
        stored.sync()
    assert listing_here(tmp_path) == {"checkpoint_000003", "checkpoint_000004"}
    ever_whole: set[str] = set()
    broken: list[str] = []
    checked = [0]

    def newest_kept(path: str) -> None:  # before each request the store answers
        checked[0] += 1
        whole = {k.split("/")[4] for k in bucket.objects if k.endswith("/uerl.json")}
        ever_whole.update(whole)
        named = bucket.text(key("checkpoints/latest"))
        upto = sorted(name for name in ever_whole if named and name <= named)[-keep:]
        broken.extend(f"latest {named}: {name} gone" for name in upto if name not in whole)

    bucket.on_request = newest_kept  # the store is back
    stored.sync()
    assert mirror.wait_idle(guard(30))
    assert stored.close()
    newest_kept("")
    assert checked[0] > 5  # the rounds after the outage were watched
    assert broken == []
    assert bucket.text(key("checkpoints/latest")) == "checkpoint_000004"
    assert ever_whole - {"checkpoint_000001", "checkpoint_000002"} == {
        "checkpoint_000003",
        "checkpoint_000004",
    }
    assert key("checkpoints/checkpoint_000001/uerl.json") not in bucket.objects  # then they go
    assert key("checkpoints/checkpoint_000002/uerl.json") not in bucket.objects


def listing_here(run_dir: Path) -> set[str]:
    return {p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir()}
