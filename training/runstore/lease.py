"""One writer per run, fenced. A run's leases are files of generations in the run
(`lease/000000007.json`, training.runstore.listing.lease_name): the writer that created
the highest generation holds the run, and that number is its fencing token.

- Taking the run is creating the next generation, exclusively: on a claim a hard link
  of a whole file (refused when the name exists, on a local volume and on NFS alike); in
  a bucket a PUT with `If-None-Match: *` (S3, SeaweedFS, MinIO: refused, 412, when the
  key exists). Two writers starting in the same instant cannot both create it.
- Liveness is never judged by comparing two machines' clocks: the holder rewrites its
  own generation's file every RENEW_S with a beat counter, and a writer that wants the
  run watches that file on its own monotonic clock; unchanged for the TTL, the holder is
  taken for dead and the next generation created. A clock ahead or behind changes
  nothing; the wall time in the file is for people.
- The fence: every write of the run is checked against the token. The renewal thread
  reads the generations every RENEW_S; a writer that finds a higher one has lost the run
  and no write of it goes on (`check`: the mirror's uploads and deletes, the checkpoint's
  save and `latest`, retention, metrics), its attempt ends with exit status 1
  (LeaseLost), and if it does not end by itself within one more RENEW_S the process is
  ended (`os._exit(1)`). Writes that commit (a `latest`, a retention delete, a mirror
  round) read the generations from the store right before they act.

What is left: a writer paused between that read and its write (a moment, not a
renewal period) can make that one write after it lost the run. A store without
conditional PUTs (an old MinIO or Ceph) refuses the lease's creation with a clear error.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from training.runstore import atomic
from training.runstore.listing import LEASE, lease_generation, lease_name
from training.runstore.location import RunStorageError, RunStorageUnavailable

# A holder renews every RENEW_S; a lease not renewed for TTL_S (as a watcher's own clock
# measures it) is its holder's no more.
TTL_S = 60.0
RENEW_S = 15.0
# How often a writer waiting for the run reads the holder's lease (its beat).
WATCH_S = 2.0
# What link(2) says on a volume without hard links (SMB-backed claims, some FUSE ones).
NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})

Log = Callable[[str], None]


class LeaseLost(RuntimeError):
    """This writer's lease was taken by another: nothing more of the run is written, and
    the attempt ends (exit status 1)."""


class LeaseRecord(BaseModel):
    """What one generation's lease file holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    holder: str  # the writer (atomic.WRITER of its process, then the lease's own)
    host: str
    generation: int
    beat: int  # renewals so far: a watcher sees it change while the holder lives
    renewed_at: float  # the holder's wall clock, for people only
    ttl_s: float
    released: bool = False  # the attempt's end: the next writer takes it at once
    # With `released`: the attempt's exit status, and whether a supervisor runs the run
    # (uerl supervise: a failed attempt is followed by another, so the run goes on).
    ended: int | None = None
    supervised: bool = False

    def age_s(self, now: float) -> float:
        """By the holder's clock against `now`: a hint for refusing at once, never for
        taking over."""
        return now - self.renewed_at


class LeaseStore(Protocol):
    """A run's lease files, by generation."""

    where: str

    def generations(self) -> list[int]: ...
    def read(self, generation: int) -> str | None: ...
    def create(self, generation: int, text: str) -> bool: ...  # False: it exists
    def rewrite(self, generation: int, text: str) -> None: ...  # this writer's own
    def delete(self, generation: int) -> None: ...


