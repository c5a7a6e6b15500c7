"""Discovery: ask a game once for its training definition, as the deployment pattern needs.

networked: the driver asks the discovery endpoint directly (a Service it can reach).
sidecar: the game is only reachable from inside a worker pod (localhost), so a
Ray task on a node with the custom resource asks its local game
(`training.preflight.on_worker_node`).
"""

from __future__ import annotations

from functools import partial

from infra.endpoints import Endpoints
from training.clients.game_client import GymClient
from training.policies.game_spec import GameSpec, game_spec_from_definition
from training.preflight.on_worker_node import WorkerNodeTaskError, run_on_worker_node
from training.tls.config import TLSConfig, for_games


def discover(endpoint: str, *, timeout_s: float = 45.0, tls: TLSConfig | None = None) -> GameSpec:
    """Connect, read the training definition, send CLOSED. Raises UEConnectionError on timeout."""
    client = GymClient(endpoint, startup_timeout_s=timeout_s, request_timeout_s=timeout_s, tls=tls)
    try:
        client.connect()
        definition = client.training_definition()
    finally:
        client.close()
    return game_spec_from_definition(definition, endpoint)


class DiscoveryError(RuntimeError):
    """Discovery failed or timed out; the message names the endpoint and the pattern."""


def discover_game(endpoints: Endpoints, *, timeout_s: float | None = None) -> GameSpec:
    timeout = timeout_s or endpoints.simulator_startup_timeout_s
    endpoint = endpoints.discovery_endpoint
    try:
        if endpoints.pattern == "networked":
            return discover(endpoint, timeout_s=timeout, tls=for_games(endpoints.tls))
        return _discover_via_worker_node(endpoints, timeout)
    except DiscoveryError:
        raise
    except Exception as exc:  # UEConnectionError, UEProtocolError, Ray task errors
        raise DiscoveryError(
            f"discovery against {endpoint} ({endpoints.pattern} pattern) failed: {exc}"
        ) from exc


def _discover_via_worker_node(endpoints: Endpoints, timeout_s: float) -> GameSpec:
    try:
        return run_on_worker_node(
            partial(
                discover,
                endpoints.discovery_endpoint,
                timeout_s=timeout_s,
                tls=for_games(endpoints.tls),
            ),
            timeout_s=timeout_s,
            resource=endpoints.custom_resource,
            what=f"discovery against {endpoints.discovery_endpoint}",
        )
    except WorkerNodeTaskError as exc:
        raise DiscoveryError(str(exc)) from None
