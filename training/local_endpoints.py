"""The endpoints object for a topology run on this machine by `uerl local`."""

from __future__ import annotations

from infra.endpoints import Endpoints, RayAddresses, Resources
from infra.topology import Topology
from training.local_games import HOST


def local_endpoints(
    topology: Topology, *, gcs_address: str, client_port: int, base_port: int
) -> Endpoints:
    """Endpoints for `LocalRayCluster` + `LocalMockGames` started from `topology`.

    Worker i's game is `127.0.0.1:base_port+i` (`per_worker`); discovery is the
    dedicated instance at `base_port` (networked) or worker 1's game (sidecar,
    where every "node" is this machine, so worker 1's game is a local game).
    """
    host = gcs_address.rsplit(":", 1)[0]
    if topology.has_dedicated_discovery:
        discovery = f"{HOST}:{base_port}"
    else:
        discovery = f"{HOST}:{base_port + 1}"
    return Endpoints(
        namespace="local",
        cluster_name=topology.name,
        pattern=topology.pattern,
        ray=RayAddresses(
            # The local head runs without a dashboard: there is no job URL to give.
            dashboard_url="",
            client_address=f"ray://{host}:{client_port}",
            gcs_address=gcs_address,
        ),
        discovery_endpoint=discovery,
        worker_url_template=HOST,
        port=base_port,
        port_offset_mode="per_worker",
        num_env_runners=topology.workers.replicas,
        num_learners=topology.learners.replicas,
        custom_resource=topology.workers.custom_resource,
        resources=Resources(
            cpus_per_learner=topology.learners.cpus,
            # No accelerators here: `uerl local` runs learners on CPU.
            gpus_per_learner=0,
            cpus_per_env_runner=topology.workers.cpus,
        ),
        simulator_startup_timeout_s=topology.simulator.startup_timeout_s,
    )
