"""Opening a run in the stack's run storage (endpoints `runs`) before it starts: checked
(there, writable, room or a bucket that takes the credentials), and, to resume from a
bucket, brought back to this machine first."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.endpoints import Endpoints
from training.runstore.location import FIELD, RunStorageError, check_room
from training.runstore.s3_store import Mirror, S3Location, check, restore

Log = Callable[[str], None]


@dataclass
class StoredRun:
    """Where the run writes (`run_dir`), and for a bucket the mirror storing it there."""

    run_dir: Path
    where: str  # the run's place in the storage, as the user names it
    mirror: Mirror | None = None

    def sync(self) -> None:
        """Store what changed (a bucket: in the background; a volume: it is there)."""
        if self.mirror is not None:
            self.mirror.sync()

    def close(self) -> bool:
        return self.mirror.close() if self.mirror is not None else True


def staging_root() -> Path:
    """Where a run bound for a bucket is written first: the Ray head's /tmp volume."""
    return Path(tempfile.gettempdir()) / "uerl-runs"


def open_stored_run(
    endpoints: Endpoints, run_name: str, *, resume: str | None, log: Log
) -> StoredRun:
    """The run `run_name` in the endpoints' run storage, checked; a RunStorageError
    naming the field at fault when it cannot take the run. `resume` (--resume): from a
    bucket, the stored run is brought back first (`auto`: if there is one)."""
    runs = endpoints.runs
    if runs is None:
        raise RunStorageError(f"{FIELD}: these endpoints name no run storage")
    if runs.uri.startswith("file://"):
        root = Path(runs.uri.removeprefix("file://"))
        check_room(root)
        return StoredRun(root / run_name, str(root / run_name))
    location = S3Location.of(runs)
    check(location, run_name)
    local = staging_root() / run_name
    if resume is not None and not restore(location, run_name, local, log) and resume != "auto":
        raise RunStorageError(
            f"--resume: {location.uri(run_name)} holds no checkpoint (no "
            "checkpoints/latest); give the --run-name of a stored run"
        )
    return StoredRun(local, location.uri(run_name), Mirror(location, run_name, local, log))
