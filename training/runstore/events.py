"""What a run says to its supervisor and to the tests, as machine-readable lines of its
log: `uerl-event: {"event": ..., ...}` (one JSON object). Readers take these, never the
prose beside them (a progress line's wording may change; an event's fields do not).

A person at a terminal reads the prose only: a stream that is a terminal is given the
log without its event lines (`for_stream`); a file, a pipe or a job's log has them all.

Events:
- `iteration` {iteration, env_steps, steps_per_s, return_mean, time_s, runners,
  unknown}: an iteration ended (the progress line's figures; `return_mean` null until an
  episode has finished, `runners` [healthy, total] or null without a runner count).
- `checkpoint_written` {checkpoint, iteration, mib, seconds, storing_s}: the driver wrote
  a checkpoint where the run is written (`seconds` in all, `storing_s` of it the run
  storage's, the rest RLlib's state).
- `checkpoint_stored` {checkpoint, iteration, uploaded_mib?, upload_s?}: the run's store
  holds this checkpoint whole and `latest` names it (on a claim once it is written; in a
  bucket once the mirror has uploaded it and then `latest`, with what it sent). A
  supervisor counts an attempt that stored one as progress.
- `head_stopping` {}: the attempt was stopped by its head's own stop (a drain, an
  eviction, a replacing `pulumi up`), not by a person: its supervisor goes on.
- `attempt` {attempt, job, following}: the supervisor submits attempt N as job `job`, or
  (`following`) follows it already running; the attempt's log it passes on follows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, TextIO

PREFIX = "uerl-event: "
ITERATION = "iteration"
CHECKPOINT_WRITTEN = "checkpoint_written"
CHECKPOINT_STORED = "checkpoint_stored"
HEAD_STOPPING = "head_stopping"
ATTEMPT = "attempt"
# Where the head's preStop hook (training.headstop.stop_jobs) marks that it is stopping
# the head's jobs, in the head pod's /tmp: a driver stopped then says so (HEAD_STOPPING),
# and its supervisor resumes the run on the next head rather than ending it as a run a
# person stopped.
HEAD_STOPPING_MARKER = "uerl-head-stopping"


def line(event: str, **fields: Any) -> str:
    """The log line saying `event` with `fields` (a NaN figure is null: JSON has none)."""
    clean = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in fields.items()}
    return PREFIX + json.dumps({"event": event, **clean}, sort_keys=True)


def is_terminal(stream: TextIO) -> bool:
    """Is `stream` a person's terminal (given no event lines)?"""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: not a person's
        return False


def for_stream(text: str, stream: TextIO) -> str:
    """`text` (whole lines) as `stream` is given it: without event lines on a terminal."""
    if PREFIX not in text or not is_terminal(stream):
        return text
    return "".join(
        entry for entry in text.splitlines(keepends=True) if not entry.startswith(PREFIX)
    )


def parse(text: str) -> Iterator[dict[str, Any]]:
    """The events in `text` (whole lines of a log), in order; a damaged one is skipped."""
    for entry in text.splitlines():
        start = entry.find(PREFIX)
        if start < 0:
            continue
        try:
            found = json.loads(entry[start + len(PREFIX) :])
        except ValueError:
            continue
        if isinstance(found, dict) and isinstance(found.get("event"), str):
            yield found


def _iteration_of(checkpoint: str) -> int | None:
    tail = checkpoint.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def checkpoint_stored(checkpoint: str, **sent: float) -> str:
    """The `checkpoint_stored` line of `checkpoint` (checkpoint_000004: iteration 4), with
    what its upload sent (`uploaded_mib`, `upload_s`) in a bucket."""
    return line(
        CHECKPOINT_STORED, checkpoint=checkpoint, iteration=_iteration_of(checkpoint), **sent
    )


def checkpoint_written(checkpoint: str, *, mib: float, seconds: float, storing_s: float) -> str:
    """The `checkpoint_written` line of `checkpoint`."""
    return line(
        CHECKPOINT_WRITTEN,
        checkpoint=checkpoint,
        iteration=_iteration_of(checkpoint),
        mib=round(mib, 3),
        seconds=round(seconds, 3),
        storing_s=round(storing_s, 3),
    )
