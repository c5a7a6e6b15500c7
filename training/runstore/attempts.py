"""The run's record of its attempts (`attempts.jsonl`): when a supervised run started
again, why (the supervisor says, in UERL_ATTEMPT and UERL_ATTEMPT_REASON) and the
checkpoint it resumed from. One JSON object a line, appended; the file is rewritten
whole (training.runstore.atomic), so a reader never sees half a line."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.runstore import atomic

FILE = "attempts.jsonl"
ATTEMPT_VARIABLE = "UERL_ATTEMPT"  # training.supervise.supervisor sets these
REASON_VARIABLE = "UERL_ATTEMPT_REASON"
# The supervision an attempt is part of: its supervisor Job's uid (the pod's
# `batch.kubernetes.io/controller-uid` label, through the downward API).
SUPERVISION_VARIABLE = "UERL_SUPERVISION"


def from_environment(environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """(attempt, why) when a supervisor started this run; None otherwise."""
    env = os.environ if environ is None else environ
    try:
        attempt = int(env[ATTEMPT_VARIABLE])
    except (KeyError, ValueError):
        return None
    return attempt, env.get(REASON_VARIABLE, "")


NOT_RECORDED = (
    "not recorded by itself: it ended before its start reached the run (the run storage "
    "down past its wait, or the run's lease refused)"
)


def record(
    run_dir: Path, attempt: int, reason: str, *, resumed_from: str | None, iteration: int | None
) -> dict[str, Any]:
    entry = {
        "attempt": attempt,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reason": reason,
        "resumed_from": resumed_from,
        "iteration": iteration,
    }
    path = run_dir / FILE
    earlier = path.read_text() if path.is_file() else ""
    # Attempts that ended before their start reached the run (the store down past its
    # wait, the lease refused) recorded nothing: their numbers are recorded here, so the
    # record numbers every attempt, one after another.
    last = max((int(e["attempt"]) for e in _entries(earlier)), default=0)
    gaps = [
        {
            "attempt": missing,
            "started": None,
            "reason": NOT_RECORDED,
            "resumed_from": None,
            "iteration": None,
            "recorded_by": attempt,
        }
        for missing in range(last + 1, attempt)
    ]
    lines = "".join(json.dumps(e) + "\n" for e in [*gaps, entry])
    atomic.write_text(path, earlier + lines)
    return entry


def _entries(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / FILE
    if not path.is_file():
        return []
    return _entries(path.read_text())
