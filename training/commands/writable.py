"""Where a command will write, checked before it starts anything: a run that can write
nothing fails in a moment with one line, not at its first checkpoint after training (or
with a traceback from deep inside). Every command that writes a file or a directory
(`--run-dir`, `--output`, `--out`, `--to`) checks it here, and says what is wrong in the
same words: the flag, the path as typed, and why.

Nothing is left behind: a directory that does not exist yet is checked by making (and
removing) a scratch directory in its nearest existing parent.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from pathlib import Path


class OutputRefused(ValueError):
    """An output path that cannot take what the command would write: bad input (exit
    status 2), the message naming the flag, the path as typed, and why."""


def check_writable_dir(path: Path, what: str) -> None:
    """`path` is a directory this process can write in, or one it can create; else a
    ValueError `"<what> <path>: ..."`."""
    problem = _problem(path)
    if problem is not None:
        raise OutputRefused(f"{what} {path}: {problem}")


def check_writable_file(path: Path, what: str) -> None:
    """`path` can be written as a file: not a directory, in a directory checked as above."""
    problem = "is a directory (give a file name)" if path.is_dir() else _problem(path.parent)
    if problem is not None:
        raise OutputRefused(f"{what} {path}: {problem}")


def check_room(path: Path, what: str, *, needed: int, needs: str, hint: str = "") -> None:
    """The disk `path` (a directory, made or to be made) is on has `needed` bytes free;
    else an OutputRefused `"<what> <path>: not enough room: ..., and <needs> <size>"`
    (`needs`: "the run is", "the ONNX files take about"), then `hint`. Checked after
    `check_writable_dir`: a path that cannot be written is said as such, not as a disk
    with no room."""
    try:
        free = shutil.disk_usage(_nearest_existing(path.absolute())).free
    except OSError as exc:  # a volume that does not answer: the write will say it
        raise OutputRefused(f"{what} {path}: cannot tell its free space ({exc.strerror})") from None
    if free < needed:
        full = "the disk it is on is full" if free == 0 else f"only {size(free)} free there"
        tail = f"; {hint}" if hint else ""
        raise OutputRefused(
            f"{what} {path}: not enough room: {full}, and {needs} {size(needed)}{tail}"
        )


def size(count: float) -> str:
    """Bytes for a person: `512 B`, `12.0 KiB`, `3.1 MiB`, `2.0 GiB`."""
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


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


def write_failed(path: Path, what: str, exc: OSError) -> OutputRefused:
    """A write under `path` that failed part way (the disk filled, the volume went away),
    as the checks above say theirs: the flag and the path as typed, not the hidden file
    being written when it happened."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason = f"the disk it is on is full ({reason})"
    return OutputRefused(f"{what} {path}: cannot write there: {reason}")
