"""What a run says to its supervisor and to the tests, as machine-readable lines of its
log: `uerl-event: {"event": ..., ...}` (one JSON object). Readers take these, never the
prose beside them (a progress line's wording may change; an event's fields do not).

Events:
- `checkpoint_stored` {checkpoint, iteration}: the run's store holds this checkpoint whole
  and `latest` names it (on a claim once it is written; in a bucket once the mirror has
  uploaded it and then `latest`). A supervisor counts an attempt that stored one as
  progress.
- `head_stopping` {}: the attempt was stopped by its head's own stop (a drain, an
  eviction, a replacing `pulumi up`), not by a person: its supervisor goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

PREFIX = "uerl-event: "
CHECKPOINT_STORED = "checkpoint_stored"
HEAD_STOPPING = "head_stopping"
# Where the head's preStop hook (training.headstop.stop_jobs) marks that it is stopping
# the head's jobs, in the head pod's /tmp: a driver stopped then says so (HEAD_STOPPING),
# and its supervisor resumes the run on the next head rather than ending it as a run a
# person stopped.
HEAD_STOPPING_MARKER = "uerl-head-stopping"


def line(event: str, **fields: Any) -> str:
    """The log line saying `event` with `fields`."""
    return PREFIX + json.dumps({"event": event, **fields}, sort_keys=True)


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


def checkpoint_stored(checkpoint: str) -> str:
    """The `checkpoint_stored` line of `checkpoint` (checkpoint_000004: iteration 4)."""
    tail = checkpoint.rsplit("_", 1)[-1]
    return line(
        CHECKPOINT_STORED, checkpoint=checkpoint, iteration=int(tail) if tail.isdigit() else None
    )
