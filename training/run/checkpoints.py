"""Checkpoint layout: `<dir>/checkpoint_<iteration>/` plus `<dir>/latest` naming the newest.

Each checkpoint also holds `uerl.json` (iteration, env steps, algorithm) so
`--resume` can say what it continues from and refuse a different algorithm.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LATEST = "latest"
META = "uerl.json"


class CheckpointError(ValueError):
    """No usable checkpoint where one was asked for; the message names the path."""


@dataclass(frozen=True)
class CheckpointMeta:
    iteration: int
    env_steps_total: int
    algo: str


def save(algo: Any, directory: Path, meta: CheckpointMeta) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"checkpoint_{meta.iteration:06d}"
    algo.save_to_path(str(path.resolve()))
    (path / META).write_text(json.dumps(asdict(meta)))
    # Write-then-rename: a crash never leaves `latest` naming half a checkpoint.
    tmp = directory / f".{LATEST}.tmp"
    tmp.write_text(path.name)
    os.replace(tmp, directory / LATEST)
    return path


def read_meta(path: Path) -> CheckpointMeta:
    try:
        return CheckpointMeta(**json.loads((path / META).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path} is not a uerl checkpoint ({META}: {exc})") from None


def resolve(resume: str, checkpoint_dir: Path) -> Path:
    """`latest` -> the newest checkpoint in `checkpoint_dir`; otherwise a checkpoint path."""
    if resume != LATEST:
        path = Path(resume)
        if (path / LATEST).is_file():  # a checkpoint directory was given
            return resolve(LATEST, path)
        if not path.is_dir():
            raise CheckpointError(f"--resume {resume}: no such checkpoint directory")
        return path
    pointer = checkpoint_dir / LATEST
    try:
        path = checkpoint_dir / pointer.read_text().strip()
    except OSError:
        raise CheckpointError(
            f"--resume: no checkpoint in {checkpoint_dir} (no {LATEST} file); "
            "pass --checkpoint-dir of an earlier run or --resume PATH"
        ) from None
    if not path.is_dir():
        raise CheckpointError(f"--resume: {pointer} names {path}, which does not exist")
    return path
