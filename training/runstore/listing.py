"""What a run storage holds, read where the files are: the runs under a directory
summarized, and one run packed as a tar stream (whole, or its latest checkpoint with
everything else the run wrote: curves, metrics, events, logs).

On a cluster the runs claim is mounted only on the Ray head, so `uerl runs` runs these
there through the Kubernetes API (`uerl runs list|pack --dir`, an exec in the head's Ray
container), and the laptop needs neither a path into the pod nor kubectl. A bucket's runs
are summarized by the same rules (`training.runs.bucket_reader`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from training.runstore.atomic import PARTIAL_PREFIX

CHECKPOINTS = "checkpoints"
LATEST = "latest"
META = "uerl.json"  # training.run.checkpoints.META
# The run's writers' leases (training.runstore.lease), not files of the run: one file per
# generation, `lease/000000007.json`, the highest the one that counts.
LEASE = "lease"
LEGACY_LEASE = "lease.json"  # a run stored before the leases had generations


def is_lease(relative: str) -> bool:
    """Whether the run's file at `relative` is a lease, not a file of the run."""
    return relative == LEGACY_LEASE or relative.split("/", 1)[0] == LEASE


def lease_name(generation: int) -> str:
    return f"{LEASE}/{generation:09d}.json"


def lease_generation(relative: str) -> int | None:
    """The generation of the lease at `relative` (as `lease_name` names it), else None."""
    head, _, name = relative.partition("/")
    stem = name.removesuffix(".json")
    if head != LEASE or "/" in name or not name.endswith(".json") or not stem.isdigit():
        return None
    return int(stem)


def held_lease(texts: dict[int, str | None]) -> str | None:
    """What a reader takes for the run's lease, from its leases' texts by generation: the
    newest's text while the run goes on (its writer holds it, or it is a supervised run's
    failed attempt's: the supervisor's next attempt carries the run on); None once the
    run has ended (released otherwise) or when there is none."""
    if not texts:
        return None
    text = texts[max(texts)]
    if text is None:
        return None
    try:
        record = json.loads(text)
        ended = bool(record.get("released")) and not (
            record.get("supervised") and record.get("ended") not in (0, None)
        )
    except (ValueError, AttributeError):
        ended = False  # damaged: a writer may still hold it
    return None if ended else text


