"""Preflight: check the cluster and the games match the endpoints before building anything.

Schola's setup waits forever when the learner count disagrees with what the
cluster can place, so every mismatch here becomes a `PreflightError` saying
what was expected and what the cluster has, within a bounded time.
"""

from __future__ import annotations

import math
import socket
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from infra.contract import GCS_PORT
from infra.endpoints import Endpoints
from training.preflight.on_worker_node import WorkerNodeTaskError, run_on_worker_node
from training.tls.config import TLSConfig, for_games

_EPS = 1e-9


class PreflightError(RuntimeError):
    """The cluster or the games do not match the endpoints; the message says how."""


@dataclass(frozen=True)
class NodeRoom:
    """What one alive Ray node has available right now."""

    node_id: str
    address: str
    cpus: float
    gpus: float
    custom: float
    # The node's total of the custom resource (available + held by running actors).
    custom_total: float = 0.0
    # Available units of the learner resource (learner nodes advertise one each).
    learner_units: float = 0.0

    def describe(self, resource: str) -> str:
        return (
            f"{self.address} ({self.node_id[:8]}): {self.cpus:g} CPU, {self.gpus:g} GPU, "
            f"{self.custom:g} {resource}"
        )


@dataclass
class PreflightReport:
    ray_address: str
    nodes: list[NodeRoom]
    custom_resource_total: float
    learner_placement: list[str] = field(default_factory=list)
    discovery_endpoint: str = ""
    elapsed_s: float = 0.0

    def summary(self) -> str:
        return (
            f"preflight ok in {self.elapsed_s:.1f}s: Ray at {self.ray_address} "
            f"({len(self.nodes)} nodes), {self.custom_resource_total:g} x custom resource, "
            f"learners on {self.learner_placement or ['the driver']}, "
            f"discovery {self.discovery_endpoint} answers"
        )


