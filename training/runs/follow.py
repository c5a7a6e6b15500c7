"""`uerl runs pull RUN --follow`: a local copy of a stored run kept in step with it while
it trains, so that `tensorboard --logdir` of the copy shows its curves as they grow.

Each poll reads what the store holds of the run (`RunState`: its files' sizes and times,
and its writer's lease), copies what is new or changed, and waits `interval_s`. A file
that grew by appending (TensorBoard's event files, the logs) is grown in place, so a
TensorBoard that has it open reads on; another change replaces it whole (renamed over
it). Nothing of the copy is ever deleted: a checkpoint the run's retention pruned, or a
file of the user's own, stays. The follow ends when the run has: its writer releases its
lease (`lease/`, training.runstore.lease) after storing its last files, so a poll that
finds it released copies those and ends; a supervised run's failed attempt releases it
too, and the follow waits for the supervisor's next attempt.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from training.runstore.atomic import PARTIAL_PREFIX
from training.runstore.lease import RENEW_S, TTL_S
from training.runstore.listing import (
    CHECKPOINTS,
    LATEST,
    next_attempt_awaited,
    wanted,
    within,
)
from training.runstore.location import RunStorageError, RunStorageUnavailable
from training.submit.submit_error import SubmitError

POINTER = f"{CHECKPOINTS}/{LATEST}"
DEFAULT_INTERVAL_S = 10.0
# Modification times as the store gives them (a tar's, a bucket's): equal within this.
MTIME_SLACK_S = 1e-3
# A lease unchanged this long (by this machine's clock): its writer stopped renewing it.
STALE_S = TTL_S + RENEW_S
# A supervised run's failed attempt: its next one is waited for this long (a supervisor
# waits as long for a head, then gives up).
NEXT_ATTEMPT_WAIT_S = 1800.0
CHUNK = 1 << 20


@dataclass(frozen=True)
class StoredFile:
    size: int
    mtime: float | None  # seconds since the epoch; None: the store does not say


@dataclass(frozen=True)
class RunState:
    """What the store holds of a run at one poll."""

    lease: str | None  # its writer's lease as stored; None: no writer, the run has ended
    latest: str | None  # the checkpoint `checkpoints/latest` names
    files: dict[str, StoredFile]  # relative path -> size and time (no lease, no partial)


# (relative path, modification time, the file's bytes) for each file a fetch brings.
Take = Callable[[str, float | None, IO[bytes]], None]


class FollowedStore(Protocol):
    """A run storage a follow polls (DirectoryRuns, ClaimRuns, BucketRuns)."""

    @property
    def where(self) -> str: ...

    def state(self, name: str) -> RunState:
        """RunStorageError when the store holds no run `name`."""
        ...

    def fetch(self, name: str, files: dict[str, StoredFile], take: Take) -> None:
        """Each of `files` (as `state` listed them) given to `take`, checkpoints/latest
        last; a file gone since it was listed is skipped."""
        ...


@dataclass
class FollowReport:
    started: float = field(default_factory=time.monotonic)
    polls: int = 0
    files: int = 0
    bytes: int = 0
    finished: bool = False  # the run ended (else: stopped by Ctrl-C)

    def seconds(self) -> float:
        return time.monotonic() - self.started


def changed(local_dir: Path, state: RunState, *, latest_only: bool) -> dict[str, StoredFile]:
    """The run's files the copy under `local_dir` lacks or holds another version of
    (size or time), checkpoints/latest last."""
    out: dict[str, StoredFile] = {}
    for relative in sorted(state.files, key=lambda r: (r == POINTER, r)):
        if not wanted(relative, state.latest, latest_only=latest_only):
            continue
        stored = state.files[relative]
        target = within(local_dir, relative)
        if target is None:
            raise RunStorageError(f"the run's file {relative!r} leads outside {local_dir}")
        try:
            stat = target.stat()
        except FileNotFoundError:
            out[relative] = stored
            continue
        moved = stored.mtime is not None and abs(stat.st_mtime - stored.mtime) > MTIME_SLACK_S
        if stat.st_size != stored.size or moved:
            out[relative] = stored
    return out


def _starts_with(new: Path, old: Path) -> bool:
    """Whether `new` holds `old`'s bytes then (perhaps) more: `old` grew by appending."""
    if new.stat().st_size < old.stat().st_size:
        return False
    with old.open("rb") as a, new.open("rb") as b:
        while chunk := a.read(CHUNK):
            if b.read(len(chunk)) != chunk:
                return False
    return True