class FileLease:
    """The leases as files in the run's directory on the claim."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir / LEASE
        self.where = str(self.dir)

    def _path(self, generation: int) -> Path:
        return self.dir.parent / lease_name(generation)

    def generations(self) -> list[int]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found = (lease_generation(f"{LEASE}/{name}") for name in names)
        return sorted(g for g in found if g is not None)

    def read(self, generation: int) -> str | None:
        try:
            return self._path(generation).read_text()
        except FileNotFoundError:
            return None

    def create(self, generation: int, text: str) -> bool:
        # A whole file linked into place: link(2) refuses an existing name atomically,
        # NFS included (the classic lock file), and a reader never sees a part of it.
        path = self._path(generation)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = atomic.partial_name(path, secrets.token_hex(2) + "-")
        try:
            with tmp.open("w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError as exc:
                if exc.errno not in NO_HARD_LINKS:
                    raise
                return self._create_exclusively(path, text)  # a volume without hard links
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _create_exclusively(path: Path, text: str) -> bool:
        """O_CREAT|O_EXCL, also exclusive (NFSv3 and later): a reader may see the file
        empty for a moment, which it watches as a lease it cannot read yet."""
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def rewrite(self, generation: int, text: str) -> None:
        atomic.write_text(self._path(generation), text)

    def delete(self, generation: int) -> None:
        self._path(generation).unlink(missing_ok=True)


class ObjectLease:
    """The leases as objects of the run in a bucket: read, listed and rewritten through
    pyarrow's filesystem `s3`; created with a conditional PUT (`put_if_absent`)."""

    def __init__(self, s3: Any, run_key: str, put_if_absent: Callable[[str, bytes], bool]) -> None:
        self.s3, self.run_key, self._put_if_absent = s3, run_key, put_if_absent
        self.where = f"s3://{run_key}/{LEASE}/"

    def _key(self, generation: int) -> str:
        return f"{self.run_key}/{lease_name(generation)}"

    def generations(self) -> list[int]:
        from pyarrow import fs

        selector = fs.FileSelector(f"{self.run_key}/{LEASE}", allow_not_found=True)
        found = (
            lease_generation(info.path[len(self.run_key) + 1 :])
            for info in self.s3.get_file_info(selector)
            if info.type == fs.FileType.File
        )
        return sorted(g for g in found if g is not None)

    def read(self, generation: int) -> str | None:
        try:
            with self.s3.open_input_stream(self._key(generation)) as stream:
                return str(stream.read().decode())
        except FileNotFoundError:
            return None

    def create(self, generation: int, text: str) -> bool:
        return self._put_if_absent(self._key(generation), text.encode())

    def rewrite(self, generation: int, text: str) -> None:
        with self.s3.open_output_stream(self._key(generation)) as out:
            out.write(text.encode())

    def delete(self, generation: int) -> None:
        self.s3.delete_file(self._key(generation))


def _parse(text: str | None) -> LeaseRecord | None:
    if text is None:
        return None
    try:
        return LeaseRecord.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None  # unreadable (a lease of an older uerl, or damage): watched as is


