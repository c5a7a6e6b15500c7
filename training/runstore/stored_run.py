"""Opening a run in the stack's run storage (endpoints `runs`) before it starts: checked
(there, writable, room or a bucket that takes the credentials), leased to this writer
(training.runstore.lease), and, to resume from a bucket, brought back to this machine
first; while it goes on, old checkpoints deleted (training.runstore.retention) and low
space said."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infra.endpoints import Endpoints
from training.runstore import atomic, attempts, events, retention
from training.runstore.bucket import S3Location, check, failure, patiently
from training.runstore.bucket_mirror import Mirror
from training.runstore.bucket_restore import restore, stored_checkpoints, stored_files
from training.runstore.lease import FileLease, Lease, ObjectLease
from training.runstore.listing import CHECKPOINTS, LATEST, LEASE, hidden, is_lease
from training.runstore.location import (
    FIELD,
    RunStorageError,
    RunStorageUnavailable,
    check_room,
)

Log = Callable[[str], None]
# A run's volume with less free than this (or than this fraction of it) runs low.
LOW_FREE_BYTES = 1 * 2**30
LOW_FREE_FRACTION = 0.1
# TensorBoard's event files, which the run writes beside metrics.csv.
TENSORBOARD_EVENTS = "events.out.tfevents.*"


@dataclass
class StoredRun:
    """Where the run writes (`run_dir`), and for a bucket the mirror storing it there."""

    run_dir: Path
    where: str  # the run's place in the storage, as the user names it
    mirror: Mirror | None = None
    lease: Lease | None = None  # this writer's, while the run goes on
    keep_checkpoints: int | None = None  # endpoints runs.keep_checkpoints; None: all
    log: Log = print
    # The store held nothing of the run before this start: a start that fails before
    # the run records anything may take back what it wrote (`discard`).
    fresh: bool = False
    _running_low: bool = field(default=False, init=False, repr=False)  # said already
    _said_stored: str | None = field(default=None, init=False, repr=False)  # its event

    def sync(self) -> float | None:
        """After each iteration: checkpoints past retention deleted (here, and from a
        bucket by the mirror), the room left checked, and what changed stored (a bucket:
        in the background; a volume: it is there). Returns the time (Unix) up to which
        the store holds what the run wrote: now on a volume; a bucket's last round's
        start (None before its first)."""
        self.fence()
        if self.keep_checkpoints is not None:
            stored = self.mirror.stored_checkpoints() if self.mirror is not None else set()
            removed = retention.prune(self.run_dir, self.keep_checkpoints, stored)
            if self.mirror is not None and removed:
                self.mirror.remove(removed)
        self._check_room()
        if self.mirror is None:
            self._say_stored()
            return time.time()
        self.mirror.sync()
        return self.mirror.stored_through

    def _say_stored(self) -> None:
        """On a claim a checkpoint is stored once written: its event, once per `latest`."""
        try:
            named = (self.run_dir / CHECKPOINTS / LATEST).read_text().strip()
        except OSError:
            return
        if named and named != self._said_stored:
            self._said_stored = named
            self.log(events.checkpoint_stored(named))

    def fence(self) -> None:
        """LeaseLost (training.runstore.lease) once another writer holds the run: called
        before each write of the run. On a claim the store is read each time (a directory
        listing); a bucket run writes its staging here, and its mirror reads the store
        before it uploads or deletes."""
        if self.lease is not None:
            self.lease.check(store=self.mirror is None)

    def _check_room(self) -> None:
        """Says when the volume the run is written to runs low (once, until it has room
        again): a full one ends the run, and its next attempt would not start."""
        try:
            usage = shutil.disk_usage(self.run_dir)
        except OSError:
            return  # not made yet, or a volume not answering: the next write says so
        low = usage.free < max(LOW_FREE_BYTES, LOW_FREE_FRACTION * usage.total)
        if low and not self._running_low:
            keep = self.keep_checkpoints if self.keep_checkpoints is not None else "all"
            self.log(
                f"run storage: {self.run_dir} has {usage.free / 2**20:.0f} MiB free of "
                f"{usage.total / 2**30:.1f} GiB: free space, keep fewer checkpoints "
                f"(runs.keep_checkpoints, now {keep}) or give the volume more, before it "
                "is full and the run stops"
            )
        self._running_low = low

    def close(self, code: int | None = None) -> bool:
        """The attempt's end (its exit status `code`, when known): its last files stored,
        its lease released. True when the store holds the whole run, written by this
        writer alone."""
        stored = self.mirror.close() if self.mirror is not None else True
        if self.lease is not None:
            self.lease.release(ended=code, supervised=attempts.from_environment() is not None)
            stored = stored and self.lease.lost is None
        return stored

    def discard(self) -> None:
        """Ends a fresh run whose start failed before it recorded anything: what the
        start wrote (its logs) is removed, from the bucket too, while the lease is held;
        then the lease is deleted and the directory removed, so no run is listed under
        the name and the name can be given again."""
        assert self.fresh, "only a run this start began"
        if self.lease is not None and self.lease.lost is not None:
            return  # another writer's run now: what is there is its
        if self.mirror is not None:
            self.mirror.abandon()
        for entry in list(self.run_dir.iterdir()) if self.run_dir.is_dir() else []:
            if entry.name == LEASE:
                continue  # the claim's lease: released below, if still this writer's
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        if self.lease is not None:
            self.lease.discard()
        with contextlib.suppress(OSError):  # a bucket run's staging has none
            (self.run_dir / LEASE).rmdir()
        with contextlib.suppress(OSError):  # not empty: another writer took the name since
            self.run_dir.rmdir()

    def begin(self, *, resumed: bool) -> None:
        """Before the run's first iteration. Not resumed from a checkpoint, it plots its
        steps from the first again: an earlier attempt's curves (a head lost before the
        first checkpoint) are hidden by a purge from step 1, as a resumed run's writer
        hides those past its checkpoint."""
        if not resumed and any(self.run_dir.glob(TENSORBOARD_EVENTS)):
            from tensorboardX import SummaryWriter

            # Named as the driver's writer names its files (the second, the host, then
            # this suffix), so TensorBoard reads it after the earlier attempt's and
            # before this one's.
            SummaryWriter(
                logdir=str(self.run_dir), purge_step=1, filename_suffix=f".{time.time_ns()}"
            ).close()


def staging_root() -> Path:
    """Where a run bound for a bucket is written first: the Ray head's /tmp volume."""
    return Path(tempfile.gettempdir()) / "uerl-runs"


