"""The stored run, as the supervisor needs it, read and kept on the Ray head:

- `python -m training.supervise.record RUN`: the newest attempt the run's record
  (`attempts.jsonl`) holds, for a supervisor that finds a head with no job of the run
  (the head and the supervisor lost together); one line of the job's log (PREFIX, then
  JSON).
- `... RUN --set-aside-traceback`: before each attempt, the `traceback.txt` a failed
  attempt left is renamed `traceback-attempt-N.txt` (N: the last attempt recorded), so a
  run that went on to succeed holds no traceback as its own.

The supervisor reaches nothing but the head's job API, and the runs claim is mounted on
the head only: both run there as (part of) a job. A bucket is reached with the head's
credentials.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from infra.endpoints import Endpoints
from training.run.endpoints_source import endpoints_file
from training.runstore import attempts
from training.runstore.run_files import RunFiles
from training.runstore.stored_run import staging_root

MODULE = "training.supervise.record"
PREFIX = "uerl-record: "
TRACEBACK = "traceback.txt"  # what training.run.outcome writes when a training fails


def stored_attempts(endpoints: Endpoints, run_name: str) -> list[dict[str, Any]]:
    """The run's attempts as stored; none for a run not stored yet."""
    runs = endpoints.runs
    if runs is None:
        return []
    text = RunFiles.of(runs, run_name).read_text(attempts.FILE) or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def set_aside(filesystem: Any, run_root: str, attempt: int) -> str | None:
    """Renames the run's traceback (in `filesystem`, a pyarrow one, under `run_root`)
    after `attempt`; the new name, or None when there is none."""
    from pyarrow import fs

    source = f"{run_root}/{TRACEBACK}"
    if filesystem.get_file_info(source).type != fs.FileType.File:
        return None
    # Never over another: an attempt that failed before it recorded itself leaves the
    # last recorded number unchanged, and that attempt's own traceback is kept.
    target, again = f"{run_root}/traceback-attempt-{attempt}.txt", 1
    while filesystem.get_file_info(target).type != fs.FileType.NotFound:
        again += 1
        target = f"{run_root}/traceback-attempt-{attempt}-{again}.txt"
    filesystem.move(source, target)
    return target


def set_aside_traceback(endpoints: Endpoints, run_name: str) -> list[str]:
    """The traceback a failed attempt left, renamed where the run is stored (and, for a
    bucket, in the head's copy the next attempt would upload again)."""
    from pyarrow import fs

    runs = endpoints.runs
    if runs is None:
        return []
    last = max((int(e["attempt"]) for e in stored_attempts(endpoints, run_name)), default=0)
    stored = RunFiles.of(runs, run_name)
    places: list[tuple[Any, str]] = [(stored.filesystem, stored.root)]
    if not runs.uri.startswith("file://"):
        places.append((fs.LocalFileSystem(), str(staging_root() / run_name)))
    moved = (set_aside(filesystem, root, last) for filesystem, root in places)
    return [target for target in moved if target is not None]


def parse(logs: str) -> int | None:
    """The last attempt a record job's log says; None if it says none (it failed)."""
    for line in logs.splitlines():
        if line.startswith(PREFIX):
            return int(json.loads(line.removeprefix(PREFIX))["last_attempt"])
    return None


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("run_name", metavar="RUN")
    parser.add_argument("--endpoints", metavar="FILE", help="default: the head's ConfigMap")
    parser.add_argument("--set-aside-traceback", action="store_true")
    args = parser.parse_args(list(argv))
    endpoints = Endpoints.from_file(endpoints_file(args.endpoints))
    if args.set_aside_traceback:
        try:
            for target in set_aside_traceback(endpoints, args.run_name):
                print(f"the last attempt's traceback.txt is now {target}", flush=True)
        except Exception as exc:  # the attempt trains all the same: said, not fatal
            print(f"traceback.txt not set aside: {exc}", flush=True)
        return 0
    numbers = [int(entry["attempt"]) for entry in stored_attempts(endpoints, args.run_name)]
    print(PREFIX + json.dumps({"last_attempt": max(numbers, default=0)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
