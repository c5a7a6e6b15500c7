"""A run's place in the stack's run storage: `<endpoints.runs.uri>/<run name>`.

On a cluster the endpoints name the runs claim as the head mounts it (`file:///uerl/runs`)
or a bucket (`s3://...`), so `uerl train` there needs no path flag; `uerl local` keeps
`runs/` on the local disk.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

# A run name is one path segment (a directory, an object key part): no `/`, no `..`.
# Matched whole (fullmatch: `$` would let a trailing newline through).
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# What --help and the errors say of it.
RUN_NAME_LIMITS = "1 to 100 letters, digits, '.', '_' and '-', starting with a letter or digit"
RUN_NAME_RULE = f"a run name is {RUN_NAME_LIMITS}"
# Below this much free space the run storage is refused at start: a checkpoint of the
# default models is a few MB, and a full volume mid-run would cost the run its progress.
MIN_FREE_BYTES = 64 * 2**20
FIELD = "endpoints runs.uri (topology runs)"
# How long a run's start waits for a store that does not answer (a 503, an endpoint
# down, a volume not responding) before it gives up with exit status 1, which
# `uerl supervise` retries: a moment's outage is not bad input.
STORE_WAIT_S = 60.0
STORE_RETRY_S = 5.0


class RunStorageError(ValueError):
    """The run storage cannot take a run as configured (exit status 2: it would fail
    again); the message names the field or argument at fault."""


class RunStorageUnavailable(Exception):
    """The run storage did not answer (exit status 1: worth trying again); the message
    names the field that says where it is. Not a RunStorageError: callers tell them
    apart by type."""


def check_run_name(name: str, *, flag: str = "--run-name") -> str:
    if not RUN_NAME.fullmatch(name):
        raise RunStorageError(f"{flag} {name!r}: {RUN_NAME_RULE}")
    return name


def default_run_name(cluster_name: str) -> str:
    return f"{cluster_name}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_room(root: Path) -> None:
    """The run storage is there and has room; else a RunStorageError naming it (or
    RunStorageUnavailable: a volume that does not answer, exit status 1 as a bucket's)."""
    try:
        mounted = root.is_dir()
    except OSError as exc:  # EIO, a lost NFS server: is_dir() lets all but "no such" through
        raise RunStorageUnavailable(f"{FIELD}: {root} does not answer: {exc}") from None
    if not mounted:
        raise RunStorageError(
            f"{FIELD}: {root} is not mounted here (no such directory): is this the Ray head "
            "of the stack? Elsewhere pass --run-dir"
        )
    try:
        free = shutil.disk_usage(root).free
    except OSError as exc:  # mounted, but the volume does not answer (EIO, a lost NFS server)
        raise RunStorageUnavailable(f"{FIELD}: {root} does not answer: {exc}") from None
    if free < MIN_FREE_BYTES:
        raise RunStorageError(
            f"{FIELD}: {root} has {free / 2**20:.1f} MiB free, under the "
            f"{MIN_FREE_BYTES // 2**20} MiB a run needs to start: the volume is full "
            "(free space, or give runs.claim.size more)"
        )
