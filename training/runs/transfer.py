"""A pull's local side: a run lands whole under its name or not at all, and a long
transfer says how far it is."""

from __future__ import annotations

import io
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TextIO

from training.runstore import atomic
from training.runstore.location import RunStorageError

# A line at most this often: often enough to show a stall, rarely enough for a log.
PROGRESS_EVERY_S = 2.0


def mib(size: float) -> str:
    return f"{size / 2**20:.1f} MiB"


class Progress:
    """`pulling NAME: 12.0 / 80.0 MiB (15%)` now and then while bytes arrive, one line
    each (a terminal sees it rewritten in place)."""

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.done = what, total, 0
        self.stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._started = self._last = clock()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self) -> str:
        shown = f"{self.what}: {mib(self.done)}"
        if self.total:
            shown += f" / {mib(self.total)} ({min(100, 100 * self.done // self.total)}%)"
        return shown

    def add(self, size: int) -> None:
        self.done += size
        now = self._clock()
        if now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            self._show(self.line())

    def finish(self) -> float:
        """Says the transfer's total and time; returns the seconds it took."""
        took = self._clock() - self._started
        self._show(f"{self.what}: {mib(self.done)} in {took:.1f} s", end="\n")
        return took

    def _show(self, text: str, end: str | None = None) -> None:
        if self._tty:
            self.stream.write(f"\r{text}\033[K" + (end or ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


class ChunkReader(io.RawIOBase):
    """A readable stream over byte chunks as they arrive, for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes], progress: Progress | None = None) -> None:
        self._chunks = chunks
        self._progress = progress
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
            if self._progress is not None:
                self._progress.add(len(chunk))
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def extract_run(chunks: Iterator[bytes], name: str, into: Path, progress: Progress) -> None:
    """The tar stream of run `name` (members `<name>/...`, `uerl runs pack`'s) unpacked
    into `into`, the run's own directory. Only regular files under `<name>/`; tarfile's
    `data` filter refuses links, devices and paths leaving `into`."""
    reader = io.BufferedReader(ChunkReader(chunks, progress), buffer_size=1 << 20)
    prefix = f"{name}/"
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for member in tar:
            if not member.isfile() or not member.name.startswith(prefix):
                raise RunStorageError(f"the run's archive holds {member.name!r}, not a file of it")
            member.name = member.name[len(prefix) :]
            tar.extract(member, into, filter="data")


def each_file(
    chunks: Iterator[bytes], name: str, take: Callable[[str, float, IO[bytes]], None]
) -> None:
    """The tar stream of run `name` (`uerl runs pack`'s) read as it arrives, each file
    given to `take(relative, mtime, its bytes)`: `uerl runs pull --follow`'s fetch."""
    reader = io.BufferedReader(ChunkReader(chunks), buffer_size=1 << 20)
    prefix = f"{name}/"
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for member in tar:
            if not member.isfile() or not member.name.startswith(prefix):
                raise RunStorageError(f"the run's archive holds {member.name!r}, not a file of it")
            source = tar.extractfile(member)
            assert source is not None  # a regular file's
            take(member.name[len(prefix) :], float(member.mtime), source)


def into_place(to: Path, name: str, *, replace: bool, fill: Callable[[Path], None]) -> Path:
    """`to/name` filled by `fill(directory)` and put in place whole; a pull that fails
    leaves what was there. An existing copy is replaced only with `replace`."""
    target = to / name
    if target.exists() and not replace:
        raise RunStorageError(
            f"--to: {target} exists (an earlier pull?); pass --replace to replace it, "
            "or another --to"
        )
    to.mkdir(parents=True, exist_ok=True)
    with atomic.directory(target) as partial:
        partial.mkdir()
        fill(partial)
    return target
