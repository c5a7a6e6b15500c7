"""The runs in a directory on this machine (`uerl runs list|pull --dir`): a runs claim
mounted here, or a run storage of `uerl train --run-dir`'s kind. Read as the head reads
the claim for `uerl runs pack` (training.runstore.listing), without the exec."""

from __future__ import annotations

import shutil
from pathlib import Path

from training.runs.follow import POINTER, RunState, StoredFile, Take
from training.runs.transfer import Progress
from training.runstore import listing
from training.runstore.location import RunStorageError


class DirectoryRuns:
    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            why = "is not a directory" if root.exists() else "no such directory"
            raise RunStorageError(f"--dir {root}: {why}")
        self.root = root

    @property
    def where(self) -> str:
        return str(self.root)

    def list(self) -> list[listing.RunSummary]:
        return listing.list_runs(self.root)

    def pull(self, name: str, into: Path, *, latest_only: bool, total: int | None) -> float:
        """Run `name` copied into `into`, checkpoints/latest (as read first) last."""
        progress = Progress(f"pulling {name}", total)
        latest, files = listing.plan(self.root, name, latest_only=latest_only)
        for relative, _ in files:
            target = into / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(self.root / name / relative, target)
            except FileNotFoundError:  # pruned since it was listed
                continue
            progress.add(target.stat().st_size)
        if latest is not None:
            (into / POINTER).parent.mkdir(parents=True, exist_ok=True)
            (into / POINTER).write_text(latest)
        return progress.finish()

    def state(self, name: str) -> RunState:
        try:
            data = listing.manifest(self.root, name)
        except FileNotFoundError:
            known = ", ".join(run.name for run in self.list()) or "none"
            raise RunStorageError(
                f"RUN {name!r}: no such run in {self.where} (runs: {known})"
            ) from None
        files = {rel: StoredFile(size, mtime) for rel, (size, mtime) in data["files"].items()}
        return RunState(data["lease"], data["latest"], files)

    def fetch(self, name: str, files: dict[str, StoredFile], take: Take) -> None:
        for relative in sorted(files, key=lambda r: (r == POINTER, r)):
            path = self.root / name / relative
            try:
                source = path.open("rb")
                mtime = path.stat().st_mtime
            except FileNotFoundError:  # pruned since it was listed
                continue
            with source:
                take(relative, mtime, source)
