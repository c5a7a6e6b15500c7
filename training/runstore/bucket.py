"""A bucket of run storage (`runs.store: s3`): where it is (`S3Location`: bucket, prefix,
endpoint; pyarrow's S3 filesystem on it, and the one conditional write the lease needs),
what its errors mean to the user (each naming the field at fault), how long an outage
is waited out (`patiently`), and the check before a run starts (`check`).

The run's mirror into it is training.runstore.bucket_mirror; reading a run back out of
it, training.runstore.bucket_restore.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit

from infra.endpoints import RunStorage
from training.runstore import atomic
from training.runstore.atomic import PARTIAL_PREFIX
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

Log = Callable[[str], None]
T = TypeVar("T")

WRITE_CHECK = "write-check"  # the key `check` writes and deletes, below its hidden prefix


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


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no detail"


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
