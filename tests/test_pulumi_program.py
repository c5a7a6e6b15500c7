"""The program under Pulumi mocks, run as `pulumi up` runs it, config from Pulumi.dev.yaml."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from infra_fixtures import dev_topology, integral_floats_to_int, resources_of, run_program

from infra import manifests
from infra.endpoints import Endpoints

CHART = "kubernetes:helm.sh/v4:Chart::kuberay-operator"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
NETWORKED = ("topology.pattern=networked",)
UNREAL_LOADER = (
    "topology.pattern=networked",
    "topology.simulator.kind=unreal",
    "topology.executables.source_url=https://example.com/game.tar.gz",
)


@pytest.fixture(scope="module")
def sidecar() -> dict[str, Any]:
    return run_program()


@pytest.fixture(scope="module")
def networked() -> dict[str, Any]:
    return run_program(*NETWORKED)


@pytest.fixture(scope="module")
def unreal_loader() -> dict[str, Any]:
    return run_program(*UNREAL_LOADER)


def type_counts(report: dict[str, Any]) -> Counter[str]:
    assert report["error"] is None, report["error"]
    return Counter(r["type"] for r in report["resources"])


def test_sidecar_dev_stack_creates_operator_namespace_endpoints_and_raycluster(sidecar) -> None:
    assert type_counts(sidecar) == {
        "kubernetes:core/v1:Namespace": 1,
        "uerl:infra:KubeRayOperator": 1,
        "kubernetes:helm.sh/v4:Chart": 1,
        "uerl:infra:UerlRayCluster": 1,
        "kubernetes:core/v1:ConfigMap": 1,
        RAYCLUSTER: 1,
    }


def test_networked_dev_stack_adds_a_deployment_and_service_per_game(networked) -> None:
    counts = type_counts(networked)
    assert counts["kubernetes:apps/v1:Deployment"] == counts["kubernetes:core/v1:Service"] == 3
    assert set(resources_of(networked, "kubernetes:apps/v1:Deployment")) == {
        "ue-disc",
        "ue-1",
        "ue-2",
    }
    for game in resources_of(networked, "kubernetes:apps/v1:Deployment").values():
        assert game["parent"] == "uerl:infra:UeInstances::ue-instances"


def test_chart_is_pinned_to_the_configured_version(sidecar) -> None:
    (chart,) = resources_of(sidecar, "kubernetes:helm.sh/v4:Chart").values()
    assert chart["inputs"]["chart"] == "kuberay-operator"
    assert chart["inputs"]["version"] == "1.7.0"
    assert chart["inputs"]["repositoryOpts"] == {
        "repo": "https://ray-project.github.io/kuberay-helm/"
    }
    assert chart["dependencies"] == ["kubernetes:core/v1:Namespace::uerl"]


def test_local_chart_path_replaces_the_repository() -> None:
    report = run_program("topology.operator.chart_path=charts/kuberay-operator-1.7.0.tgz")
    (chart,) = resources_of(report, "kubernetes:helm.sh/v4:Chart").values()
    assert chart["inputs"]["chart"] == "charts/kuberay-operator-1.7.0.tgz"
    assert "repositoryOpts" not in chart["inputs"]


@pytest.mark.parametrize("run", ["sidecar", "networked"])
def test_raycluster_is_created_after_the_operator_chart(run: str, request) -> None:
    report = request.getfixturevalue(run)
    (cluster,) = resources_of(report, RAYCLUSTER).values()
    assert CHART in cluster["dependencies"]


def test_without_operator_install_there_is_no_chart_to_wait_for() -> None:
    report = run_program("topology.operator.install=false")
    assert "kubernetes:helm.sh/v4:Chart" not in type_counts(report)
    (cluster,) = resources_of(report, RAYCLUSTER).values()
    assert CHART not in cluster["dependencies"]


def test_games_wait_for_the_build_loader(unreal_loader) -> None:
    counts = type_counts(unreal_loader)
    assert (
        counts["kubernetes:batch/v1:Job"] == counts["kubernetes:core/v1:PersistentVolumeClaim"] == 1
    )
    for game in resources_of(unreal_loader, "kubernetes:apps/v1:Deployment").values():
        assert "kubernetes:batch/v1:Job::uerl-ue-loader" in game["dependencies"]


@pytest.mark.parametrize("run", ["sidecar", "networked", "unreal_loader"])
def test_exported_endpoints_parse_with_the_contract(run: str, request) -> None:
    report = request.getfixturevalue(run)
    assert report["error"] is None
    endpoints = Endpoints.from_obj(report["exports"])
    sets = {"sidecar": (), "networked": NETWORKED, "unreal_loader": UNREAL_LOADER}[run]
    assert endpoints == dev_topology(*sets).endpoints()


@pytest.mark.parametrize("run", ["sidecar", "networked", "unreal_loader"])
def test_registered_objects_are_exactly_the_rendered_ones(run: str, request) -> None:
    report = request.getfixturevalue(run)
    sets = {"sidecar": (), "networked": NETWORKED, "unreal_loader": UNREAL_LOADER}[run]
    expected = {
        (o["kind"], o["metadata"]["name"]): o
        for o in manifests.build(dev_topology(*sets)).objects()
    }
    registered = {
        (r["inputs"]["kind"], r["name"]): integral_floats_to_int(r["inputs"])
        for r in report["resources"]
        if r["custom"] and r["type"].startswith("kubernetes:") and "kind" in r["inputs"]
    }
    assert registered == expected


def test_every_kubernetes_resource_is_named_explicitly_after_its_object(networked) -> None:
    objects = [r for r in networked["resources"] if r["custom"] and "metadata" in r["inputs"]]
    assert len(objects) == 9
    for r in objects:
        assert r["inputs"]["metadata"]["name"] == r["name"]


def test_config_set_path_workers_replicas_4_rescales() -> None:
    report = run_program("topology.workers.replicas=4", *NETWORKED)
    (cluster,) = resources_of(report, RAYCLUSTER).values()
    assert cluster["inputs"]["spec"]["workerGroupSpecs"][1]["replicas"] == 4
    assert len(resources_of(report, "kubernetes:apps/v1:Deployment")) == 5
    assert report["exports"]["endpoints"]["num_env_runners"] == 4


@pytest.mark.parametrize(
    ("sets", "path"),
    [
        (("topology.workers.replicas=0",), "topology.workers.replicas"),
        (("topology.simulator.port=70000",), "topology.simulator.port"),
        (("topology.name=Not_A_Name",), "topology.name"),
        (("topology.learners.gpus=-1",), "topology.learners.gpus"),
        (("topology.wrokers.replicas=2",), "topology.wrokers"),
    ],
)
def test_invalid_config_fails_with_a_run_error_naming_the_path(
    sets: tuple[str, ...], path: str
) -> None:
    report = run_program(*sets)
    assert report["error"]["type"] == "RunError"
    assert report["error"]["message"].startswith("invalid topology (1 error):")
    assert path in report["error"]["message"]
    assert report["resources"] == []


def test_a_topology_that_is_not_a_map_fails_with_a_run_error() -> None:
    report = run_program(topology=["workers"])
    assert report["error"]["type"] == "RunError" and "topology" in report["error"]["message"]
