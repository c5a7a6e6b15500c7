"""The runs in the stack's bucket (endpoints `runs.uri` s3://...), read from this
machine with its own credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or a
profile: pyarrow's S3 client reads them as every AWS client does)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from infra.endpoints import RunStorage
from training.runs.follow import POINTER, RunState, StoredFile, Take
from training.runs.transfer import Progress
from training.runstore.bucket import S3Location, failure
from training.runstore.bucket_restore import latest_whole, local_targets
from training.runstore.listing import (
    CHECKPOINTS,
    LATEST,
    LEASE,
    META,
    RunSummary,
    held_lease,
    hidden,
    is_lease,
    lease_generation,
    lease_name,
    read_checkpoint_meta,
    wanted,
)
from training.runstore.location import RunStorageError
from training.runstore.run_files import read_text

CHUNK = 1 << 20


def _say(line: str) -> None:
    print(line, file=sys.stderr)


class BucketRuns:
    def __init__(self, runs: RunStorage, log: Callable[[str], None] = _say) -> None:
        self.location = S3Location.of(runs)
        self.log = log  # what a pull has to say besides its progress

    @property
    def where(self) -> str:
        return self.location.uri()

    def _fs(self) -> Any:
        return self.location.filesystem()

    def _read(self, s3: Any, *parts: str) -> str | None:
        return read_text(s3, self.location.key(*parts))

    def _lease(self, s3: Any, name: str) -> str | None:
        """The run's lease as a reader takes it (listing.held_lease): its newest
        generation's text, None once released or when there is none."""
        from pyarrow import fs

        selector = fs.FileSelector(self.location.key(name, LEASE), allow_not_found=True)
        generations = [
            generation
            for info in s3.get_file_info(selector)
            if (generation := lease_generation(f"{LEASE}/{info.base_name}")) is not None
        ]
        if not generations:
            return None
        newest = max(generations)
        return held_lease({newest: self._read(s3, name, lease_name(newest))})

    def _files(self, s3: Any, name: str) -> Iterator[tuple[str, Any]]:
        from pyarrow import fs

        root = self.location.key(name)
        for info in s3.get_file_info(fs.FileSelector(root, recursive=True)):
            if info.type == fs.FileType.File:
                relative = info.path[len(root) + 1 :]
                if not hidden(relative):
                    yield relative, info

    def list(self) -> list[RunSummary]:
        from pyarrow import fs

        try:
            s3 = self._fs()
            if s3.get_file_info(self.location.bucket).type == fs.FileType.NotFound:
                where = self.location.endpoint or "AWS S3"
                raise RunStorageError(
                    f"runs.s3.bucket: bucket {self.location.bucket!r} does not exist at {where}"
                )
            entries = s3.get_file_info(fs.FileSelector(self.location.key(), allow_not_found=True))
            runs = []
            for entry in entries:
                name = entry.base_name
                if entry.type != fs.FileType.Directory or name.startswith("."):
                    continue
                runs.append(self._summary(s3, name))
        except OSError as exc:
            raise failure(exc, self.location) from None
        return sorted(runs, key=lambda run: (run.updated, run.name))

    def _summary(self, s3: Any, name: str) -> RunSummary:
        named = self._read(s3, name, CHECKPOINTS, LATEST) or None
        files = dict(self._files(s3, name))
        sizes = {relative: info.size or 0 for relative, info in files.items()}
        # The checkpoint a pull takes (quietly: a pull says it).
        latest = latest_whole(s3, self.location, name, named, sizes, lambda line: None)
        iteration = env_steps = None
        if latest is not None:
            meta = self._read(s3, name, CHECKPOINTS, latest, META)
            if meta is not None:
                iteration, env_steps = read_checkpoint_meta(meta)
        updated, size = 0.0, 0
        for info in files.values():
            size += info.size or 0
            if info.mtime is not None:
                updated = max(updated, info.mtime.timestamp())
        return RunSummary(name, latest, iteration, env_steps, updated, size)

    def pull(self, name: str, into: Path, *, latest_only: bool, total: int | None) -> float:
        """Run `name` copied into the directory `into`; the seconds it took. The
        pointer `checkpoints/latest` is read first and written last: as it was read, or
        naming the newest checkpoint the bucket holds whole if it does not hold that one
        (said); a key that would land outside `into` refuses the pull."""
        progress = Progress(f"pulling {name}", total)
        try:
            s3 = self._fs()
            named = self._read(s3, name, CHECKPOINTS, LATEST) or None
            files = dict(self._files(s3, name))
            sizes = {relative: info.size or 0 for relative, info in files.items()}
            latest = latest_whole(s3, self.location, name, named, sizes, self.log)
            targets = local_targets(self.location, name, files, into)
            pointer = f"{CHECKPOINTS}/{LATEST}"
            pruned: list[str] = []
            for relative in files:
                if relative == pointer or not wanted(relative, latest, latest_only=latest_only):
                    continue
                target = targets[relative]
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    key = self.location.key(name, relative)
                    with s3.open_input_stream(key) as source, target.open("wb") as out:
                        while chunk := source.read(CHUNK):
                            out.write(chunk)
                            progress.add(len(chunk))
                except FileNotFoundError:  # pruned since it was listed
                    pruned.append(relative)
                    continue
        except OSError as exc:
            if exc.errno is not None:  # this machine's disk (full, not writable): the caller's
                raise
            raise failure(exc, self.location) from None
        if latest is not None and any(r.startswith(f"{CHECKPOINTS}/{latest}/") for r in pruned):
            # Retention removed it while it was copied: `latest` names no checkpoint the
            # copy holds whole, so the copy gets none (said).
            self.log(
                f"{name}: {latest} was deleted by the run's retention while it was pulled; "
                "the copy has no checkpoints/latest (pull again for the newest)"
            )
            latest = None
        if latest is not None:
            (into / pointer).write_text(latest)
        return progress.finish()

    # ---- `uerl runs pull --follow` ------------------------------------------------------

    def state(self, name: str) -> RunState:
        """Run `name` as the bucket lists it; its lease read first (a run's end deletes
        it after storing its last files: read absent, the files listed are the last)."""
        try:
            s3 = self._fs()
            lease = self._lease(s3, name)
            latest = self._read(s3, name, CHECKPOINTS, LATEST) or None
            files = {
                relative: StoredFile(
                    info.size or 0, None if info.mtime is None else info.mtime.timestamp()
                )
                for relative, info in self._files(s3, name)
                if not is_lease(relative)
            }
        except OSError as exc:
            raise failure(exc, self.location) from None
        if not files and lease is None:
            raise RunStorageError(f"RUN {name!r}: no such run in {self.where}")
        return RunState(lease, latest, files)

    def fetch(self, name: str, files: dict[str, StoredFile], take: Take) -> None:
        try:
            s3 = self._fs()
            for relative in sorted(files, key=lambda r: (r == POINTER, r)):
                try:
                    with s3.open_input_stream(self.location.key(name, relative)) as source:
                        take(relative, files[relative].mtime, source)
                except FileNotFoundError:  # pruned since it was listed
                    continue
        except OSError as exc:
            if exc.errno is not None:  # this machine's disk: the caller's
                raise
            raise failure(exc, self.location) from None
