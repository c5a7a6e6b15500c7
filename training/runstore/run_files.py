"""A stored run's files as every reader of run storage takes them: on a pyarrow
filesystem (a directory of a claim or this machine, or a bucket) under the run's root.
One way to read a small text file (a pointer, the attempts' record, a lease), where a
file gone meanwhile is no file, not an error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.endpoints import RunStorage


def read_text(filesystem: Any, path: str) -> str | None:
    """The text at `path` of `filesystem` (a pyarrow one), stripped; None when there is
    no such file (never written, or deleted since it was listed)."""
    try:
        with filesystem.open_input_stream(path) as stream:
            return str(stream.read().decode().strip())
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class RunFiles:
    """One run of a run storage: `filesystem` (pyarrow's) and the run's `root` on it."""

    filesystem: Any
    root: str

    @classmethod
    def of(cls, runs: RunStorage, run_name: str) -> RunFiles:
        """The run `run_name` of `runs`: a directory (`file://`) or a bucket (`s3://`)."""
        if runs.uri.startswith("file://"):
            from pyarrow import fs

            root = Path(runs.uri.removeprefix("file://")) / run_name
            return cls(fs.LocalFileSystem(), str(root))
        from training.runstore.bucket import S3Location

        location = S3Location.of(runs)
        return cls(location.filesystem(), location.key(run_name))

    def read_text(self, relative: str) -> str | None:
        """The run's text file `relative` (`checkpoints/latest`), None without it."""
        return read_text(self.filesystem, f"{self.root}/{relative}")