def next_attempt_awaited(text: str | None) -> bool:
    """Whether the lease a reader holds (`held_lease`) is a supervised run's failed
    attempt's, released: the run waits for the supervisor's next attempt."""
    try:
        return text is not None and bool(json.loads(text).get("released"))
    except (ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class RunSummary:
    """One stored run, as `uerl runs list` shows it."""

    name: str
    checkpoint: str | None  # the one `checkpoints/latest` names; None: none yet
    iteration: int | None
    env_steps: int | None
    updated: float  # the newest file's modification time (seconds since the epoch)
    size: int  # bytes, every file of the run

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        return cls(**data)


def hidden(relative: str) -> bool:
    """A file no reader takes: a write in progress (or a crashed one's leftover)."""
    return any(part.startswith(PARTIAL_PREFIX) for part in relative.split("/"))


def wanted(relative: str, latest: str | None, *, latest_only: bool) -> bool:
    """Whether a pull takes the run's file at `relative` (a POSIX path in the run):
    never a partial write or the lease; with `latest_only`, no checkpoint but the latest."""
    if hidden(relative) or is_lease(relative):
        return False
    if not latest_only or not relative.startswith(f"{CHECKPOINTS}/"):
        return True
    return relative == f"{CHECKPOINTS}/{LATEST}" or (
        latest is not None and relative.startswith(f"{CHECKPOINTS}/{latest}/")
    )


def read_checkpoint_meta(text: str) -> tuple[int | None, int | None]:
    """(iteration, env steps) from a checkpoint's uerl.json; Nones if unreadable."""
    try:
        meta = json.loads(text)
        return int(meta["iteration"]), int(meta["env_steps_total"])
    except (ValueError, KeyError, TypeError):
        return None, None


def within(run_dir: Path, relative: str) -> Path | None:
    """Where the run's file at `relative` (a store's key, below the run) goes under
    `run_dir`; None when that is not inside it (`..`, a `//` key's absolute rest, the
    run itself): a store's keys are not trusted to stay in the run, as tarfile's `data`
    filter does not trust an archive's names."""
    if not relative or relative.startswith("/"):
        return None
    base = os.path.realpath(run_dir)
    target = os.path.realpath(os.path.join(base, relative))
    if target == base or os.path.commonpath([base, target]) != base:
        return None
    return run_dir / relative


def checkpoint_manifest(text: str) -> dict[str, int] | None:
    """The files a checkpoint's META names (relative to the checkpoint -> bytes); None
    when it names none (a checkpoint written before the manifest) or is unreadable."""
    try:
        files = json.loads(text).get("files")
    except (ValueError, AttributeError):
        return None
    if not isinstance(files, dict):
        return None
    return {str(name): int(size) for name, size in files.items() if isinstance(size, int)}


def holds_whole(
    name: str, meta_text: str | None, stored: Mapping[str, int] | Collection[str]
) -> bool:
    """Whether `stored` (relative path in the run -> bytes, or names only) holds checkpoint
    `name` whole: its META reads, and each file the META names is there at its size."""
    if meta_text is None or read_checkpoint_meta(meta_text)[0] is None:
        return False
    manifest = checkpoint_manifest(meta_text)
    if manifest is None:
        return True  # written before the manifest: its META, stored last, says whole
    for relative, size in manifest.items():
        key = f"{CHECKPOINTS}/{name}/{relative}"
        if key not in stored:
            return False
        if isinstance(stored, Mapping) and stored[key] != size:
            return False
    return True


def whole_checkpoint(
    named: str | None,
    relatives: Mapping[str, int] | Collection[str],
    read: Callable[[str], str | None],
) -> str | None:
    """The checkpoint a reader of a bucket takes: the one `latest` names (`named`) when
    the bucket holds it whole, else the newest it holds whole; None if none. Whole: its
    META, stored after its other files, is there and reads, and each file it names is
    stored at its size (`read(relative)` gives a stored file's text, None if absent;
    `relatives` the stored files, with their sizes where known)."""

    def whole(name: str) -> bool:
        relative = f"{CHECKPOINTS}/{name}/{META}"
        text = read(relative) if relative in relatives else None
        return holds_whole(name, text, relatives)

    if named is not None and whole(named):
        return named
    stored = {
        relative.split("/")[1]
        for relative in relatives
        if relative.startswith(f"{CHECKPOINTS}/") and relative.endswith(f"/{META}")
    }
    # Newest first: checkpoint_<iteration, six digits> sorts by iteration.
    return next((name for name in sorted(stored, reverse=True) if whole(name)), None)


def _files(run_dir: Path) -> Iterator[tuple[str, os.stat_result]]:
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        if hidden(relative):
            continue
        try:
            stat = path.stat()
        except FileNotFoundError:  # a checkpoint pruned while we walk
            continue
        if path.is_file():
            yield relative, stat


def _latest(run_dir: Path) -> str | None:
    try:
        name = (run_dir / CHECKPOINTS / LATEST).read_text().strip()
    except OSError:
        return None
    return name or None


def summarize(run_dir: Path) -> RunSummary:
    latest = _latest(run_dir)
    iteration = env_steps = None
    if latest is not None:
        with contextlib.suppress(OSError):
            iteration, env_steps = read_checkpoint_meta(
                (run_dir / CHECKPOINTS / latest / META).read_text()
            )
    updated, size = run_dir.stat().st_mtime, 0
    for _, stat in _files(run_dir):
        updated, size = max(updated, stat.st_mtime), size + stat.st_size
    return RunSummary(run_dir.name, latest, iteration, env_steps, updated, size)


def list_runs(root: Path) -> list[RunSummary]:
    """Every run under `root` (a directory each), oldest first; [] when `root` is absent."""
    if not root.is_dir():
        return []
    runs = [
        summarize(path)
        for path in root.iterdir()
        if path.is_dir() and not path.name.startswith(".")
    ]
    return sorted(runs, key=lambda run: (run.updated, run.name))


def manifest(root: Path, name: str) -> dict[str, Any]:
    """Run `name` as a follower of it compares it with its copy (`uerl runs pack
    --manifest`): `lease` (the text of its writer's lease, None when no writer holds it:
    the run has ended), `latest` (the checkpoint `checkpoints/latest` names) and `files`
    (relative path -> [size, modification time]; no partial write, no lease). The lease
    is read first: read absent, the files listed after it are the run's last.
    FileNotFoundError when there is no such run."""
    run_dir = root / name
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run {name!r} in {root}")
    lease = held_lease(_lease_texts(run_dir))
    files = {
        relative: [stat.st_size, stat.st_mtime]
        for relative, stat in _files(run_dir)
        if not is_lease(relative)
    }
    return {"lease": lease, "latest": _latest(run_dir), "files": files}


def _lease_texts(run_dir: Path) -> dict[int, str | None]:
    texts: dict[int, str | None] = {}
    with contextlib.suppress(FileNotFoundError):
        for path in (run_dir / LEASE).iterdir():
            generation = lease_generation(f"{LEASE}/{path.name}")
            if generation is not None:
                try:
                    texts[generation] = path.read_text()
                except FileNotFoundError:  # an older one, removed by the newest's writer
                    continue
    return texts


def selected(relative: str, only: Collection[str] | None) -> bool:
    """Whether `relative` is one of `only` (a path, or a directory as `DIR/`: all below
    it); every file when `only` is None."""
    if only is None:
        return True
    return relative in only or any(
        entry.endswith("/") and relative.startswith(entry) for entry in only
    )


def plan(
    root: Path, name: str, *, latest_only: bool, only: Collection[str] | None = None
) -> tuple[str | None, list[tuple[str, int]]]:
    """What `pack` sends of run `name`: the checkpoint `latest` names (read once, now)
    and the files with their sizes, `checkpoints/latest` aside; with `only`, only those
    (`selected`). FileNotFoundError when there is no such run."""
    run_dir = root / name
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run {name!r} in {root}")
    latest = _latest(run_dir)
    pointer = f"{CHECKPOINTS}/{LATEST}"
    files = [
        (relative, stat.st_size)
        for relative, stat in _files(run_dir)
        if relative != pointer
        and wanted(relative, latest, latest_only=latest_only)
        and selected(relative, only)
    ]
    return latest, files


def pack(
    root: Path, name: str, latest: str | None, files: list[tuple[str, int]], out: IO[bytes]
) -> int:
    """Writes `plan`'s files of run `name` to `out` as a tar stream (members
    `<name>/...`), then `checkpoints/latest` as `plan` read it: the pulled copy's
    `latest` names a checkpoint the stream holds whole even while the run goes on.
    Returns the bytes of file data packed."""
    run_dir = root / name
    packed = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for relative, _ in files:
            try:
                with (run_dir / relative).open("rb") as fh:
                    info = tar.gettarinfo(fileobj=fh, arcname=f"{name}/{relative}")
                    tar.addfile(info, fh)
                    packed += info.size
            except FileNotFoundError:  # pruned since it was listed
                continue
        if latest is not None:
            data = latest.encode()
            info = tarfile.TarInfo(f"{name}/{CHECKPOINTS}/{LATEST}")
            try:  # the pointer's own time: a follow compares it with the manifest's
                mtime = (run_dir / CHECKPOINTS / LATEST).stat().st_mtime
            except OSError:
                mtime = run_dir.stat().st_mtime
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return packed
