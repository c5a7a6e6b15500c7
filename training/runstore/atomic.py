"""Writes a reader (a resumed run, `uerl pull`, a copy) never sees half done: a file is
written beside its place and renamed over it, a directory is filled under a hidden name
and renamed into place. A crash, a lost pod or a full volume leaves the last whole
version and, at worst, a hidden leftover the next write removes."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

PARTIAL_PREFIX = ".partial-"


def write_text(path: Path, text: str) -> None:
    """`path` holds `text`, or what it held before: never a part of either."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{PARTIAL_PREFIX}{path.name}")
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
    partial = path.with_name(f"{PARTIAL_PREFIX}{path.name}")
    shutil.rmtree(partial, ignore_errors=True)  # a crashed attempt's
    try:
        yield partial
        _sync_tree(partial)
        if path.exists():
            old = path.with_name(f"{PARTIAL_PREFIX}old-{path.name}")
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


def remove_leftovers(directory: Path) -> None:
    """Hidden partial files and directories a crashed write left in `directory`."""
    if not directory.is_dir():
        return
    for leftover in directory.glob(f"{PARTIAL_PREFIX}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
