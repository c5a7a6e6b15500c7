"""Hang guards, in one place: how long a test may wait for something before it is called
a hang. A guard is never a speed goal: each sits at several times the slowest honest run
seen on a loaded host (CI's 2 cores beside a Go build and the Kubernetes tier ran the ctde
run 5x slower than idle, 379 s against 75 s). A host known to be slower still scales them
all with UERL_TEST_TIME_FACTOR (a float, default 1, never less):

- pytest-timeout's limits (`pytest.mark.timeout(N)` with N for an idle-host guard, or
  pyproject's default) are scaled by conftest.py, once; don't wrap them in `guard`;
- a wait derived from them (`proc_tree.Deadline`, the `deadline` fixtures) follows;
- a fixed wait of its own (a game up, a line printed) is `guard(seconds)`: it keeps its
  ratio to the scaled pytest-timeout."""

from __future__ import annotations

import os

TIME_FACTOR_ENV = "UERL_TEST_TIME_FACTOR"


def time_factor() -> float:
    raw = os.environ.get(TIME_FACTOR_ENV, "").strip()
    if not raw:
        return 1.0
    factor = float(raw)
    if not factor >= 1.0:  # also NaN: a guard is never shortened
        raise ValueError(f"{TIME_FACTOR_ENV}={raw!r}: give a number of at least 1")
    return factor


def guard(seconds: float) -> float:
    """`seconds`, the hang guard for an idle host, scaled for this one."""
    return seconds * time_factor()


# A test's own Ray cluster: its nodes up within this. A node starts in seconds on an idle
# host; the product's default (120 s) left too little room for a loaded one.
CLUSTER_START_S = guard(300)
