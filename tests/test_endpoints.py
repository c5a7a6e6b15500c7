"""The endpoints contract, as the infrastructure produces it for each pattern."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infra.endpoints import Endpoints, EndpointsError
from infra.topology import Topology

NETWORKED = Topology.parse({"pattern": "networked", "namespace": "rl", "workers": {"replicas": 4}})
SIDECAR = Topology.parse({"pattern": "sidecar", "learners": {"replicas": 2}})


def test_networked_endpoints_name_each_game_pod_under_the_headless_service() -> None:
    e = NETWORKED.endpoints()
    assert e.worker_url_template == "uerl-ue-{worker_index}.uerl-ue.rl.svc.cluster.local"
    assert e.worker_endpoint(3) == "uerl-ue-3.uerl-ue.rl.svc.cluster.local:50051"
    # The dedicated discovery game is ordinal 0 of the same StatefulSet.
    assert e.discovery_endpoint == "uerl-ue-0.uerl-ue.rl.svc.cluster.local:50051"


def test_networked_discovery_on_worker1_points_at_game_1() -> None:
    t = Topology.parse({"pattern": "networked", "simulator": {"discovery": "worker1"}})
    assert t.endpoints().discovery_endpoint == "uerl-ue-1.uerl-ue.uerl.svc.cluster.local:50051"


def test_sidecar_endpoints_point_at_localhost() -> None:
    e = SIDECAR.endpoints()
    assert e.worker_url_template == "localhost"
    assert e.worker_endpoint(2) == "localhost:50051"


def test_ray_addresses_use_the_head_service() -> None:
    ray = NETWORKED.endpoints().ray
    assert ray.client_address == "ray://uerl-head-svc.rl.svc.cluster.local:10001"
    assert ray.dashboard_url == "http://uerl-head-svc.rl.svc.cluster.local:8265"


def test_counts_port_mode_and_resource_name_come_from_the_topology() -> None:
    e = SIDECAR.endpoints()
    assert (e.num_env_runners, e.num_learners) == (2, 2)
    assert (e.port, e.port_offset_mode, e.custom_resource) == (50051, "fixed", "ue_worker")
    assert (e.schema_version, e.namespace, e.cluster_name, e.pattern) == (
        1,
        "uerl",
        "uerl",
        "sidecar",
    )


def test_stack_output_json_parses_with_the_contract() -> None:
    # `pulumi stack output --json` prints all outputs; `... output endpoints --json` just one.
    dumped = NETWORKED.endpoints().model_dump(mode="json")
    whole = json.dumps({"endpoints": dumped})
    assert Endpoints.from_json(whole) == NETWORKED.endpoints()
    assert Endpoints.from_json(json.dumps(dumped)) == NETWORKED.endpoints()


def test_a_missing_field_is_reported_by_name() -> None:
    data = NETWORKED.endpoints().model_dump(mode="json")
    del data["num_env_runners"]
    with pytest.raises(EndpointsError, match="num_env_runners"):
        Endpoints.from_obj(data)


def test_contract_and_topology_import_no_pulumi_or_ray() -> None:
    code = (
        "import sys, infra.endpoints, infra.topology, infra.render; "
        "heavy = {'pulumi', 'pulumi_kubernetes', 'ray', 'torch'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
