"""Run a small function on a node that advertises the custom resource.

In the sidecar pattern a game is reachable only from inside its worker pod
(localhost), so anything that must talk to it before training (the preflight
check, discovery) runs as a Ray task pinned to such a node. The task takes a
sliver of the resource: it lands on a worker node yet never holds a whole
unit, and it finishes before any env runner is created.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Enough to pin the task to a worker node, far below the 1 unit an env runner needs.
TASK_RESOURCE_SLICE = 0.001
# On top of the function's own timeout: scheduling and worker start-up.
TASK_OVERHEAD_S = 60.0


class WorkerNodeTaskError(RuntimeError):
    """The task timed out or raised; `cause` holds the task's own exception, if any."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def _invoke(call: Callable[[], T]) -> T:
    return call()


def run_on_worker_node(call: Callable[[], T], *, resource: str, timeout_s: float, what: str) -> T:
    """`call()` (e.g. a functools.partial) on a node with `resource`.

    Bounded by `timeout_s` (the call's own bound) plus scheduling overhead.
    """
    import ray

    task = ray.remote(_invoke).options(
        num_cpus=0, resources={resource: TASK_RESOURCE_SLICE}, max_retries=0
    )
    ref = task.remote(call)
    limit = timeout_s + TASK_OVERHEAD_S
    try:
        return ray.get(ref, timeout=limit)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise WorkerNodeTaskError(
            f"{what} on a node with {resource!r} did not finish within {limit:.0f}s"
        ) from None
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if exc.cause is not None else exc
        raise WorkerNodeTaskError(f"{what} on a worker node failed: {cause}", cause) from None
