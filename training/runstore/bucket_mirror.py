"""The mirror of a run into its bucket (`runs.store: s3`): the run is written to a local
directory as always, and mirrored to `s3://<bucket>/<prefix>/<run name>/` in the
background, so storing never holds up sampling.

What a reader of the bucket can rely on:
- a checkpoint's `uerl.json` is uploaded after every other file of it, and
  `checkpoints/latest` after the whole checkpoint it names, saying what it said when
  the round listed the files (the driver may save another meanwhile): `latest` (and a
  checkpoint with its `uerl.json`) is always whole;
- every other file is replaced whole (one PUT each), never seen half written.
  One that only grew (a log, `metrics.csv`, TensorBoard's events) is sent again at
  most once a minute (S3 has no append: each PUT is the whole file), and at the end.
Readers (`restore`, `uerl runs`) still check: a `latest` naming a checkpoint the bucket
does not hold whole (a bucket written otherwise) gives way to the newest it does, said;
a key that would be written outside the run's directory is refused.
While the store is unreachable the mirror retries with backoff and the training goes on;
what it could not upload yet goes at the next attempt.

pyarrow's S3 filesystem (the AWS SDK's client, which Ray brings) does the transfers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.contract import JOB_STOP_GRACE_S
from training.runstore import attempts, events
from training.runstore.atomic import PARTIAL_PREFIX
from training.runstore.bucket import S3Location, explain
from training.runstore.bucket_restore import is_meta, stored_checkpoints, stored_files
from training.runstore.lease import LeaseLost
from training.runstore.listing import CHECKPOINTS, LATEST, META, holds_whole
from training.runstore.retention import iteration_of
from training.runstore.run_files import read_text

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 15.0
CLOSING_ROUNDS = 3
# A file that only grew since its upload (a log, metrics.csv, TensorBoard's events) goes
# again at most this often: S3 has no append, so each upload sends it whole. A round
# storing a checkpoint, and close(), upload it whatever the time (a run resumed from that
# checkpoint finds its metrics up to it); the attempts' record goes every round (a
# supervisor on a new head numbers its attempts from it).
GROWN_EVERY_S = 60.0
# The last upload at a run's end, at most: Ray kills a stopped job JOB_STOP_GRACE_S after
# its SIGTERM, and the final checkpoint, the artefacts and Ray's shutdown come first.
CLOSE_TIMEOUT_S = JOB_STOP_GRACE_S / 2

Log = Callable[[str], None]


def _unfenced(*, store: bool = True) -> None:
    """No lease to check (a mirror of tests and benchmarks)."""


class Mirror:
    """Uploads what changed in `local` to `s3://.../<run name>/` on a background thread,
    whenever `sync()` asks and at `close()`."""

    def __init__(
        self,
        location: S3Location,
        run_name: str,
        local: Path,
        log: Log,
        *,
        clock: Callable[[], float] = time.monotonic,
        stored_checkpoints: set[str] | None = None,
        keep_checkpoints: int | None = None,
        fence: Callable[..., None] = _unfenced,
    ) -> None:
        self.location = location
        self.run_name = run_name
        self.local = local
        self.log = log
        self._clock = clock
        # The run's lease (training.runstore.lease.Lease.check): LeaseLost once another
        # writer holds the run; `store=True` reads the store's generations first.
        self._fence = fence
        self._uploaded: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime)
        self._uploaded_at: dict[str, float] = {}  # relative path -> when (clock)
        self._uploaded_pointer: str | None = None  # what the stored `latest` says
        # Pointers whose PUT failed without an answer: the stored `latest` may say one.
        self._pointer_maybe: set[str] = set()
        # Retention (training.runstore.retention): the checkpoints the bucket holds
        # (listed once, then kept up to date), and those retention removed, to delete.
        self._stored_checkpoints = stored_checkpoints  # None: listed at the first round
        self._listed = False
        self._removed: set[str] = set()
        # The newest this many whole checkpoints up to the stored `latest` stay, whatever
        # retention removed here (runs.keep_checkpoints; None: only the one it names).
        self._keep = keep_checkpoints
        self._retention_lock = threading.Lock()
        self._wanted = threading.Event()
        self._closing = threading.Event()
        self._abandoned = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._down_since: float | None = None
        self._s3: Any = None
        self.uploads = 0
        self.bytes = 0
        self.last_error: str | None = None
        self.stored_through: float | None = None  # Unix time; None: nothing yet
        self._thread = threading.Thread(target=self._run, name="uerl-run-mirror", daemon=True)
        self._thread.start()

    def sync(self) -> None:
        """Upload what changed (soon, on the mirror's thread)."""
        self._idle.clear()
        self._wanted.set()

    def close(self, timeout_s: float | None = None) -> bool:
        """A last upload of everything, for up to `timeout_s` (None: CLOSE_TIMEOUT_S);
        True when all of it is stored."""
        self.sync()
        self._closing.set()
        self._thread.join(CLOSE_TIMEOUT_S if timeout_s is None else timeout_s)
        pending = self.pending()
        if pending:
            why = self.last_error or "still changing at the end: " + ", ".join(pending[:3])
            self.log(
                f"run storage: {len(pending)} file(s) of {self.local} not stored in "
                f"{self.location.uri(self.run_name)} ({why}); they stay on this machine"
            )
        return not pending

    def abandon(self, timeout_s: float | None = None) -> None:
        """Stops without a last upload and deletes what it stored: a run whose start
        failed before it recorded anything leaves nothing in the bucket
        (StoredRun.discard). A delete that fails is said; the object stays."""
        self._abandoned.set()
        self._wanted.set()
        self._thread.join(CLOSE_TIMEOUT_S if timeout_s is None else timeout_s)
        if self._s3 is None:
            return  # nothing was uploaded
        try:
            self._fence(store=True)
        except (LeaseLost, OSError):
            return  # another writer's run now, or a store away: what it holds stays
        for relative in sorted(self._uploaded):
            try:
                self._s3.delete_file(self.location.key(self.run_name, relative))
            except OSError as exc:
                self.log(f"run storage: {self.location.uri(self.run_name, relative)} stays: {exc}")
        self._uploaded.clear()

    def wait_idle(self, timeout_s: float) -> bool:
        """Until what was asked is stored (tests, benchmarks)."""
        return self._idle.wait(timeout_s)

    def pending(self) -> list[str]:
        return [relative for relative, stamp in self._changed() if stamp is not None]

    def _run(self) -> None:
        try:
            self._rounds()
        except BaseException as exc:
            # Not a round's failure (those are retried): the thread itself ends, and
            # nothing more would be stored. Said at once; close() then reports it.
            self.last_error = f"the mirror stopped: {type(exc).__name__}: {exc}"
            self.log(f"run storage: {self.last_error}; nothing more is stored")
            self._idle.set()
            raise

    def _rounds(self) -> None:
        delay = RETRY_FIRST_S
        last_rounds = 0  # rounds since close(): files still changing get a few more
        while True:
            self._wanted.wait(timeout=None if not self._closing.is_set() else 0)
            self._wanted.clear()
            if self._abandoned.is_set():
                return
            started = time.time()
            try:
                self._upload_changed()
            except LeaseLost as exc:  # another writer's run now: not one more write
                self.last_error = f"the run's lease was lost: {exc}"
                self._idle.set()
                return
            except Exception as exc:
                # A store that does not answer, or any other failure of a round (a bug
                # here, a file the driver replaced mid-upload): said at once, retried as
                # an outage is. Also while closing: close()'s join timeout bounds it.
                self._went_down(exc)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                self._wanted.set()  # again, after the backoff
                continue
            delay = RETRY_FIRST_S
            # What the run had written when the round began is in the bucket now (a file
            # that keeps growing may lag by up to GROWN_EVERY_S).
            self.stored_through = started
            self._came_back()
            self._idle.set()
            if self._closing.is_set():
                # A file written while the round ran (Ray's log, flushed at shutdown)
                # goes in another round; a file that never stops changing, not forever.
                last_rounds += 1
                if not self.pending() or last_rounds >= CLOSING_ROUNDS:
                    return
                self._wanted.set()

    def _went_down(self, exc: Exception) -> None:
        if isinstance(exc, OSError):
            self.last_error = explain(exc, self.location)
        else:
            self.last_error = f"{type(exc).__name__}: {exc}"
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.log(
                f"run storage: cannot store in {self.location.uri(self.run_name)} "
                f"({self.last_error}); training goes on, retrying"
            )

    def _came_back(self) -> None:
        if self._down_since is not None:
            self.log(
                f"run storage: storing again after {time.monotonic() - self._down_since:.0f} s"
            )
            self._down_since = None

    def _changed(self) -> list[tuple[str, tuple[int, int] | None]]:
        """(relative path, its (size, mtime) or None if unchanged), in upload order:
        every file but each checkpoint's META, then the METAs, then `latest`."""
        return self._round()[1]

    def _round(self) -> tuple[str | None, list[tuple[str, tuple[int, int] | None]]]:
        """What `latest` says now, then `_changed()`'s list. The pointer is read before
        the files are listed, and stored as read: the checkpoint it names was whole on
        disk before, so this round's list holds it, whatever the driver saves while the
        round uploads (a pointer read later could name a checkpoint saved since)."""
        pointer = self.local / CHECKPOINTS / LATEST
        try:
            named: str | None = pointer.read_text().strip() or None
        except OSError:
            named = None
        files: list[tuple[int, str, tuple[int, int] | None]] = []
        for path in self.local.rglob("*"):
            relative = path.relative_to(self.local).as_posix()
            if not path.is_file() or any(p.startswith(PARTIAL_PREFIX) for p in path.parts):
                continue
            if path == pointer:
                # By what it says (a rewrite can keep its size and mtime), as read above.
                if named is not None and named != self._uploaded_pointer:
                    files.append((2, relative, (len(named), 0)))
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # replaced while listed; the next round has it
                continue
            stamp = (stat.st_size, stat.st_mtime_ns)
            order = int(path.name == META)
            files.append(
                (order, relative, None if self._uploaded.get(relative) == stamp else stamp)
            )
        return named, [(relative, stamp) for _, relative, stamp in sorted(files)]

    def _stored_whole(self, named: str) -> bool:
        """Whether this mirror stored checkpoint `named` whole: its META and every file
        the META names, at the size it names (listing.holds_whole)."""
        meta = f"{CHECKPOINTS}/{named}/{META}"
        if meta not in self._uploaded:
            return False
        try:
            text = (self.local / meta).read_text()
        except OSError:
            return False  # pruned since: a later checkpoint's pointer goes instead
        sizes = {relative: stamp[0] for relative, stamp in self._uploaded.items()}
        return holds_whole(named, text, sizes)

    def _grown_recently(self, relative: str, stamp: tuple[int, int]) -> bool:
        """A file outside the checkpoints (theirs are stored whole before `latest` names
        them) that only grew since it was uploaded, less than GROWN_EVERY_S ago: it
        waits for a later round (GROWN_EVERY_S says which rounds take it anyway)."""
        before = self._uploaded.get(relative)
        return (
            not self._closing.is_set()
            and relative != attempts.FILE
            and before is not None
            and stamp[0] > before[0]
            and not relative.startswith(f"{CHECKPOINTS}/")
            and self._clock() - self._uploaded_at[relative] < GROWN_EVERY_S
        )

    def _upload_changed(self) -> None:
        from pyarrow import fs

        if self._s3 is None:
            self._s3 = self.location.filesystem()
        self._fence(store=True)
        self._list_stored_checkpoints()
        # Retention's deletions first, of what the bucket may lose already (never one of the
        # newest it holds up to its `latest`: those go once newer ones are stored).
        self._delete_removed()
        started, sent = time.monotonic(), 0
        named, changed = self._round()
        pointer = f"{CHECKPOINTS}/{LATEST}"
        storing_a_checkpoint = any(relative == pointer for relative, stamp in changed)
        for relative, stamp in changed:
            if stamp is None or (
                not storing_a_checkpoint and self._grown_recently(relative, stamp)
            ):
                continue
            if relative == pointer:  # last: its checkpoint is whole in the bucket
                assert named is not None
                if not self._stored_whole(named):
                    continue  # a file of it not stored (re-saved, pruned): the next round
                self._fence(store=True)
                try:
                    with self._s3.open_output_stream(
                        self.location.key(self.run_name, pointer)
                    ) as out:
                        out.write(named.encode())
                except BaseException:
                    # Its answer lost is not its PUT lost: the bucket's `latest` may name
                    # it now, so retention keeps it until a pointer PUT is answered.
                    with self._retention_lock:
                        self._pointer_maybe.add(named)
                    raise
                with self._retention_lock:
                    self._uploaded_pointer = named
                    self._pointer_maybe.clear()
                self.uploads += 1
                took = time.monotonic() - started
                self.log(
                    f"run storage: {named} stored in {self.location.uri(self.run_name)} "
                    f"({sent / 2**20:.1f} MiB uploaded in {took:.2f} s, beside the training)"
                )
                self.log(
                    events.checkpoint_stored(
                        named, uploaded_mib=round(sent / 2**20, 3), upload_s=round(took, 3)
                    )
                )
                continue
            self._fence(store=False)
            try:
                fs.copy_files(
                    str(self.local / relative),
                    self.location.key(self.run_name, relative),
                    destination_filesystem=self._s3,
                )
            except FileNotFoundError:
                if (self.local / relative).exists():
                    raise
                continue  # removed since listed (a checkpoint retention deleted)
            self._uploaded[relative] = stamp
            self._uploaded_at[relative] = self._clock()
            self.uploads += 1
            self.bytes += stamp[0]
            sent += stamp[0]
        self._delete_removed()

    # ---- retention: what it removed here goes from the bucket too -------------------

    def stored_checkpoints(self) -> set[str]:
        """The checkpoints the bucket holds of the run, as far as the mirror knows."""
        with self._retention_lock:
            return set(self._stored_checkpoints or ())

    def remove(self, names: set[str]) -> None:
        """Delete these checkpoints from the bucket (retention removed them), at the end
        of the next round: after `latest` names a newer one, never the one it names."""
        with self._retention_lock:
            self._removed |= names

    def _list_stored_checkpoints(self) -> None:
        """Once, at the first round: what the bucket holds of the run, and what its
        `latest` says (never deleted while it says so, whoever wrote it)."""
        if self._listed:
            return
        files = stored_files(self._s3, self.location, self.run_name)
        names = stored_checkpoints(files)
        self._delete_parts_left(files, names)
        pointer = read_text(self._s3, self.location.key(self.run_name, CHECKPOINTS, LATEST))
        with self._retention_lock:
            if self._uploaded_pointer is None and pointer:
                self._uploaded_pointer = pointer.strip()
            if self._stored_checkpoints is None:
                self._stored_checkpoints = names
        self._listed = True

    def _delete_parts_left(self, files: dict[str, int], whole: set[str]) -> None:
        """A checkpoint without its `uerl.json` in the bucket was left by an earlier
        writer: an upload or a deletion its head's loss cut short. No reader takes it and
        no retention sees it, so it would stay for good; the run has one writer (its
        lease), this one, which has uploaded nothing yet: delete it."""
        parts: dict[str, list[str]] = {}
        for relative in files:
            pieces = relative.split("/")
            if len(pieces) >= 3 and pieces[0] == CHECKPOINTS and pieces[1] not in whole:
                parts.setdefault(pieces[1], []).append(relative)
        for relatives in parts.values():
            for relative in relatives:
                self._s3.delete_file(self.location.key(self.run_name, relative))
        if parts:
            self.log(
                f"run storage: deleted {len(parts)} checkpoint(s) an earlier attempt stored "
                f"in part ({', '.join(sorted(parts))}): never whole, never resumed from"
            )

    def _kept(self, stored: set[str]) -> set[str]:
        """What the bucket keeps whatever retention removed here: the checkpoint its
        `latest` names (or may name: a PUT whose answer was lost), and the newest `keep`
        it holds up to that one. Retention judged them by the checkpoints saved here,
        which the bucket may not hold yet (an outage): until it does, these are its
        newest (issue 63; CI, stop 69)."""
        pointer = self._uploaded_pointer
        kept = set(self._pointer_maybe) | ({pointer} if pointer is not None else set())
        if self._keep is not None:
            ceiling = iteration_of(pointer) if pointer is not None else None
            upto = sorted(
                (iteration, name)
                for name in stored
                if (iteration := iteration_of(name)) is not None
                and (ceiling is None or iteration <= ceiling)
            )
            kept |= {name for _, name in upto[-self._keep :]}
        return kept

    def _delete_removed(self) -> None:
        with self._retention_lock:
            stored = self._stored_checkpoints or set()
            stored |= {rel.split("/")[1] for rel in self._uploaded if is_meta(rel)}
            self._stored_checkpoints = stored
            doomed = sorted(self._removed - self._kept(stored))
        if doomed:
            self._fence(store=True)
        files = stored_files(self._s3, self.location, self.run_name) if doomed else {}
        for name in doomed:
            ours = [rel for rel in files if rel.startswith(f"{CHECKPOINTS}/{name}/")]
            # Its META first: from then on no reader takes it as whole.
            for relative in sorted(ours, key=lambda rel: not is_meta(rel)):
                self._s3.delete_file(self.location.key(self.run_name, relative))
                self._uploaded.pop(relative, None)
                self._uploaded_at.pop(relative, None)
            with self._retention_lock:
                self._removed.discard(name)
                stored.discard(name)