def land(local_dir: Path, relative: str, mtime: float | None, source: IO[bytes]) -> int:
    """The run's file `relative` from `source` into the copy under `local_dir`; the
    bytes written. Grown in place when it only grew; else replaced whole (renamed over
    it: a reader never sees half of it). The partial file's name has no part of the
    file's (TensorBoard would read a `.partial-...tfevents...` file as events)."""
    target = within(local_dir, relative)
    if target is None:
        raise RunStorageError(f"the run's file {relative!r} leads outside {local_dir}")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=PARTIAL_PREFIX, dir=target.parent)
    partial = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                out.write(chunk)
        size = partial.stat().st_size
        if target.is_file() and _starts_with(partial, target):
            have = target.stat().st_size
            written = size - have
            with partial.open("rb") as new, target.open("ab") as grown:
                new.seek(have)
                while chunk := new.read(CHUNK):
                    grown.write(chunk)
        else:
            os.replace(partial, target)
            written = size
        if mtime is not None:
            os.utime(target, (mtime, mtime))
        return written
    finally:
        partial.unlink(missing_ok=True)


def follow(
    store: FollowedStore,
    name: str,
    local_dir: Path,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    latest_only: bool = False,
    log: Callable[[str], None] = print,
    report: FollowReport | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> FollowReport:
    """Keeps `local_dir` in step with run `name` until the run ends (`finished`) or
    Ctrl-C (KeyboardInterrupt, taken here: the report says how far it got). The first
    poll's failures are raised (no such run, a store not reached); later ones are said
    and the next poll tries again."""
    report = report if report is not None else FollowReport()
    local_dir.mkdir(parents=True, exist_ok=True)
    lease_seen: str | None = None
    lease_since = time.monotonic()
    said_stale = False
    failing: str | None = None
    try:
        while True:
            try:
                state = store.state(name)
                todo = changed(local_dir, state, latest_only=latest_only)
                if todo:
                    files, size = _fetch(store, name, todo, local_dir)
                    report.files += files
                    report.bytes += size
                    log(f"{name}: {files} file(s) updated ({size / 2**20:.1f} MiB)")
            except (RunStorageUnavailable, SubmitError, OSError) as exc:
                if report.polls == 0 or (isinstance(exc, OSError) and exc.errno is not None):
                    raise  # the first poll's, or this machine's disk (full, not writable)
                if failing != str(exc):
                    failing = str(exc)
                    again = f"trying again every {interval_s:g} s"
                    log(f"{name}: the store did not answer ({exc}); {again}")
                report.polls += 1
                sleep(interval_s)
                continue
            if failing is not None:
                failing = None
                log(f"{name}: the store answers again")
            report.polls += 1
            if state.lease is None:
                report.finished = True
                return report
            awaited = next_attempt_awaited(state.lease) and state.lease == lease_seen
            if awaited and time.monotonic() - lease_since > NEXT_ATTEMPT_WAIT_S:
                log(
                    f"{name}: its last attempt failed and no attempt followed in "
                    f"{NEXT_ATTEMPT_WAIT_S / 60:.0f} minutes (its supervisor gave up?); "
                    "the copy is as the run was stored"
                )
                report.finished = True
                return report
            if state.lease != lease_seen:
                lease_seen, lease_since, said_stale = state.lease, time.monotonic(), False
            elif not said_stale and time.monotonic() - lease_since > STALE_S:
                said_stale = True
                silent = time.monotonic() - lease_since
                log(
                    f"{name}: its writer has not renewed its lease for {silent:.0f} s (its "
                    "Ray head lost?); following on until the run ends (a supervisor's next "
                    "attempt resumes it), or Ctrl-C"
                )
            sleep(interval_s)
    except KeyboardInterrupt:
        return report


def _fetch(
    store: FollowedStore, name: str, todo: dict[str, StoredFile], local_dir: Path
) -> tuple[int, int]:
    done = [0, 0]

    def take(relative: str, mtime: float | None, source: IO[bytes]) -> None:
        if relative not in todo:
            return
        done[1] += land(local_dir, relative, mtime, source)
        done[0] += 1

    store.fetch(name, todo, take)
    return done[0], done[1]


def only_arguments(todo: dict[str, StoredFile], state: RunState) -> list[str]:
    """`todo` as `uerl runs pack --only` takes it: a checkpoint all of whose files are
    wanted as its directory (`checkpoints/NAME/`), so that the command stays short."""
    out: list[str] = []
    directories: dict[str, list[str]] = {}
    for relative in todo:
        parts = relative.split("/")
        if len(parts) > 2 and parts[0] == CHECKPOINTS:
            directories.setdefault(f"{parts[0]}/{parts[1]}/", []).append(relative)
        else:
            out.append(relative)
    for directory, members in directories.items():
        every = [r for r in state.files if r.startswith(directory)]
        if len(members) == len(every):
            out.append(directory)
        else:
            out.extend(members)
    return sorted(out, key=lambda r: (r == POINTER, r))
