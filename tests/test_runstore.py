"""The run storage's local guarantees (training/runstore): files and checkpoints are whole
or absent, a run's name and place are checked before it starts, and a bucket's mirror
uploads each checkpoint before the pointer to it. The bucket itself is tested against a
real object store in tests/k8s/test_run_storage.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_fakes import SavingAlgo, meta

from infra.endpoints import RunStorage
from infra.topology import Topology
from training.run import checkpoints, metrics
from training.runstore import atomic
from training.runstore.location import RunStorageError, check_room, check_run_name
from training.runstore.s3_store import Mirror, S3Location
from training.runstore.stored_run import open_stored_run


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
    (tmp_path / f"{atomic.PARTIAL_PREFIX}checkpoint_000010").mkdir(parents=True)
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
