"""Which checkpoints a run keeps (`runs.keep_checkpoints`, through the endpoints): the
newest K, the one `latest` names, and the best so far, the checkpoint of the iteration
with the highest episode return mean (what the run reports as its best, from its
`metrics.csv`). The rest are deleted as the run goes on: on the claim and in the head's
staging here, in the bucket by the mirror (`bucket_mirror.Mirror`), so a long run does not
fill its storage.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
from collections.abc import Collection, Iterable
from pathlib import Path

from training.runstore.listing import CHECKPOINTS, LATEST

METRICS = "metrics.csv"  # training.run.driver.CSV_NAME
# checkpoint_<iteration>, as training.run.checkpoints names them.
NAME = re.compile(r"^checkpoint_(\d+)$")


def iteration_of(name: str) -> int | None:
    match = NAME.match(name)
    return int(match.group(1)) if match else None


def checkpoint_names(directory: Path) -> set[str]:
    """The whole checkpoints in `directory` (no partial writes: their names differ)."""
    if not directory.is_dir():
        return set()
    return {p.name for p in directory.iterdir() if p.is_dir() and iteration_of(p.name) is not None}


def returns_by_iteration(run_dir: Path) -> dict[int, float]:
    """Each iteration's episode return mean from the run's metrics.csv (finite only)."""
    try:
        with (run_dir / METRICS).open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return {}
    out: dict[int, float] = {}
    for row in rows:
        try:
            iteration, value = int(float(row["iteration"])), float(row["episode_return_mean"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isnan(value):
            out[iteration] = value
    return out


def best(names: Iterable[str], returns: dict[int, float]) -> str | None:
    """The checkpoint of the best iteration among `names` (the newest of equals)."""
    scored = [
        (returns[iteration], iteration, name)
        for name in names
        if (iteration := iteration_of(name)) is not None and iteration in returns
    ]
    return max(scored)[2] if scored else None


def to_remove(
    names: Collection[str], keep: int, *, latest: str | None, best_name: str | None
) -> set[str]:
    """Of the checkpoints `names`, those retention deletes."""
    ordered = sorted(names, key=lambda name: iteration_of(name) or -1)
    kept = set(ordered[-keep:]) | {latest, best_name}
    return {name for name in names if name not in kept}


def latest_of(run_dir: Path) -> str | None:
    try:
        return (run_dir / CHECKPOINTS / LATEST).read_text().strip() or None
    except OSError:
        return None


def prune(run_dir: Path, keep: int, also: Collection[str] = ()) -> set[str]:
    """Deletes the run's local checkpoints retention does not keep; returns every name
    retention removes, of those here and of `also` (checkpoints stored elsewhere, e.g.
    in a bucket, an earlier attempt's)."""
    here = checkpoint_names(run_dir / CHECKPOINTS)
    names = here | set(also)
    removed = to_remove(
        names,
        keep,
        latest=latest_of(run_dir),
        best_name=best(names, returns_by_iteration(run_dir)),
    )
    for name in removed & here:
        shutil.rmtree(run_dir / CHECKPOINTS / name, ignore_errors=True)
    return removed
