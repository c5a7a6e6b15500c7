"""Runs in an S3-compatible bucket (`runs.store: s3`): the run is written to a local
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
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit

from infra.endpoints import RunStorage
from infra.topology import JOB_STOP_GRACE_S
from training.runstore import atomic, attempts, events
from training.runstore.atomic import PARTIAL_PREFIX
from training.runstore.lease import LeaseLost
from training.runstore.listing import (
    CHECKPOINTS,
    LATEST,
    META,
    hidden,
    holds_whole,
    wanted,
    whole_checkpoint,
    within,
)
from training.runstore.location import (
    FIELD,
    STORE_RETRY_S,
    STORE_WAIT_S,
    RunStorageError,
    RunStorageUnavailable,
)

# Per request (the request timeout is the longest silence within one): a store that does
# not answer is reported and retried by the mirror within seconds, not waited on.
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 10.0
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
T = TypeVar("T")


WRITE_CHECK = "write-check"  # the key `check` writes and deletes, below its hidden prefix


def _unfenced(*, store: bool = True) -> None:
    """No lease to check (a mirror of tests and benchmarks)."""


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    endpoint: str | None
    region: str | None

    @classmethod
    def of(cls, runs: RunStorage) -> S3Location:
        parts = urlsplit(runs.uri)
        if parts.scheme != "s3" or not parts.netloc:
            raise RunStorageError(f"{FIELD}: {runs.uri} is not s3://<bucket>/<prefix>")
        return cls(parts.netloc, parts.path.strip("/"), runs.s3_endpoint, runs.s3_region)

    def key(self, *parts: str) -> str:
        """`bucket/prefix/parts...`, the path pyarrow's filesystem takes."""
        return str(PurePosixPath(self.bucket, self.prefix, *parts))

    def uri(self, *parts: str) -> str:
        return f"s3://{self.key(*parts)}"

    def filesystem(self) -> Any:
        from pyarrow import fs

        options: dict[str, Any] = {
            "region": self.region or "us-east-1",
            "connect_timeout": CONNECT_TIMEOUT_S,
            "request_timeout": REQUEST_TIMEOUT_S,
            # Retries are the mirror's (with backoff and a word to the user), so one
            # attempt each here: an unreachable store is known in seconds.
            "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=1),
        }
        if self.endpoint is not None:
            url = urlsplit(self.endpoint)
            options["endpoint_override"] = url.netloc
            options["scheme"] = url.scheme
        return fs.S3FileSystem(**options)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Stores `data` at `key` (a `filesystem()` path: `bucket/...`) unless an object is
        there: one PUT with `If-None-Match: *`, which the store refuses (412) when the key
        exists; True when this PUT made it. The run's lease needs it
        (training.runstore.lease); pyarrow's filesystem cannot send it, so obstore (the
        Rust object_store's client, which reads the same AWS_* variables) does, once:
        a timed-out PUT is not retried (a retry of one that landed would be refused)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        bucket, _, name = key.partition("/")
        config: dict[str, Any] = {"region": self.region or "us-east-1", "conditional_put": "etag"}
        if self.endpoint is not None:
            config["endpoint"] = self.endpoint
        store = obstore.store.S3Store(
            bucket,
            config=config,
            client_options={
                "allow_http": True,
                "connect_timeout": f"{CONNECT_TIMEOUT_S:g}s",
                "timeout": f"{REQUEST_TIMEOUT_S:g}s",
            },
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=0)},
        )
        try:
            obstore.put(store, name, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        except NotSupportedError:
            raise NotImplementedError(
                f"{FIELD}: {self.uri()}: the store does not take conditional writes "
                "(If-None-Match), which the run's lease needs; use a store that does "
                "(AWS S3, SeaweedFS, MinIO) or a claim"
            ) from None
        except Exception as exc:  # obstore's errors are no OSError: the callers' outage
            raise OSError(f"{type(exc).__name__}: {exc}") from None
        return True


def explain(exc: BaseException, location: S3Location) -> str:
    """The store's error as the user can act on it, naming the field at fault."""
    text = str(exc)
    where = location.endpoint or f"AWS S3 ({location.region})"
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return f"runs.s3.bucket: bucket {location.bucket!r} does not exist at {where}"
    if (
        any(
            code in text
            for code in ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY_ID", "SIGNATURE")
        )
        or "InvalidAccessKeyId" in text
        or "SignatureDoesNotMatch" in text
    ):
        return (
            f"runs.s3.credentials_secret: {where} refused the credentials for bucket "
            f"{location.bucket!r} (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
        )
    if "NETWORK_CONNECTION" in text or "connect" in text.lower() or "resolve" in text.lower():
        return f"runs.s3.endpoint: {where} cannot be reached ({_first_line(text)})"
    return f"{FIELD}: {location.uri()}: {_first_line(text)}"


def misconfigured(exc: BaseException) -> bool:
    """The store answered, and says the configuration is wrong (no such bucket, keys it
    refuses): trying again would not help. Anything else (no answer, a 503, a reset
    connection) is an outage."""
    text = str(exc)
    return any(
        code in text
        for code in (
            "NO_SUCH_BUCKET",
            "NoSuchBucket",
            "ACCESS_DENIED",
            "AccessDenied",
            "INVALID_ACCESS_KEY_ID",
            "InvalidAccessKeyId",
            "SIGNATURE",
            "SignatureDoesNotMatch",
        )
    )


def failure(exc: BaseException, location: S3Location) -> RunStorageError | RunStorageUnavailable:
    """The store's error as the exception its callers sort exit statuses by."""
    if misconfigured(exc):
        return RunStorageError(explain(exc, location))
    return RunStorageUnavailable(explain(exc, location))


def patiently(
    location: S3Location, doing: str, attempt: Callable[[], T], log: Log, wait_s: float | None
) -> T:
    """`attempt()`, tried again while the store does not answer, for up to `wait_s`: a
    store down for a moment at a run's start delays it, and one down longer ends it with
    RunStorageUnavailable (exit status 1, retried by `uerl supervise`). A misconfigured
    store is a RunStorageError at once. `wait_s` None: STORE_WAIT_S."""
    wait_s = STORE_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return attempt()
        except OSError as exc:
            if misconfigured(exc) or exc.errno is not None:  # errno: this machine's disk
                raise
            reason = explain(exc, location)
            if time.monotonic() + STORE_RETRY_S > deadline:
                raise RunStorageUnavailable(
                    f"{reason}; {doing}: no answer for {wait_s:.0f} s, giving up "
                    "(exit status 1: a supervised run tries again)"
                ) from None
            if not said:
                log(f"run storage: {doing}: {reason}; trying again for up to {wait_s:.0f} s")
                said = True
            time.sleep(STORE_RETRY_S)


def stored_checkpoints(files: Collection[str]) -> set[str]:
    """The checkpoints stored whole among a run's `files` (`stored_files`)."""
    return {relative.split("/")[1] for relative in files if _is_meta(relative)}


def _is_meta(relative: str) -> bool:
    """`checkpoints/<name>/uerl.json`: a checkpoint stored whole."""
    parts = relative.split("/")
    return len(parts) == 3 and parts[0] == CHECKPOINTS and parts[2] == META


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no detail"


def check(
    location: S3Location, run_name: str, log: Log = print, wait_s: float | None = None
) -> None:
    """The bucket is there, the credentials are taken and a run can write under its
    prefix: a RunStorageError naming the field otherwise, before anything starts; a
    store that does not answer for `wait_s`, RunStorageUnavailable."""
    from pyarrow import fs

    def probe() -> None:
        s3 = location.filesystem()
        info = s3.get_file_info(location.bucket)
        if info.type == fs.FileType.NotFound:
            raise RunStorageError(
                f"runs.s3.bucket: bucket {location.bucket!r} does not exist at "
                f"{location.endpoint or 'AWS S3'}"
            )
        key = location.key(run_name, f"{PARTIAL_PREFIX}{atomic.WRITER}-{WRITE_CHECK}")
        with s3.open_output_stream(key) as out:
            out.write(b"uerl")
        s3.delete_file(key)
        # An earlier check's, left when its store went away between its write and its
        # delete (hidden from every reader, but kept for good otherwise).
        top = fs.FileSelector(location.key(run_name), allow_not_found=True)
        for info in s3.get_file_info(top):
            name = info.base_name
            if name.startswith(PARTIAL_PREFIX) and name.endswith(f"-{WRITE_CHECK}"):
                s3.delete_file(info.path)

    try:
        patiently(location, "checking the bucket", probe, log, wait_s)
    except OSError as exc:
        raise failure(exc, location) from None


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


def read_text(s3: Any, key: str) -> str | None:
    try:
        with s3.open_input_stream(key) as stream:
            return str(stream.read().decode().strip())
    except FileNotFoundError:
        return None


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
        # Retention's deletions first: after an outage the round uploads every checkpoint
        # saved meanwhile, and the bucket need not hold the old ones beside them.
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

    def _delete_removed(self) -> None:
        with self._retention_lock:
            stored = self._stored_checkpoints or set()
            stored |= {rel.split("/")[1] for rel in self._uploaded if _is_meta(rel)}
            self._stored_checkpoints = stored
            doomed = sorted(self._removed - {self._uploaded_pointer} - self._pointer_maybe)
        if doomed:
            self._fence(store=True)
        files = stored_files(self._s3, self.location, self.run_name) if doomed else {}
        for name in doomed:
            ours = [rel for rel in files if rel.startswith(f"{CHECKPOINTS}/{name}/")]
            # Its META first: from then on no reader takes it as whole.
            for relative in sorted(ours, key=lambda rel: not _is_meta(rel)):
                self._s3.delete_file(self.location.key(self.run_name, relative))
                self._uploaded.pop(relative, None)
                self._uploaded_at.pop(relative, None)
            with self._retention_lock:
                self._removed.discard(name)
                stored.discard(name)