def split_host_port(endpoint: str, *, what: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise PreflightError(f"{what} {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def tcp_reachable(endpoint: str, *, timeout_s: float, what: str) -> None:
    host, port = split_host_port(endpoint.removeprefix("ray://"), what=what)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise PreflightError(
            f"{what} {host}:{port} is unreachable within {timeout_s:g}s: {exc}"
        ) from None


def grpc_ready(endpoint: str, *, timeout_s: float, what: str, tls: TLSConfig | None = None) -> None:
    """A gRPC server (HTTP/2 handshake done, over TLS if `tls`) answers at `endpoint`
    within the deadline."""
    import grpc

    from training.protocol.errors import UETLSError
    from training.tls.handshake import check_handshake, serves_tls

    tcp_reachable(endpoint, timeout_s=timeout_s, what=what)
    if tls is None:
        channel = grpc.insecure_channel(endpoint)
    else:
        try:
            check_handshake(endpoint, tls, timeout_s=timeout_s)
        except UETLSError as exc:
            raise PreflightError(f"{what}: {exc}") from None
        channel = grpc.secure_channel(endpoint, tls.credentials())
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        hint = ""
        if tls is None and serves_tls(endpoint):
            hint = " (it serves TLS: the endpoints object has no `tls` for it)"
        raise PreflightError(
            f"{what} {endpoint} accepts TCP but no gRPC server answered within {timeout_s:g}s{hint}"
        ) from None
    finally:
        channel.close()


def gcs_handshake(address: str, *, timeout_s: float) -> None:
    """Ray's GCS at `address` answers the first call `ray.init` makes of it (GetClusterId)
    within the deadline. `ray.init` against anything else listening there (an HTTP server,
    a game, the dashboard's port) retries for minutes, printing only Ray's own warnings."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    try:  # Ray's own channel: RAY_USE_TLS and token authentication, as ray.init has them
        from ray._private.grpc_utils import init_grpc_channel

        channel = init_grpc_channel(address)
    except ImportError:
        channel = grpc.insecure_channel(address)
    what = f"Ray GCS {address}"
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s
        )
    except grpc.RpcError as exc:
        code, detail = exc.code(), exc.details() or ""
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return  # Ray's GCS, asking for a token: ray.init says what it needs
        if code == grpc.StatusCode.UNIMPLEMENTED:
            reason = "is a gRPC server but not Ray's GCS (it has no NodeInfoGcsService)"
        elif "HTTP/2" in detail or "http1" in detail.lower():
            reason = "is not a gRPC server (it does not speak HTTP/2: a web server?)"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            reason = f"accepts TCP but did not answer Ray's GCS handshake within {timeout_s:g}s"
        else:
            reason = f"did not answer Ray's GCS handshake: {code.name}: {detail}"
        raise PreflightError(
            f"{what} {reason}; is this the GCS address (port {GCS_PORT} on a Ray head)?"
        ) from None
    finally:
        channel.close()


# What Ray Client's proxy answers when the server process for a new driver died at start.
CLIENT_SERVER_FAILED = "Starting Ray client server failed"
CLIENT_RETRY_DELAY_S = 1.0
# How often a run waiting for nodes (--wait-for-nodes) looks at them again.
NODES_POLL_S = 2.0


def connect_ray(
    address: str, *, timeout_s: float, runtime_env: dict[str, Any] | None = None
) -> None:
    """`ray.init` to an explicit address, never a local one, failing within the timeout.
    `runtime_env` is the job's (e.g. the console's worker setup hook)."""
    import ray

    if ray.is_initialized():
        return
    # ray.init to a dead GCS, or to something else listening there, retries for minutes:
    # probe the port, then the handshake.
    tcp_reachable(address, timeout_s=timeout_s, what="Ray GCS")
    if not address.startswith("ray://"):  # Ray Client's proxy has handshakes of its own
        gcs_handshake(address, timeout_s=timeout_s)
    kwargs: dict[str, Any] = {"logging_level": "warning"}
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    host, _ = split_host_port(address.removeprefix("ray://"), what="Ray address")
    if not address.startswith("ray://") and host.startswith("127."):
        # A loopback cluster (uerl local): the driver must claim the nodes' IP,
        # or Ray looks for a raylet on 127.0.0.1 that does not exist.
        kwargs["_node_ip_address"] = host
    try:
        ray.init(address=address, **kwargs)
    except ConnectionAbortedError as exc:
        if CLIENT_SERVER_FAILED not in str(exc):
            raise
        # Ray Client's proxy starts one server process per driver; one that dies while
        # starting leaves an empty log. Seen once in many runs: one more attempt.
        print(
            f"Ray Client at {address}: the cluster could not start a client server for "
            "this driver (its ray_client_server_*.err); trying once more",
            file=sys.stderr,
            flush=True,
        )
        ray.shutdown()
        time.sleep(CLIENT_RETRY_DELAY_S)
        ray.init(address=address, **kwargs)


def node_rooms(
    resource: str, *, learner_resource: str | None = None, timeout_s: float = 30.0
) -> list[NodeRoom]:
    """Available resources per alive node, as the GCS sees them now.

    A Ray Client driver (`ray://`) has no view of per-node usage (no state accessor),
    and node totals would hide another run's env runners: there the same query runs
    as a task on the cluster (0 CPU: it needs no room and takes none).
    """
    import ray

    if not ray.util.client.ray.is_connected():
        return _node_rooms_here(resource, learner_resource)
    task = ray.remote(_node_rooms_here).options(num_cpus=0, max_retries=0)
    ref = task.remote(resource, learner_resource)
    try:
        rooms: list[NodeRoom] = ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise PreflightError(
            f"the cluster did not report its nodes' available resources within "
            f"{timeout_s:g}s (asked by a Ray task, as this driver uses Ray Client)"
        ) from None
    return rooms


def _node_rooms_here(resource: str, learner_resource: str | None = None) -> list[NodeRoom]:
    """`node_rooms` in a process connected to the GCS (a driver or a Ray worker)."""
    import ray
    from ray._private import state

    available: dict[str, dict[str, Any]] = state.available_resources_per_node()
    rooms = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        total = node.get("Resources", {})
        res = available.get(node_id, total)
        rooms.append(
            NodeRoom(
                node_id=node_id,
                address=node.get("NodeManagerAddress", "?"),
                cpus=float(res.get("CPU", 0.0)),
                gpus=float(res.get("GPU", 0.0)),
                custom=float(res.get(resource, 0.0)),
                custom_total=float(total.get(resource, 0.0)),
                learner_units=float(res.get(learner_resource, 0.0)) if learner_resource else 0.0,
            )
        )
    return rooms


def fits(room_cpus: float, room_gpus: float, cpus: float, gpus: float) -> int:
    """How many items of (cpus, gpus) fit in one node's room."""
    counts = []
    if cpus > 0:
        counts.append(math.floor(room_cpus / cpus + _EPS))
    if gpus > 0:
        counts.append(math.floor(room_gpus / gpus + _EPS))
    return min(counts) if counts else 1_000_000


def place_learners(
    endpoints: Endpoints, rooms: list[NodeRoom]
) -> tuple[list[str], list[tuple[NodeRoom, float, float]]]:
    """Place env runners on custom-resource nodes, then X learners on what is left.

    Returns (learner node addresses, remaining room per node). A learner must
    fit whole on one node; learners may share a node that has room for several.
    With `learner_custom_resource`, only nodes advertising it take learners, one per
    unit (as Ray will place them).
    """
    pinned = endpoints.learner_custom_resource is not None
    res = endpoints.resources
    left = [(r, r.cpus, r.gpus) for r in rooms]
    units = [r.learner_units for r in rooms]
    # Env runners first: each takes a unit of the custom resource and its CPUs.
    runners = endpoints.num_env_runners
    for i, (room, cpus, gpus) in enumerate(left):
        take = min(
            runners,
            math.floor(room.custom + _EPS),
            fits(cpus, gpus, res.cpus_per_env_runner, 0),
        )
        left[i] = (room, cpus - take * res.cpus_per_env_runner, gpus)
        runners -= take
    placed: list[str] = []
    for _ in range(endpoints.num_learners):
        # Best fit: the node with the most CPU room that can take one more learner.
        candidates = [
            (cpus, i)
            for i, (_, cpus, gpus) in enumerate(left)
            if fits(cpus, gpus, res.cpus_per_learner, res.gpus_per_learner) >= 1
            and (not pinned or units[i] + _EPS >= 1)
        ]
        if not candidates:
            break
        _, i = max(candidates)
        room, cpus, gpus = left[i]
        left[i] = (room, cpus - res.cpus_per_learner, gpus - res.gpus_per_learner)
        units[i] -= 1
        placed.append(room.address)
    return placed, left


def _free_units(room: NodeRoom) -> float:
    """A node's units of the custom resource not held by env runners. Runners hold whole
    units for their life; a fraction held is a discovery probe's sliver, gone in moments."""
    return room.custom_total - math.floor(room.custom_total - room.custom + _EPS)


def check_resources(endpoints: Endpoints, rooms: list[NodeRoom]) -> list[str]:
    """Learner placement, or PreflightError saying what was expected vs what there is."""
    resource = endpoints.custom_resource
    res = endpoints.resources
    have_nodes = "\n    ".join(r.describe(resource) for r in rooms) or "(no alive nodes)"
    total = sum(_free_units(r) for r in rooms)
    need = endpoints.num_env_runners
    held = sum(r.custom_total for r in rooms) - total
    if total + _EPS < need and held > _EPS and total + held + _EPS >= need:
        # One unit per game, held by every env runner for its life: another run's
        # runners are on the games. Two runs must never share a game.
        raise PreflightError(
            f"the games are in use: another run's env runners hold {held:g} of "
            f"{total + held:g} unit(s) of {resource!r} (one per game), {need} needed. "
            "A training or evaluation run is still going on this cluster; wait for it or "
            "stop it (ray job stop / Ctrl-C) first."
        )
    if total + _EPS < need:
        raise PreflightError(
            f"custom resource {resource!r}: expected at least {need} (one per env runner, "
            f"num_env_runners={need}), the cluster has {total:g} available.\n"
            f"  nodes:\n    {have_nodes}\n"
            f"  Worker nodes must advertise it (ray start --resources='{{\"{resource}\": 1}}')."
        )
    runner_cpus = sum(
        min(math.floor(_free_units(r) + _EPS), fits(r.cpus, 0, res.cpus_per_env_runner, 0))
        for r in rooms
    )
    if runner_cpus < need:
        raise PreflightError(
            f"env runners: expected {need} x ({res.cpus_per_env_runner:g} CPU + 1 {resource}) "
            f"on nodes with {resource!r}, the cluster can place {runner_cpus}.\n"
            f"  nodes:\n    {have_nodes}"
        )
    placed, _ = place_learners(endpoints, rooms)
    if len(placed) < endpoints.num_learners:
        pin = endpoints.learner_custom_resource
        where = f"a node advertising {pin!r}, one unit per learner" if pin else "one node"
        units = f", {sum(r.learner_units for r in rooms):g} unit(s) of {pin!r}" if pin else ""
        raise PreflightError(
            f"learners: expected room for {endpoints.num_learners} learner(s) of "
            f"{res.cpus_per_learner:g} CPU + {res.gpus_per_learner:g} GPU each (a learner "
            f"must fit on {where}), the cluster has room for {len(placed)} after placing "
            f"{need} env runner(s){units}.\n  nodes (available):\n    {have_nodes}"
        )
    return placed


def check_discovery(endpoints: Endpoints, *, timeout_s: float) -> None:
    """The discovery game answers gRPC, asked from where discovery will ask it.

    Sidecar: the endpoint (localhost) only means something on a worker node, so
    the check runs as a Ray task there, pinned by a sliver of the custom resource.
    """
    what = "discovery endpoint"
    tls = for_games(endpoints.tls)
    if endpoints.pattern == "networked":
        grpc_ready(endpoints.discovery_endpoint, timeout_s=timeout_s, what=what, tls=tls)
        return
    try:
        run_on_worker_node(
            partial(
                grpc_ready, endpoints.discovery_endpoint, timeout_s=timeout_s, what=what, tls=tls
            ),
            resource=endpoints.custom_resource,
            timeout_s=timeout_s,
            what=f"{what} check",
        )
    except WorkerNodeTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, PreflightError) else exc
        raise PreflightError(f"{cause} (checked from a worker node)") from None


