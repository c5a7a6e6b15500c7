"""Runs in an S3-compatible bucket (`runs.store: s3`): the run is written to a local
directory as always, and mirrored to `s3://<bucket>/<prefix>/<run name>/` in the
background, so storing never holds up sampling.

What a reader of the bucket can rely on:
- a checkpoint's `uerl.json` is uploaded after every other file of it, and
  `checkpoints/latest` after the whole checkpoint it names: `latest` (and a checkpoint
  with its `uerl.json`) is always whole;
- every other file is replaced whole (one PUT each), never seen half written.
While the store is unreachable the mirror retries with backoff and the training goes on;
what it could not upload yet goes at the next attempt.

pyarrow's S3 filesystem (the AWS SDK's client, which Ray brings) does the transfers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from infra.endpoints import RunStorage
from training.runstore.atomic import PARTIAL_PREFIX
from training.runstore.listing import CHECKPOINTS, LATEST, META, wanted
from training.runstore.location import FIELD, RunStorageError

# Per request (the request timeout is the longest silence within one): a store that does
# not answer is reported and retried by the mirror within seconds, not waited on.
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 10.0
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 15.0
CLOSING_ROUNDS = 3

Log = Callable[[str], None]


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


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no detail"


def check(location: S3Location, run_name: str) -> None:
    """The bucket is there, the credentials are taken and a run can write under its
    prefix: a RunStorageError naming the field otherwise, before anything starts."""
    from pyarrow import fs

    try:
        s3 = location.filesystem()
        info = s3.get_file_info(location.bucket)
        if info.type == fs.FileType.NotFound:
            raise RunStorageError(
                f"runs.s3.bucket: bucket {location.bucket!r} does not exist at "
                f"{location.endpoint or 'AWS S3'}"
            )
        probe = location.key(run_name, f"{PARTIAL_PREFIX}write-check")
        with s3.open_output_stream(probe) as out:
            out.write(b"uerl")
        s3.delete_file(probe)
    except RunStorageError:
        raise
    except OSError as exc:
        raise RunStorageError(explain(exc, location)) from None


def restore(location: S3Location, run_name: str, local: Path, log: Log) -> bool:
    """A stored run back into `local` to resume it: everything but the checkpoints other
    than the one `latest` names. False when the store holds no checkpoint of the run."""
    from pyarrow import fs

    s3 = location.filesystem()
    root = location.key(run_name)
    try:
        with s3.open_input_stream(location.key(run_name, CHECKPOINTS, LATEST)) as stream:
            latest = stream.read().decode().strip()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise RunStorageError(explain(exc, location)) from None
    count = size = 0
    for info in s3.get_file_info(fs.FileSelector(root, recursive=True)):
        if info.type != fs.FileType.File:
            continue
        relative = info.path[len(root) + 1 :]
        if not wanted(relative, latest, latest_only=True):
            continue
        target = local / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.copy_files(info.path, str(target), source_filesystem=s3)
        count += 1
        size += info.size or 0
    log(
        f"run storage: restored {location.uri(run_name)} ({count} files, "
        f"{size / 2**20:.1f} MiB; checkpoint {latest})"
    )
    return True


class Mirror:
    """Uploads what changed in `local` to `s3://.../<run name>/` on a background thread,
    whenever `sync()` asks and at `close()`."""

    def __init__(self, location: S3Location, run_name: str, local: Path, log: Log) -> None:
        self.location = location
        self.run_name = run_name
        self.local = local
        self.log = log
        self._uploaded: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime)
        self._wanted = threading.Event()
        self._closing = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._down_since: float | None = None
        self._s3: Any = None
        self.uploads = 0
        self.bytes = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="uerl-run-mirror", daemon=True)
        self._thread.start()

    def sync(self) -> None:
        """Upload what changed (soon, on the mirror's thread)."""
        self._idle.clear()
        self._wanted.set()

    def close(self, timeout_s: float = 300.0) -> bool:
        """A last upload of everything; True when all of it is stored."""
        self.sync()
        self._closing.set()
        self._thread.join(timeout_s)
        pending = self.pending()
        if pending:
            why = self.last_error or "still changing at the end: " + ", ".join(pending[:3])
            self.log(
                f"run storage: {len(pending)} file(s) of {self.local} not stored in "
                f"{self.location.uri(self.run_name)} ({why}); they stay on this machine"
            )
        return not pending

    def wait_idle(self, timeout_s: float) -> bool:
        """Until what was asked is stored (tests, benchmarks)."""
        return self._idle.wait(timeout_s)

    def pending(self) -> list[str]:
        return [relative for relative, stamp in self._changed() if stamp is not None]

    def _run(self) -> None:
        delay = RETRY_FIRST_S
        last_rounds = 0  # rounds since close(): files still changing get a few more
        while True:
            self._wanted.wait(timeout=None if not self._closing.is_set() else 0)
            self._wanted.clear()
            try:
                self._upload_changed()
            except OSError as exc:
                # Also while closing: close()'s join timeout bounds the last attempts.
                self._went_down(exc)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                self._wanted.set()  # again, after the backoff
                continue
            delay = RETRY_FIRST_S
            self._came_back()
            self._idle.set()
            if self._closing.is_set():
                # A file written while the round ran (Ray's log, flushed at shutdown)
                # goes in another round; a file that never stops changing, not forever.
                last_rounds += 1
                if not self.pending() or last_rounds >= CLOSING_ROUNDS:
                    return
                self._wanted.set()

    def _went_down(self, exc: OSError) -> None:
        self.last_error = explain(exc, self.location)
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
        files: list[tuple[int, str, tuple[int, int] | None]] = []
        for path in self.local.rglob("*"):
            relative = path.relative_to(self.local).as_posix()
            if not path.is_file() or any(p.startswith(PARTIAL_PREFIX) for p in path.parts):
                continue
            stat = path.stat()
            stamp = (stat.st_size, stat.st_mtime_ns)
            order = 2 if relative == f"{CHECKPOINTS}/{LATEST}" else int(path.name == META)
            files.append(
                (order, relative, None if self._uploaded.get(relative) == stamp else stamp)
            )
        return [(relative, stamp) for _, relative, stamp in sorted(files)]

    def _upload_changed(self) -> None:
        from pyarrow import fs

        if self._s3 is None:
            self._s3 = self.location.filesystem()
        started, sent = time.monotonic(), 0
        for relative, stamp in self._changed():
            if stamp is None:
                continue
            fs.copy_files(
                str(self.local / relative),
                self.location.key(self.run_name, relative),
                destination_filesystem=self._s3,
            )
            self._uploaded[relative] = stamp
            self.uploads += 1
            self.bytes += stamp[0]
            sent += stamp[0]
            if relative == f"{CHECKPOINTS}/{LATEST}":  # uploaded last: its checkpoint is whole
                name = (self.local / relative).read_text().strip()
                self.log(
                    f"run storage: {name} stored in {self.location.uri(self.run_name)} "
                    f"({sent / 2**20:.1f} MiB uploaded in {time.monotonic() - started:.2f} s, "
                    "beside the training)"
                )