class Lease:
    """The run's lease, for this process (`atomic.WRITER`)."""

    def __init__(self, store: LeaseStore, run_flag: str, log: Log) -> None:
        self.store = store
        self.run_flag = run_flag  # how the user named the run: `--run-name NAME`
        self.log = log
        # The process's writer id (its partial names carry it), and this lease's own:
        # two runs opened in one process are two writers.
        self.holder = f"{atomic.WRITER}-{secrets.token_hex(2)}"
        self.generation: int | None = None  # the fencing token, once taken
        self.lost: str | None = None  # why the lease is not this writer's any more
        # How the process ends when it goes on after losing the run (tests replace it).
        self.end_process: Callable[[int], None] = os._exit
        self._beat = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- taking the run -----------------------------------------------------------

    def take(self, *, wait: bool) -> LeaseRecord | None:
        """The run, now this writer's (the next generation, created); the lease of the
        writer it took over from, if any. Held by a writer that renews it:
        RunStorageUnavailable (exit status 1: it is free once that writer ends). Without
        `wait` a holder whose lease looks renewed within its TTL is refused at once; one
        that looks stale, and with `wait` (a supervisor's next attempt comes soon after a
        head is lost) any, is watched until it has not renewed for its TTL."""
        generations = self.store.generations()
        top = max(generations, default=0)
        text = self.store.read(top) if top else None
        current = _parse(text)
        previous: LeaseRecord | None = None
        if top and text is not None and not (current is not None and current.released):
            if not wait and current is not None and current.age_s(time.time()) < current.ttl_s:
                self._refuse(current)
            self._watch_out(top, text, current)
            previous = current
        if previous is not None:
            self.log(
                f"run storage: taking over the run from writer {previous.holder} on "
                f"{previous.host}, whose lease ({self.store.where}, generation "
                f"{previous.generation}) was not renewed for {previous.ttl_s:g} s"
            )
        self.generation = top + 1
        try:
            created = self.store.create(self.generation, self._record().model_dump_json())
        except NotImplementedError as exc:
            raise RunStorageError(f"{self.run_flag}: {exc}") from None
        if not created:
            raise RunStorageUnavailable(
                f"{self.run_flag}: another writer took the run's lease ({self.store.where}, "
                f"generation {self.generation}) at the same moment; try again"
            )
        for older in generations:  # the run's one writer now: the rest is history
            with contextlib.suppress(OSError):
                self.store.delete(older)
        return previous

    def _watch_out(self, generation: int, text: str, held: LeaseRecord | None) -> None:
        """Until the lease of `generation` (its `text`) has stayed as it is for its TTL,
        by this machine's monotonic clock; refused when its holder renews it meanwhile or
        another writer takes the run."""
        ttl = held.ttl_s if held is not None else TTL_S
        since = time.monotonic()
        while time.monotonic() - since < ttl:
            time.sleep(min(WATCH_S, RENEW_S, max(ttl - (time.monotonic() - since), 0.0)) + 0.01)
            if max(self.store.generations(), default=0) > generation:
                again = _parse(self.store.read(max(self.store.generations())))
                self._refuse(again or held)
            now = self.store.read(generation)
            if now is None:
                return  # gone (its run discarded): nobody's
            if now != text:
                self._refuse(_parse(now) or held)  # renewed: its writer is alive

    def _refuse(self, held: LeaseRecord | None) -> NoReturn:
        who = f"writer {held.holder} on {held.host}" if held is not None else "another writer"
        raise RunStorageUnavailable(
            f"{self.run_flag}: the run is being written by {who} (its lease "
            f"{self.store.where}, which runs out {TTL_S:g} s after its writer stops "
            "renewing it); one writer at a time: try again once it ends"
        )

    def _record(
        self, *, released: bool = False, ended: int | None = None, supervised: bool = False
    ) -> LeaseRecord:
        assert self.generation is not None
        return LeaseRecord(
            holder=self.holder,
            host=socket.gethostname(),
            generation=self.generation,
            beat=self._beat,
            renewed_at=time.time(),
            ttl_s=TTL_S,
            released=released,
            ended=ended,
            supervised=supervised,
        )

    # ---- the fence -----------------------------------------------------------------

    def check(self, *, store: bool = True) -> None:
        """LeaseLost unless the run is still this writer's: known lost (the renewals
        saw it), or with `store`, a higher generation in the store now. A store that
        does not answer raises its OSError (the write would fail as well)."""
        if self.lost is not None:
            raise LeaseLost(self.lost)
        if store:
            newest = max(self.store.generations(), default=0)
            if self.generation is None or newest > self.generation:
                self._lose(newest)
                raise LeaseLost(self.lost or "")

    def _lose(self, newest: int) -> None:
        if self.lost is not None:
            return
        taker = _parse(self.store.read(newest)) if newest else None
        who = f"writer {taker.holder} on {taker.host}" if taker is not None else "another writer"
        self.lost = (
            f"{self.run_flag}: {who} took the run's lease ({self.store.where}, generation "
            f"{newest} after this writer's {self.generation}): this writer stops writing "
            "the run and ends"
        )
        self.log(f"run storage: {self.lost}")

    # ---- renewing --------------------------------------------------------------------

    def keep_renewed(self) -> None:
        """Renew the lease every RENEW_S on a thread, until `release()`."""
        self._thread = threading.Thread(target=self._renew, name="uerl-run-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        failing = False
        while not self._stop.wait(RENEW_S):
            try:
                self.check()
                self._beat += 1
                self.store.rewrite(self.generation or 0, self._record().model_dump_json())
                if failing:
                    self.log(f"run storage: the lease ({self.store.where}) is renewed again")
                failing = False
            except LeaseLost:
                # Nothing more is written (every write checks); the attempt ends by itself
                # at its next write, or here if it has not within one more period.
                if not self._stop.wait(RENEW_S):
                    self.log(f"run storage: {self.lost}: ending the process (exit status 1)")
                    self.end_process(1)
                return
            except Exception as exc:  # a store down for a while: said, tried again
                if not failing:
                    self.log(
                        f"run storage: cannot renew the lease ({self.store.where}): {exc}; "
                        f"another writer may take the run after {TTL_S:g} s"
                    )
                failing = True

    def _stopped_and_still_held(self) -> bool:
        """Stop renewing; whether the run was this writer's until then."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(RENEW_S)
        return self.lost is None and self.generation is not None

    def release(self, *, ended: int | None = None, supervised: bool = False) -> None:
        """Stop renewing; if the run is still this writer's, its lease says released
        (kept: the generations only grow, so a long-paused writer of an older one is
        fenced whoever comes next), with the attempt's exit status `ended` and whether a
        supervisor carries the run on (a reader follows a supervised run past a failed
        attempt)."""
        if not self._stopped_and_still_held():
            return
        try:
            self.check()
            record = self._record(released=True, ended=ended, supervised=supervised)
            self.store.rewrite(self.generation, record.model_dump_json())
        except LeaseLost:
            return
        except OSError as exc:  # it runs out by itself
            self.log(f"run storage: the lease ({self.store.where}) was not released: {exc}")

    def discard(self) -> None:
        """Stop renewing, and delete the lease if the run is still this writer's: a run
        whose start failed before it recorded anything leaves no trace (StoredRun.discard)."""
        if not self._stopped_and_still_held():
            return
        try:
            self.check()
            self.store.delete(self.generation)
        except (LeaseLost, OSError):
            return
