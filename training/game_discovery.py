"""Discovery as the deployment pattern needs it.

networked: the driver asks the discovery endpoint directly (a Service it can reach).
sidecar: the game is only reachable from inside a worker pod (localhost), so a
Ray task scheduled on a node with the custom resource asks its local game. The
task takes a sliver of the resource, so it lands on a worker node yet never
holds a whole unit; it finishes before any env runner is created.
"""

from __future__ import annotations

from infra.endpoints import Endpoints
from training.discovery import GameSpec, discover

# Enough to pin the task to a worker node, far below the 1 unit an env runner needs.
TASK_RESOURCE_SLICE = 0.001
# On top of the game's own startup timeout: scheduling and worker start-up.
TASK_OVERHEAD_S = 60.0


class DiscoveryError(RuntimeError):
    """Discovery failed or timed out; the message names the endpoint and the pattern."""


def _discover_on_node(endpoint: str, timeout_s: float) -> GameSpec:
    return discover(endpoint, timeout_s=timeout_s)


def discover_game(endpoints: Endpoints, *, timeout_s: float | None = None) -> GameSpec:
    timeout = timeout_s or endpoints.simulator_startup_timeout_s
    endpoint = endpoints.discovery_endpoint
    try:
        if endpoints.pattern == "networked":
            return discover(endpoint, timeout_s=timeout)
        return _discover_via_worker_node(endpoints, timeout)
    except DiscoveryError:
        raise
    except Exception as exc:  # UEConnectionError, UEProtocolError, Ray task errors
        raise DiscoveryError(
            f"discovery against {endpoint} ({endpoints.pattern} pattern) failed: {exc}"
        ) from exc


def _discover_via_worker_node(endpoints: Endpoints, timeout_s: float) -> GameSpec:
    import ray

    task = ray.remote(_discover_on_node).options(
        num_cpus=0,
        resources={endpoints.custom_resource: TASK_RESOURCE_SLICE},
        max_retries=0,
    )
    ref = task.remote(endpoints.discovery_endpoint, timeout_s)
    try:
        return ray.get(ref, timeout=timeout_s + TASK_OVERHEAD_S)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise DiscoveryError(
            f"discovery task on a node with {endpoints.custom_resource!r} did not finish "
            f"within {timeout_s + TASK_OVERHEAD_S:.0f}s (game {endpoints.discovery_endpoint})"
        ) from None
    except ray.exceptions.RayTaskError as exc:
        raise DiscoveryError(
            f"discovery against {endpoints.discovery_endpoint} on a worker node failed: "
            f"{exc.cause if exc.cause is not None else exc}"
        ) from None
