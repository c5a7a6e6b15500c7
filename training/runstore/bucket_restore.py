"""A run read back out of its bucket: the files it holds (no partial writes), the
checkpoint to take (`latest` when the bucket holds it whole, else the newest it does,
said), each key's place under a local directory (none outside it), and `restore`,
which brings a run back to resume it. `uerl runs` reads the same way
(training.runs.bucket_reader)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from training.runstore import atomic
from training.runstore.bucket import S3Location, failure, patiently
from training.runstore.listing import (
    CHECKPOINTS,
    LATEST,
    META,
    hidden,
    wanted,
    whole_checkpoint,
    within,
)
from training.runstore.location import FIELD, RunStorageError, RunStorageUnavailable
from training.runstore.run_files import read_text

Log = Callable[[str], None]


def stored_checkpoints(files: Collection[str]) -> set[str]:
    """The checkpoints stored whole among a run's `files` (`stored_files`)."""
    return {relative.split("/")[1] for relative in files if is_meta(relative)}


def is_meta(relative: str) -> bool:
    """`checkpoints/<name>/uerl.json`: a checkpoint stored whole."""
    parts = relative.split("/")
    return len(parts) == 3 and parts[0] == CHECKPOINTS and parts[2] == META


def stored_files(s3: Any, location: S3Location, run_name: str) -> dict[str, int]:
    """Every file the bucket holds of the run (its path in the run: the key below
    `<prefix>/<run name>/`, as stored) with its size; no partial writes."""
    from pyarrow import fs

    root = location.key(run_name)
    selector = fs.FileSelector(root, recursive=True, allow_not_found=True)
    return {
        info.path[len(root) + 1 :]: info.size or 0
        for info in s3.get_file_info(selector)
        if info.type == fs.FileType.File and not hidden(info.path[len(root) + 1 :])
    }


def local_targets(
    location: S3Location, run_name: str, files: Collection[str], local: Path
) -> dict[str, Path]:
    """Each stored file's place under `local`; a RunStorageError naming the first key
    that would be written outside it (nothing is written then)."""
    targets = {}
    for relative in files:
        target = within(local, relative)
        if target is None:
            raise RunStorageError(
                f"s3://{location.key(run_name)}/{relative}: the key leads outside the run's "
                f"directory {local}; refused, nothing copied (delete the key)"
            )
        targets[relative] = target
    return targets


def latest_whole(
    s3: Any,
    location: S3Location,
    run_name: str,
    named: str | None,
    files: Collection[str],
    log: Log,
) -> str | None:
    """The checkpoint to take of the run: `named` (what `checkpoints/latest` says) when
    the bucket holds it whole, else the newest it does, saying so."""
    latest = whole_checkpoint(named, files, lambda rel: read_text(s3, location.key(run_name, rel)))
    if named is not None and latest != named:
        instead = f"taking {latest}, the newest whole one" if latest else "it holds no whole one"
        log(
            f"run storage: {location.uri(run_name)}: checkpoints/latest names {named}, which "
            f"it does not hold whole (its {META} missing or unreadable); {instead}"
        )
    return latest


def restore(
    location: S3Location, run_name: str, local: Path, log: Log, wait_s: float | None = None
) -> bool:
    """A stored run back into `local` to resume it: everything but the checkpoints other
    than the one it resumes from (`latest_whole`). False when the store holds no whole
    checkpoint of the run; what else it holds (the attempts' record, logs, curves) comes
    back all the same, for the run starting over to add to, not overwrite. A store that
    does not answer is waited for up to `wait_s` (`patiently`)."""
    s3 = location.filesystem()

    def read() -> tuple[str | None, dict[str, int], str | None]:
        # The pointer first: the checkpoint it names was stored before it, so the listing
        # taken after it holds that checkpoint.
        named = read_text(s3, location.key(run_name, CHECKPOINTS, LATEST)) or None
        files = stored_files(s3, location, run_name)
        return named, files, latest_whole(s3, location, run_name, named, files, log)

    try:
        _, files, latest = patiently(location, "reading the run", read, log, wait_s)
    except OSError as exc:
        raise failure(exc, location) from None
    targets = local_targets(location, run_name, files, local)
    pointer = f"{CHECKPOINTS}/{LATEST}"
    taken = [
        relative
        for relative in files
        if relative != pointer and wanted(relative, latest, latest_only=True)
    ]
    if not taken:
        return False
    from pyarrow import fs

    vanished: list[str] = []

    def copy() -> None:
        for relative in taken:
            targets[relative].parent.mkdir(parents=True, exist_ok=True)
            try:
                fs.copy_files(
                    location.key(run_name, relative), str(targets[relative]), source_filesystem=s3
                )
            except FileNotFoundError:
                if s3.get_file_info(location.key(run_name, relative)).type != fs.FileType.NotFound:
                    raise  # the key is there: this machine's side
                vanished.append(relative)  # the store's key, gone since it was listed

    try:
        patiently(location, "restoring the run", copy, log, wait_s)
    except OSError as exc:
        if exc.errno is not None:  # this machine's disk, not the store
            raise RunStorageError(f"{FIELD}: restoring into {local}: {exc}") from None
        raise failure(exc, location) from None
    if latest is not None and any(r.startswith(f"{CHECKPOINTS}/{latest}/") for r in vanished):
        raise RunStorageUnavailable(
            f"{FIELD}: {location.uri(run_name)}: {latest} was deleted while it was restored "
            "(another writer's retention?); try again"
        )
    if latest is not None:  # last, as the run wrote it: it names a checkpoint now here
        atomic.write_text(local / pointer, latest)
    size = sum(files[relative] for relative in taken)
    resumes = f"checkpoint {latest}" if latest else "no checkpoint yet: the run starts over"
    log(
        f"run storage: restored {location.uri(run_name)} ({len(taken)} files, "
        f"{size / 2**20:.1f} MiB; {resumes})"
    )
    return latest is not None