def open_stored_run(
    endpoints: Endpoints, run_name: str, *, resume: str | None, log: Log
) -> StoredRun:
    """The run `run_name` in the endpoints' run storage, checked and leased to this
    writer; a RunStorageError naming the field at fault when it cannot take the run
    (a new run, `resume` None, under a name a stored run has: refused), and
    RunStorageUnavailable when the store does not answer or another writer holds the
    run. `resume` (--resume): from a bucket, the stored run is brought back first
    (`auto`: if there is one)."""
    runs = endpoints.runs
    if runs is None:
        raise RunStorageError(f"{FIELD}: these endpoints name no run storage")
    if runs.uri.startswith("file://"):
        root = Path(runs.uri.removeprefix("file://"))
        check_room(root)
        run_dir = root / run_name
        held = _holds_a_run(run_dir)
        if resume is None and held:
            _refuse_used_name(run_name, str(run_dir))
        lease = Lease(FileLease(run_dir), f"--run-name {run_name}", log)
        _take(lease, run_dir, resume=resume)
        return StoredRun(
            run_dir,
            str(run_dir),
            lease=lease,
            keep_checkpoints=runs.keep_checkpoints,
            log=log,
            fresh=not held,
        )
    location = S3Location.of(runs)
    check(location, run_name, log)
    s3 = location.filesystem()
    try:
        stored = patiently(
            location, "reading the run", lambda: stored_files(s3, location, run_name), log, None
        )
    except OSError as exc:
        raise failure(exc, location) from None
    if resume is None and any(not is_lease(relative) for relative in stored):
        _refuse_used_name(run_name, location.uri(run_name))
    local = staging_root() / run_name
    lease = Lease(
        ObjectLease(s3, location.key(run_name), location.put_if_absent),
        f"--run-name {run_name}",
        log,
    )
    _take(lease, local, resume=resume)
    _clear_staging(local, log)
    try:
        restored = resume is not None and restore(location, run_name, local, log)
        if resume not in (None, "auto") and not restored:
            raise RunStorageError(
                f"--resume: {location.uri(run_name)} holds no checkpoint (no "
                "checkpoints/latest); give the --run-name of a stored run"
            )
    except BaseException:
        lease.release()
        raise
    # What an earlier attempt stored: retention goes on from there.
    mirror = Mirror(
        location,
        run_name,
        local,
        log,
        stored_checkpoints=stored_checkpoints(stored),
        keep_checkpoints=runs.keep_checkpoints,
        fence=lease.check,
    )
    return StoredRun(
        local,
        location.uri(run_name),
        mirror,
        lease=lease,
        keep_checkpoints=runs.keep_checkpoints,
        log=log,
        fresh=all(is_lease(relative) for relative in stored),
    )


def _clear_staging(local: Path, log: Log) -> None:
    """A bucket run's staging on this head, emptied before the run is brought back: what
    an earlier attempt left there (a head container restarted in place keeps its /tmp)
    may be what the bucket never took, or a `latest` it never had; the bucket, written
    under the run's lease, is the run. Said when it held files."""
    if not local.is_dir():
        return
    left = [path for path in local.rglob("*") if path.is_file()]
    shutil.rmtree(local, ignore_errors=True)
    if left:
        log(
            f"run storage: {local} held {len(left)} file(s) an earlier attempt on this head "
            "left (not all stored, perhaps); removed: the bucket's copy of the run is the one "
            "resumed"
        )


def _holds_a_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds what a run wrote (not only a lease or a partial write)."""
    if not run_dir.is_dir():
        return False
    return any(
        path.is_file() and not hidden(rel) and not is_lease(rel)
        for path in run_dir.rglob("*")
        for rel in [path.relative_to(run_dir).as_posix()]
    )


def _refuse_used_name(run_name: str, where: str) -> None:
    raise RunStorageError(
        f"--run-name {run_name}: {where} holds a run already; --resume auto continues it "
        "(one writer at a time), or give the new run another --run-name"
    )


def _take(lease: Lease, run_dir: Path, *, resume: str | None) -> None:
    """The run's lease, then what dead writers left half written (none is left now)."""
    try:
        lease.take(wait=resume is not None)
    except OSError as exc:  # the store, reached a moment ago, went away
        raise RunStorageUnavailable(f"{FIELD}: taking the run's lease: {exc}") from None
    for directory in (run_dir, run_dir / CHECKPOINTS):
        atomic.remove_leftovers(directory, every_writer=True)
    lease.keep_renewed()