def preflight(
    endpoints: Endpoints,
    *,
    timeout_s: float = 30.0,
    ray_address: str | None = None,
    runtime_env: dict[str, Any] | None = None,
    nodes_wait_s: float = 0.0,
) -> PreflightReport:
    """Connect to Ray (if not connected), check resources and the discovery endpoint.
    `nodes_wait_s`: how long the nodes may take to offer what the run needs (a new head's
    workers rejoining it) before the shortfall is an error; 0 says it at once.

    Leaves Ray connected for the caller (the driver builds the algorithm next);
    the caller owns `ray.shutdown()`.
    """
    if endpoints.num_env_runners == 0:
        raise PreflightError(
            "the endpoints list no game (num_env_runners 0, topology.workers.replicas 0): "
            "nothing to train on. Scale up first (`pulumi config set --path "
            "topology.workers.replicas N` + `pulumi up`, or `uerl local --workers N`); a "
            "training that is already running pauses at 0 and goes on when games return."
        )
    start = time.monotonic()
    address = ray_address or endpoints.ray.gcs_address
    connect_ray(address, timeout_s=timeout_s, runtime_env=runtime_env)
    waiting_from = time.monotonic()
    while True:
        rooms = node_rooms(
            endpoints.custom_resource,
            learner_resource=endpoints.learner_custom_resource,
            timeout_s=timeout_s,
        )
        try:
            placement = check_resources(endpoints, rooms)
            break
        except PreflightError:
            if time.monotonic() - waiting_from >= nodes_wait_s:
                raise
            time.sleep(NODES_POLL_S)
    # The discovery check gets what the timeout has left, the wait for nodes aside.
    nodes_waited = time.monotonic() - waiting_from
    remaining = max(1.0, timeout_s - (time.monotonic() - start - nodes_waited))
    check_discovery(endpoints, timeout_s=remaining)
    return PreflightReport(
        ray_address=address,
        nodes=rooms,
        custom_resource_total=sum(r.custom for r in rooms),
        learner_placement=placement,
        discovery_endpoint=endpoints.discovery_endpoint,
        elapsed_s=time.monotonic() - start,
    )
