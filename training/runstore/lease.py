"""One writer per run: `lease.json` in the run (on the claim, or in the bucket, written
there directly) names the writer holding it and when it last renewed it. A run's start
takes it (refused while another holder renews it; taken over once that holder stopped
renewing for the lease's TTL, said), a thread renews it while the run goes on, and the
run's end deletes it.

What it guarantees: on a claim, one volume seen by one head, the read-then-write is
checked again after it is written, and two starts in the same instant are the only race
left. S3 has no conditional write every store offers, so a bucket's lease is written,
read back after a moment and checked the same way: two writers starting within that
moment could both believe they hold it, and a renewal that reads another holder says
so at once (the run ends non-zero at its end). It stops the mistakes that happen (a
second `uerl train` of a run, a supervisor's next attempt while the last still runs),
not a determined race.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from training.runstore import atomic
from training.runstore.listing import LEASE
from training.runstore.location import RunStorageUnavailable

FILE = LEASE
# A holder renews every RENEW_S; a lease not renewed for TTL_S is its holder's no more
# (a lost head stops renewing, and the next attempt takes the run after at most this).
TTL_S = 60.0
RENEW_S = 15.0
# How long after writing a bucket's lease it is read back (another writer's write in
# the same moment shows by then).
SETTLE_S = 0.2

Log = Callable[[str], None]


class LeaseRecord(BaseModel):
    """What `lease.json` holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    holder: str  # the writer (atomic.WRITER of its process, then the lease's own)
    host: str
    renewed_at: float  # seconds since the epoch: holders are on different machines
    ttl_s: float

    def age_s(self, now: float) -> float:
        return now - self.renewed_at

    def fresh(self, now: float) -> bool:
        return self.age_s(now) < self.ttl_s


class LeaseStore(Protocol):
    where: str

    def read(self) -> str | None: ...
    def write(self, text: str) -> None: ...
    def delete(self) -> None: ...


class FileLease:
    """The lease as a file in the run's directory on the claim."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / FILE
        self.where = str(self.path)

    def read(self) -> str | None:
        try:
            return self.path.read_text()
        except FileNotFoundError:
            return None

    def write(self, text: str) -> None:
        atomic.write_text(self.path, text)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)


class ObjectLease:
    """The lease as an object of the run in a bucket (pyarrow's filesystem `s3`)."""

    def __init__(self, s3: Any, key: str) -> None:
        self.s3, self.key = s3, key
        self.where = f"s3://{key}"

    def read(self) -> str | None:
        try:
            with self.s3.open_input_stream(self.key) as stream:
                return str(stream.read().decode())
        except FileNotFoundError:
            return None

    def write(self, text: str) -> None:
        with self.s3.open_output_stream(self.key) as out:
            out.write(text.encode())

    def delete(self) -> None:
        self.s3.delete_file(self.key)


def _parse(text: str | None) -> LeaseRecord | None:
    if text is None:
        return None
    try:
        return LeaseRecord.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None  # unreadable: nobody's (a lease is rewritten whole; this is damage)


class Lease:
    """The run's lease, for this process (`atomic.WRITER`)."""

    def __init__(self, store: LeaseStore, run_flag: str, log: Log) -> None:
        self.store = store
        self.run_flag = run_flag  # how the user named the run: `--run-name NAME`
        self.log = log
        # The process's writer id (its partial names carry it), and this lease's own:
        # two runs opened in one process are two writers.
        self.holder = f"{atomic.WRITER}-{secrets.token_hex(2)}"
        self.lost: str | None = None  # why the lease is not this writer's any more
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, *, wait: bool) -> LeaseRecord | None:
        """The lease, now this writer's; the dead writer's it took over, if any. Held
        by a writer that renews it: RunStorageUnavailable (exit status 1: it is free once
        that writer ends). `wait`: a holder that has not renewed since is waited out for
        up to its TTL (a supervisor's next attempt comes soon after a head is lost)."""
        current = _parse(self.store.read())
        if current is not None and current.holder != self.holder and current.fresh(time.time()):
            if not wait:
                self._refuse(current)
            current = self._wait_out(current)
        previous = current if current is not None and current.holder != self.holder else None
        if previous is not None:
            self.log(
                f"run storage: taking over the run from writer {previous.holder} on "
                f"{previous.host}, whose lease ({self.store.where}) was last renewed "
                f"{previous.age_s(time.time()):.0f} s ago (its TTL {previous.ttl_s:g} s)"
            )
        self._write()
        time.sleep(SETTLE_S)  # a write in the same moment by another shows by now
        now = _parse(self.store.read())
        if now is None or now.holder != self.holder:
            raise RunStorageUnavailable(
                f"{self.run_flag}: another writer took the run's lease ({self.store.where}) "
                "at the same moment; try again"
            )
        return previous

    def _wait_out(self, held: LeaseRecord) -> LeaseRecord:
        while held.fresh(time.time()):
            time.sleep(min(RENEW_S, max(held.ttl_s - held.age_s(time.time()), 0.0)) + 0.01)
            again = _parse(self.store.read())
            if again is None:
                return held
            if again.renewed_at != held.renewed_at or again.holder != held.holder:
                self._refuse(again)  # renewed: its writer is alive
        return held

    def _refuse(self, held: LeaseRecord) -> NoReturn:
        raise RunStorageUnavailable(
            f"{self.run_flag}: the run is being written by writer {held.holder} on "
            f"{held.host} (its lease {self.store.where}, renewed "
            f"{held.age_s(time.time()):.0f} s ago, runs out {held.ttl_s:g} s after its "
            "writer stops); one writer at a time: try again once it ends"
        )

    def _write(self) -> None:
        record = LeaseRecord(
            holder=self.holder, host=socket.gethostname(), renewed_at=time.time(), ttl_s=TTL_S
        )
        self.store.write(record.model_dump_json())

    def keep_renewed(self) -> None:
        """Renew the lease every RENEW_S on a thread, until `release()`."""
        self._thread = threading.Thread(target=self._renew, name="uerl-run-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        failing = False
        while not self._stop.wait(RENEW_S):
            try:
                current = _parse(self.store.read())
                if current is not None and current.holder != self.holder:
                    self.lost = (
                        f"writer {current.holder} on {current.host} took the run's lease "
                        f"({self.store.where}): this run's files may be mixed with its"
                    )
                    self.log(f"run storage: {self.lost}; this writer stops renewing")
                    return
                self._write()
                if failing:
                    self.log(f"run storage: the lease ({self.store.where}) is renewed again")
                failing = False
            except Exception as exc:  # a store down for a while: said, tried again
                if not failing:
                    self.log(
                        f"run storage: cannot renew the lease ({self.store.where}): {exc}; "
                        f"another writer may take the run after {TTL_S:g} s"
                    )
                failing = True

    def release(self) -> None:
        """Stop renewing, and delete the lease if it is still this writer's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(RENEW_S)
        if self.lost is not None:
            return
        try:
            current = _parse(self.store.read())
            if current is not None and current.holder == self.holder:
                self.store.delete()
        except OSError as exc:  # it runs out by itself
            self.log(f"run storage: the lease ({self.store.where}) was not released: {exc}")
