"""Where a command will write, checked before it starts anything: a run that can write
nothing fails in a moment with one line, not at its first checkpoint after training (or
with a traceback from deep inside).

Nothing is left behind: a directory that does not exist yet is checked by making (and
removing) a scratch directory in its nearest existing parent.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def check_writable_dir(path: Path, what: str) -> None:
    """`path` is a directory this process can write in, or one it can create; else a
    ValueError `"<what> <path>: ..."`."""
    problem = _problem(path)
    if problem is not None:
        raise ValueError(f"{what} {path}: {problem}")


def check_writable_file(path: Path, what: str) -> None:
    """`path` can be written as a file: not a directory, in a directory checked as above."""
    problem = "is a directory (give a file name)" if path.is_dir() else _problem(path.parent)
    if problem is not None:
        raise ValueError(f"{what} {path}: {problem}")


def _problem(directory: Path) -> str | None:
    wanted = directory.absolute()
    existing = wanted
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
    except OSError as exc:  # a parent this user may not search
        return f"cannot reach {existing} ({exc.strerror})"
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        scratch = tempfile.mkdtemp(prefix=".uerl-write-check-", dir=existing)
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror})"
    shutil.rmtree(scratch, ignore_errors=True)
    return None
