"""Which env runners lost their Ray node: in the sidecar pattern a runner's game lives in
its own worker pod, so when KubeRay deletes a pod on a shrink, the runner on it is the
one that must leave, whatever its slot number."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# An actor in these states is not running on a live node: its pod went.
NOT_RUNNING = frozenset({"DEAD", "RESTARTING", "PENDING_CREATION", "DEPENDENCIES_UNREADY"})


def runners_whose_node_left(
    actors: dict[int, Any], worker_index: dict[int, int]
) -> tuple[set[int], str | None]:
    """Worker indices of the runners (RLlib's `{actor id: handle}`, `worker_index` maps actor
    ids to worker indices) whose actor is not alive on a live Ray node; and, when Ray's
    state API did not answer, why (then none are known to have left: nothing leaves on a
    guess, and the caller says what it does instead)."""
    import ray
    from ray.util.state import get_actor

    try:
        alive_nodes = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
        gone: set[int] = set()
        for actor_id, handle in actors.items():
            state = get_actor(id=handle._actor_id.hex(), timeout=5)
            if state is None or state.state in NOT_RUNNING or state.node_id not in alive_nodes:
                gone.add(worker_index[actor_id])
        return gone, None
    except Exception as exc:  # the dashboard's state API is down or slow: decide later
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        log.warning("could not read the env runners' nodes from Ray's state API: %s", reason)
        return set(), reason
