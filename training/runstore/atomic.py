"""Writes a reader (a resumed run, `uerl pull`, a copy) never sees half done: a file is
written beside its place and renamed over it, a directory is filled under a hidden name
and renamed into place. A crash, a lost pod or a full volume leaves the last whole
version and, at worst, a hidden leftover the next write removes.

Hidden names carry the writer (`WRITER`, this process): two writers of one directory
never share one, and a writer removes another's leftover only once it has not changed
for LEFTOVER_STALE_S (it may be a save in progress); a run's lease holder removes them
all when it takes the run (training.runstore.lease: no other writer is left)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

PARTIAL_PREFIX = ".partial-"
WRITER = secrets.token_hex(4)  # this process, as a writer of runs
# A leftover of another writer unchanged this long is a dead writer's, not a save in
# progress (a save adds files to it as it goes).
LEFTOVER_STALE_S = 600.0


def partial_name(path: Path, what: str = "") -> Path:
    """Where this writer fills `path` before renaming it into place."""
    return path.with_name(f"{PARTIAL_PREFIX}{WRITER}-{what}{path.name}")


def write_text(path: Path, text: str) -> None:
    """`path` holds `text`, or what it held before: never a part of either."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_name(path)
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def directory(path: Path) -> Iterator[Path]:
    """A directory to fill (not made yet: its writer makes it, as RLlib's checkpoints
    do); on success it becomes `path` (replacing one there), on an error it is removed
    and `path` is as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_name(path)
    shutil.rmtree(partial, ignore_errors=True)  # a crashed attempt's
    try:
        yield partial
        _sync_tree(partial)
        if path.exists():
            old = partial_name(path, "old-")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(partial, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _sync_tree(root: Path) -> None:
    """Every file's data on the storage before the rename publishes it (a network volume
    or a node lost right after would otherwise keep the name with missing data)."""
    for file in root.rglob("*"):
        if file.is_file():
            with file.open("rb") as fh:
                os.fsync(fh.fileno())


def remove_leftovers(directory: Path, *, every_writer: bool = False) -> None:
    """Hidden partial files and directories a crashed write left in `directory`: this
    writer's, and another's unchanged for LEFTOVER_STALE_S (`every_writer`: all, for the
    run's one writer)."""
    if not directory.is_dir():
        return
    now = time.time()
    for leftover in directory.glob(f"{PARTIAL_PREFIX}*"):
        mine = leftover.name.startswith(f"{PARTIAL_PREFIX}{WRITER}-")
        if not (mine or every_writer or now - _changed_at(leftover) > LEFTOVER_STALE_S):
            continue
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def _changed_at(path: Path) -> float:
    """When anything in `path` (a file, or a directory's tree) last changed."""
    try:
        times = [path.stat().st_mtime]
        times += [p.stat().st_mtime for p in path.rglob("*")] if path.is_dir() else []
    except FileNotFoundError:  # removed by its writer meanwhile
        return time.time()
    return max(times)
