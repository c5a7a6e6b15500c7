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
    atomic.write_text(path, earlier + json.dumps(entry) + "\n")
    return entry


def read(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
