"""The endpoints object for a topology run on this machine by `uerl local`."""

from __future__ import annotations

from infra.endpoints import Endpoints, RayAddresses
from infra.topology import Topology
from training.local.games import HOST


def local_endpoints(
    topology: Topology,
    *,
    gcs_address: str,
    client_port: int,
    base_port: int,
    dashboard_url: str = "",
) -> Endpoints:
    """Endpoints for `LocalRayCluster` + `LocalMockGames` started from `topology`.

    Worker i's game is `127.0.0.1:base_port+i` (`per_worker`); discovery is the
    dedicated instance at `base_port` (networked) or worker 1's game (sidecar,
    where every "node" is this machine, so worker 1's game is a local game).
    """
    host = gcs_address.rsplit(":", 1)[0]
    discovery_port = base_port if topology.has_dedicated_discovery else base_port + 1
    # Everything but the addresses comes from the topology, exactly as on Kubernetes.
    deployed = topology.endpoints()
    return deployed.model_copy(
        update={
            "namespace": "local",
            "ray": RayAddresses(
                # "" when the local head runs without a dashboard (no job API).
                dashboard_url=dashboard_url,
                client_address=f"ray://{host}:{client_port}",
                gcs_address=gcs_address,
            ),
            "discovery_endpoint": f"{HOST}:{discovery_port}",
            "worker_url_template": HOST,
            "port": base_port,
            "port_offset_mode": "per_worker",
            # No accelerators here: `uerl local` runs learners on CPU.
            "resources": deployed.resources.model_copy(update={"gpus_per_learner": 0}),
        }
    )
