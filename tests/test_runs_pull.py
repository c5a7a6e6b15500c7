"""`uerl runs`: a stack's stored runs listed and pulled to this machine.

The claim's side runs for real here: `uerl runs list|pack --dir` in a subprocess, read
through the same exec pump the cluster's websocket feeds (`FakeExec` gives the channels
kubernetes.stream gives). The bucket's side runs against SeaweedFS in
tests/k8s/test_run_storage.py, and the whole flow on real pods in tests/k8s/test_pods_e2e.py.
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import fake_bucket
import pytest
from fake_bucket import FakeBucket
from host_speed import guard
from run_fakes import SavingAlgo, meta

from infra.endpoints import RunStorage
from infra.topology import Topology
from training.commands.runs import main as runs_main
from training.commands.runs import table
from training.run import checkpoints
from training.runs.bucket_reader import BucketRuns
from training.runs.claim_reader import LOST, ClaimRuns, exit_code
from training.runs.transfer import Progress, into_place
from training.runstore import listing
from training.runstore.bucket import S3Location
from training.runstore.bucket_mirror import Mirror
from training.runstore.location import RunStorageError
from training.submit.head import HeadFinder

ROOT = Path(__file__).resolve().parent.parent


def make_run(root: Path, name: str, iterations: int) -> Path:
    """A run as `uerl train` leaves it: checkpoints, metrics, events, a TensorBoard file."""
    run = root / name
    for iteration in range(1, iterations + 1):
        checkpoints.save(SavingAlgo(size=1000), run / "checkpoints", meta(iteration))
    (run / "metrics.csv").write_text("iteration,return\n1,0.5\n2,0.7\n")
    (run / "events.jsonl").write_text('{"event": "start"}\n')
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\x00" * 64)
    return run


def files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


class FakeExec:
    """An exec's response as kubernetes.stream gives it (binary channels, the status on
    channel 3 at the end), of `uerl ...` run here as a subprocess."""

    def __init__(self, command: list[str]) -> None:
        assert command[0] == "uerl"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "training.cli", *command[1:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        self.channels: dict[int, bytes] = {}
        self.open = True

    def is_open(self) -> bool:
        return self.open

    def update(self, timeout: float = 0) -> None:
        out, err = self.proc.communicate()  # all at once: the pump sees it in chunks below
        code = self.proc.returncode
        self.channels[1] = out
        self.channels[2] = err
        status = (
            {"status": "Success"}
            if code == 0
            else {
                "status": "Failure",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        )
        self.channels[3] = json.dumps(status).encode()
        self.open = False

    def read_channel(self, channel: int, timeout: float = 0) -> bytes:
        return self.channels.pop(channel, b"")

    def close(self) -> None:
        self.open = False


HEAD_POD = {
    "metadata": {"name": "uerl-head-x"},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def claim_runs(root: Path) -> tuple[ClaimRuns, list[tuple[str, list[str]]]]:
    endpoints = Topology().endpoints()
    runs = endpoints.runs
    assert runs is not None
    endpoints = endpoints.model_copy(
        update={"runs": runs.model_copy(update={"uri": f"file://{root}"})}
    )
    calls: list[tuple[str, list[str]]] = []

    def exec_(pod: str, command: list[str]) -> FakeExec:
        calls.append((pod, command))
        return FakeExec(command)

    finder = HeadFinder(endpoints, lambda namespace, selector: [HEAD_POD])
    return ClaimRuns(endpoints, finder, exec_), calls


def test_list_dir_gives_each_runs_latest_checkpoint_iteration_and_size(tmp_path: Path) -> None:
    make_run(tmp_path, "a", 2)
    (tmp_path / "empty").mkdir()
    runs = {run.name: run for run in listing.list_runs(tmp_path)}
    assert set(runs) == {"a", "empty"}
    assert (runs["a"].checkpoint, runs["a"].iteration, runs["a"].env_steps) == (
        "checkpoint_000002",
        2,
        200,
    )
    assert runs["a"].size == sum(len(b) for b in files(tmp_path / "a").values())
    assert (runs["empty"].checkpoint, runs["empty"].iteration) == (None, None)


def test_a_checkpoint_being_written_is_neither_listed_nor_packed(tmp_path: Path) -> None:
    run = make_run(tmp_path, "a", 1)
    # What a save cut short by a lost pod leaves (training.runstore.atomic).
    partial = run / "checkpoints" / ".partial-checkpoint_000002"
    partial.mkdir()
    (partial / "module_state.pkl").write_bytes(b"half")
    latest, planned = listing.plan(tmp_path, "a", latest_only=False)
    assert latest == "checkpoint_000001"
    assert not [name for name, _ in planned if ".partial-" in name]
    assert listing.list_runs(tmp_path)[0].size == sum(size for _, size in planned) + len(latest)


def test_pack_latest_takes_the_latest_checkpoint_and_everything_but_checkpoints(
    tmp_path: Path,
) -> None:
    make_run(tmp_path, "a", 3)
    latest, planned = listing.plan(tmp_path, "a", latest_only=True)
    names = {name for name, _ in planned}
    taken = {name.split("/")[1] for name in names if name.startswith("checkpoints/")}
    assert latest == "checkpoint_000003" and taken == {latest}
    assert {"metrics.csv", "events.jsonl", "tensorboard/events.out.tfevents.1"} <= names


def test_pack_names_the_checkpoint_it_planned_even_if_a_newer_one_lands_meanwhile(
    tmp_path: Path,
) -> None:
    make_run(tmp_path, "a", 1)
    latest, planned = listing.plan(tmp_path, "a", latest_only=True)
    checkpoints.save(SavingAlgo(), tmp_path / "a" / "checkpoints", meta(2))  # the run goes on
    out = io.BytesIO()
    listing.pack(tmp_path, "a", latest, planned, out)
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r:") as tar:
        pointer = tar.extractfile("a/checkpoints/latest")
        assert pointer is not None and pointer.read() == b"checkpoint_000001"
        assert not [m for m in tar.getnames() if "checkpoint_000002" in m]


def test_a_claims_run_pulled_through_the_head_is_the_run_file_for_file(tmp_path: Path) -> None:
    source = make_run(tmp_path / "claim", "r1", 2)
    reader, calls = claim_runs(tmp_path / "claim")
    into_place(
        tmp_path / "pulled",
        "r1",
        replace=False,
        fill=lambda into: reader.pull("r1", into, latest_only=False, total=None),
    )
    assert files(tmp_path / "pulled" / "r1") == files(source)
    assert calls[0] == (
        "uerl-head-x",
        ["uerl", "runs", "pack", "r1", "--dir", str(tmp_path / "claim")],
    )
    resolved = checkpoints.resolve("latest", tmp_path / "pulled" / "r1" / "checkpoints")
    assert checkpoints.read_meta(resolved).iteration == 2


def test_a_claims_runs_are_listed_through_the_head(tmp_path: Path) -> None:
    make_run(tmp_path, "a", 1)
    reader, _ = claim_runs(tmp_path)
    [run] = reader.list()
    assert (run.name, run.iteration) == ("a", 1)
    assert reader.where == f"file://{tmp_path} (the runs claim, on the Ray head pod uerl-head-x)"


def test_pulling_a_run_the_claim_lacks_fails_with_the_heads_reason_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "claim").mkdir()
    reader, _ = claim_runs(tmp_path / "claim")
    with pytest.raises(RunStorageError, match=r"no run 'gone' in .*claim") as raised:
        into_place(
            tmp_path / "pulled",
            "gone",
            replace=False,
            fill=lambda into: reader.pull("gone", into, latest_only=False, total=None),
        )
    assert "uerl-head-x" in str(raised.value)
    assert list((tmp_path / "pulled").iterdir()) == []


def test_an_earlier_pull_is_kept_unless_replace_is_given(tmp_path: Path) -> None:
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "mine.onnx").write_text("exported")
    with pytest.raises(RunStorageError, match=r"^--to: .*r1 exists .*--replace"):
        into_place(tmp_path, "r1", replace=False, fill=lambda into: None)
    assert (tmp_path / "r1" / "mine.onnx").read_text() == "exported"


def test_a_pull_that_fails_half_way_leaves_the_earlier_copy(tmp_path: Path) -> None:
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "metrics.csv").write_text("old")

    def fail(into: Path) -> None:
        (into / "metrics.csv").write_text("half")
        raise RunStorageError("the store went away")

    with pytest.raises(RunStorageError):
        into_place(tmp_path, "r1", replace=True, fill=fail)
    assert files(tmp_path) == {"r1/metrics.csv": b"old"}


def test_progress_says_how_far_a_long_pull_is_and_its_total_time() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress("pulling r1", 4 * 2**20, stream=out, clock=lambda: now[0])
    progress.add(2**20)  # under PROGRESS_EVERY_S: no line yet
    now[0] = 3.0
    progress.add(2**20)
    now[0] = 4.0
    progress.finish()
    assert out.getvalue().splitlines() == [
        "pulling r1: 2.0 MiB / 4.0 MiB (50%)",
        "pulling r1: 2.0 MiB in 4.0 s",
    ]


def test_the_exec_status_gives_the_commands_exit_code() -> None:
    assert exit_code(b'{"status": "Success"}') == 0
    failure = {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "2"}]}}
    assert exit_code(json.dumps(failure).encode()) == 2
    # The runtime could not start the command at all (no `uerl` in the image).
    assert exit_code(b'{"status": "Failure", "message": "executable file not found"}') == 126
    assert exit_code(b"") == LOST  # the connection ended first


def test_list_prints_a_table_and_json_of_a_directorys_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path, "a", 2)
    assert runs_main(["list", "--dir", str(tmp_path), "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)
    assert (run["name"], run["checkpoint"], run["iteration"]) == ("a", "checkpoint_000002", 2)
    assert runs_main(["list", "--dir", str(tmp_path)]) == 0
    shown = capsys.readouterr()
    header, row = shown.out.splitlines()
    assert header.split()[:3] == ["run", "checkpoint", "iteration"]
    assert row.split()[:3] == ["a", "checkpoint_000002", "2"]
    assert shown.err.strip() == f"1 run(s) in {tmp_path}"


def test_pull_refuses_endpoints_without_run_storage_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoints = Topology().endpoints().model_copy(update={"runs": None})
    path = tmp_path / "endpoints.json"
    path.write_text(endpoints.model_dump_json())
    assert runs_main(["pull", "r1", "--endpoints", str(path)]) == 2
    assert "the endpoints name no run storage (`runs`)" in capsys.readouterr().err


def test_pull_refuses_a_run_name_that_is_not_one_path_segment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(Topology().endpoints().model_dump_json())
    with pytest.raises(SystemExit) as exited:  # the type `uerl train --run-name` has
        runs_main(["pull", "../etc", "--endpoints", str(path)])
    assert exited.value.code == 2
    assert "error: argument RUN: '../etc': a run name is 1 to 100 " in capsys.readouterr().err


def test_table_aligns_numbers_right(tmp_path: Path) -> None:
    run = listing.RunSummary("long-run-name", "checkpoint_000010", 10, 12345, 0.0, 2**20)
    lines = table([run]).splitlines()
    assert lines[1].endswith("1.0 MiB") and "12345" in lines[1]


# ---- a bucket's runs (in memory, tests/fake_bucket.py) --------------------------------


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> FakeBucket:
    return fake_bucket.install(monkeypatch)


def bucket_runs(tmp_path: Path, lines: list[str]) -> BucketRuns:
    """Run `r1` (checkpoints 1 and 2) stored in the bucket, and its reader."""
    mirror = Mirror(S3Location("b", "p", None, None), "r1", make_run(tmp_path, "r1", 2), print)
    mirror.sync()
    assert mirror.close(timeout_s=30)
    return BucketRuns(RunStorage(uri="s3://b/p"), log=lines.append)


def test_a_checkpoint_pruned_while_it_is_pulled_is_not_named_by_the_copys_latest(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    # Issue 63, item 15. Before: the pull wrote `latest` naming a checkpoint whose files
    # the run's retention deleted while they were copied: a copy that does not load.
    lines: list[str] = []
    reader = bucket_runs(tmp_path, lines)
    latest = bucket.text("b/p/r1/checkpoints/latest")
    first = next(k for k in sorted(bucket.objects) if k.startswith(f"b/p/r1/checkpoints/{latest}/"))

    def retention_meanwhile(path: str) -> None:
        if path == first:
            for k in [k for k in bucket.objects if k.startswith(f"b/p/r1/checkpoints/{latest}/")]:
                if k != first:
                    del bucket.objects[k]

    bucket.on_request = retention_meanwhile
    into = tmp_path / "copy" / "r1"
    reader.pull("r1", into, latest_only=False, total=None)
    assert not (into / "checkpoints" / "latest").exists()
    assert any(f"{latest} was deleted by the run's retention while" in line for line in lines)


def test_a_buckets_pull_falls_back_to_the_newest_whole_checkpoint_saying_so(
    tmp_path: Path, bucket: FakeBucket
) -> None:
    lines: list[str] = []
    reader = bucket_runs(tmp_path, lines)
    # A lost head's last round: a pointer to 3, of which only a part was stored.
    bucket.objects["b/p/r1/checkpoints/checkpoint_000003/module_state.pkl"] = b"part"
    bucket.objects["b/p/r1/checkpoints/latest"] = b"checkpoint_000003"
    into = tmp_path / "pulled"
    into.mkdir()
    reader.pull("r1", into, latest_only=True, total=None)
    assert sorted(p.name for p in (into / "checkpoints").iterdir()) == [
        "checkpoint_000002",
        "latest",
    ]
    assert checkpoints.read_meta(checkpoints.resolve("latest", into / "checkpoints")).iteration == 2
    assert any("checkpoint_000003" in line and "checkpoint_000002" in line for line in lines)


@pytest.mark.parametrize("hostile", ["../escaped.txt", "{tmp}/escaped.txt"])
def test_a_buckets_pull_refuses_a_key_that_leads_outside_the_run(
    hostile: str, tmp_path: Path, bucket: FakeBucket
) -> None:
    reader = bucket_runs(tmp_path, [])
    relative = hostile.format(tmp=tmp_path / "pulled")  # "{tmp}/..." makes a key with `//`
    bucket.objects[f"b/p/r1/{relative}"] = b"planted"
    with pytest.raises(RunStorageError, match="leads outside") as refused:
        into_place(
            tmp_path / "pulled",
            "r1",
            replace=False,
            fill=lambda into: reader.pull("r1", into, latest_only=False, total=None),
        )
    assert relative in str(refused.value)
    assert list((tmp_path / "pulled").iterdir()) == []


# ---- where a pull lands, and what it reads: checked before the store is ------------------


@pytest.fixture
def claim_endpoints(tmp_path: Path) -> Path:
    """A stack's endpoints with a runs claim; no kubeconfig is set up, so a command that
    reached for the cluster would say that instead."""
    path = tmp_path / "endpoints.json"
    path.write_text(Topology().endpoints().model_dump_json())
    return path


def test_pull_to_a_file_is_refused_naming_it_before_the_store_is_read(
    tmp_path: Path, claim_endpoints: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the cluster was reached first, and a reachable one ended in a traceback
    # (FileExistsError from mkdir) after the listing.
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for to in (a_file, a_file / "runs"):
        assert runs_main(["pull", "r1", "--endpoints", str(claim_endpoints), "--to", str(to)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"uerl runs: --to {to}: {a_file} is not a directory"


def test_pull_to_a_directory_without_write_permission_is_refused_naming_it(
    tmp_path: Path, claim_endpoints: Path
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    argv = [sys.executable, "-m", "training.cli", "runs", "pull", "r1",
            "--endpoints", str(claim_endpoints), "--to", str(locked / "runs")]  # fmt: skip
    if os.geteuid() == 0:  # root writes anywhere: not without the capabilities that let it
        argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *argv]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=guard(180))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"uerl runs: --to {locked / 'runs'}: cannot write in {locked} (Permission denied)"
    )


@pytest.fixture
def stored_r1(tmp_path: Path, bucket: FakeBucket) -> Path:
    """Run r1 in the (fake) bucket, and endpoints naming that bucket."""
    bucket_runs(tmp_path / "source", [])
    path = tmp_path / "bucket-endpoints.json"
    endpoints = Topology().endpoints().model_copy(update={"runs": RunStorage(uri="s3://b/p")})
    path.write_text(endpoints.model_dump_json())
    return path


def test_pull_onto_a_full_disk_says_the_disk_is_full_and_what_the_run_needs(
    tmp_path: Path, stored_r1: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Before: "--to runs: 0.0 MiB free, the run is 0.0 MiB".
    from training.commands import writable

    usage = writable.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(writable.shutil, "disk_usage", lambda path: usage._replace(free=0))
    to = tmp_path / "pulled"
    assert runs_main(["pull", "r1", "--endpoints", str(stored_r1), "--to", str(to)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"uerl runs: --to {to}: not enough room: the disk it is on is full, and the run is "
    )
    assert err.endswith("pull only its latest checkpoint (--latest)")
    assert not to.exists()


def test_a_disk_that_fills_during_a_pull_is_one_line_naming_to_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the claim's pull ended in a traceback (OSError out of the tar extraction).
    import errno

    make_run(tmp_path / "claim", "r1", 2)
    reader, _ = claim_runs(tmp_path / "claim")
    monkeypatch.setattr("training.commands.runs._store", lambda args: reader)

    def full(self: tarfile.TarFile, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "extract", full)
    # No progress line: on a loaded host the pack's first bytes came after its 2 s, and
    # `pulling r1: 0.0 MiB` stood before the error (a line a slow pull rightly prints).
    monkeypatch.setattr("training.runs.transfer.PROGRESS_EVERY_S", math.inf)
    to = tmp_path / "pulled"
    assert runs_main(["pull", "r1", "--endpoints", "unused.json", "--to", str(to), "--latest"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"uerl runs: --to {to}: cannot write there: the disk it is on is full "
        "(No space left on device)"
    )
    assert list(to.iterdir()) == []


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_list_dir_of_a_missing_directory_or_a_file_is_an_error_not_no_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    # Before: "0 run(s) in DIR", exit 0, as if the storage were empty.
    where = tmp_path / "runs"
    if kind == "a file":
        where.write_text("")
    assert runs_main(["list", "--dir", str(where)]) == 2
    why = "no such directory" if kind == "missing" else "is not a directory"
    assert capsys.readouterr().err.strip() == f"uerl runs: --dir {where}: {why}"


def test_a_runs_claim_the_head_cannot_list_is_a_store_not_reached_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A head whose claim is not mounted where the endpoints say: as a bucket that does
    # not answer, exit 1. Before: "0 run(s)", exit 0.
    reader, _ = claim_runs(tmp_path / "not-mounted")
    monkeypatch.setattr("training.commands.runs._store", lambda args: reader)
    assert runs_main(["list", "--endpoints", "unused.json"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "uerl runs: listing the runs on the Ray head pod uerl-head-x: uerl runs: --dir "
        f"{tmp_path / 'not-mounted'}: no such directory"
    )
