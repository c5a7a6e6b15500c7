"""The program under Pulumi mocks, run as `pulumi up` runs it, config from Pulumi.dev.yaml."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_fixtures import (
    KUBERAY_CHART,
    OWN_CLUSTER,
    PROJECT_ROOT,
    SERVICE_ACCOUNT,
    dev_topology,
    integral_floats_to_int,
    resources_of,
    run_program,
)

from infra import manifests
from infra.endpoints import Endpoints

CHART = "kubernetes:helm.sh/v4:Chart::kuberay-operator"
CRDS = "pulumi-python:dynamic/uerl:KubeRayCRDs"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
TRAINING_CLUSTER = "uerl:index:TrainingCluster"
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


@pytest.fixture(scope="module")
def own_cluster() -> dict[str, Any]:
    return run_program(*OWN_CLUSTER)


def type_counts(report: dict[str, Any]) -> Counter[str]:
    assert report["error"] is None, report["error"]
    return Counter(r["type"] for r in report["resources"])


def test_sidecar_dev_stack_creates_operator_namespace_endpoints_and_raycluster(sidecar) -> None:
    assert type_counts(sidecar) == {
        TRAINING_CLUSTER: 1,
        "kubernetes:core/v1:Namespace": 1,
        "uerl:infra:KubeRayOperator": 1,
        CRDS: 1,
        "kubernetes:helm.sh/v4:Chart": 1,
        "uerl:infra:UerlRayCluster": 1,
        "kubernetes:core/v1:ConfigMap": 1,
        RAYCLUSTER: 1,
        "uerl:infra:StackNetworkPolicies": 1,
        # Ray's (sidecar games inside), and the run supervisors' way to the head's job API.
        "kubernetes:networking.k8s.io/v1:NetworkPolicy": 2,
        "uerl:infra:RunStorage": 1,
        CLAIM: 1,  # the runs'
        # Which take back the runs' claim, and its namespace, that destroy left.
        "pulumi:providers:kubernetes": 2,
    }


STATEFULSET = "kubernetes:apps/v1:StatefulSet"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
SERVICE = "kubernetes:core/v1:Service"


def test_networked_dev_stack_adds_one_statefulset_and_one_service_for_all_games(networked) -> None:
    counts = type_counts(networked)
    assert (counts[STATEFULSET], counts[SERVICE], counts["kubernetes:apps/v1:Deployment"]) == (
        1,
        1,
        0,
    )
    for game in (
        *resources_of(networked, STATEFULSET).values(),
        *resources_of(networked, SERVICE).values(),
    ):
        assert game["name"] == "uerl-ue"
        assert game["parent"] == "uerl:infra:UeGames::ue-games"


@pytest.mark.parametrize("replicas", [10, 100])
def test_resource_count_does_not_grow_with_the_number_of_games(replicas: int) -> None:
    report = run_program(*NETWORKED, f"topology.workers.replicas={replicas}")
    assert sum(type_counts(report).values()) == sum(type_counts(run_program(*NETWORKED)).values())
    (games,) = resources_of(report, STATEFULSET).values()
    assert games["inputs"]["spec"]["replicas"] == replicas + 1


def test_chart_is_pinned_to_the_configured_version(sidecar) -> None:
    (chart,) = resources_of(sidecar, "kubernetes:helm.sh/v4:Chart").values()
    assert chart["inputs"]["chart"] == "kuberay-operator"
    assert chart["inputs"]["version"] == "1.7.0"
    assert chart["inputs"]["repositoryOpts"] == {
        "repo": "https://ray-project.github.io/kuberay-helm/"
    }
    assert chart["dependencies"] == ["kubernetes:core/v1:Namespace::uerl", f"{CRDS}::kuberay-crds"]


# Relative to the project root, as a user would set it.
LOCAL_CHART = KUBERAY_CHART.relative_to(PROJECT_ROOT).as_posix()


def test_relative_chart_path_resolves_against_the_project_root_not_infra() -> None:
    # Pulumi runs the program (and the provider that reads the chart) in infra/.
    report = run_program(f"topology.operator.chart_path={LOCAL_CHART}")
    (chart,) = resources_of(report, "kubernetes:helm.sh/v4:Chart").values()
    assert chart["inputs"]["chart"] == str((PROJECT_ROOT / LOCAL_CHART).resolve())
    assert "repositoryOpts" not in chart["inputs"]


def test_local_chart_of_another_version_fails_naming_chart_version() -> None:
    report = run_program(
        f"topology.operator.chart_path={LOCAL_CHART}", "topology.operator.chart_version=1.6.0"
    )
    assert report["error"]["type"] == "RunError"
    message = report["error"]["message"]
    assert "topology.operator.chart_version" in message and "'1.7.0'" in message


def test_missing_local_chart_fails_naming_chart_path() -> None:
    report = run_program("topology.operator.chart_path=charts/nope.tgz")
    assert report["error"]["type"] == "RunError"
    assert "topology.operator.chart_path" in report["error"]["message"]
    assert str(PROJECT_ROOT / "charts" / "nope.tgz") in report["error"]["message"]


def test_operator_values_are_passed_to_the_chart() -> None:
    report = run_program("topology.operator.values.image.repository=mirror.local/kuberay/operator")
    (chart,) = resources_of(report, "kubernetes:helm.sh/v4:Chart").values()
    assert chart["inputs"]["values"] == {"image": {"repository": "mirror.local/kuberay/operator"}}


def crds_of(report: dict[str, Any]) -> dict[str, Any] | None:
    found = list(resources_of(report, CRDS).values())
    assert len(found) <= 1, found
    return found[0] if found else None


def test_crds_are_one_resource_the_chart_waits_for_and_the_chart_skips_its_own(sidecar) -> None:
    crds = crds_of(sidecar)
    assert crds is not None and crds["inputs"]["mode"] == "install"
    (chart,) = resources_of(sidecar, "kubernetes:helm.sh/v4:Chart").values()
    assert chart["inputs"]["skipCrds"] is True
    assert f"{CRDS}::kuberay-crds" in chart["dependencies"]
    assert chart["providers"] == {}  # the default provider: nothing adopted


def test_the_crds_resource_holds_a_digest_and_a_path_not_the_4_mb_of_crds(sidecar) -> None:
    inputs = crds_of(sidecar)["inputs"]  # type: ignore[index]
    assert len(json.dumps(inputs)) < 10_000
    bundle = Path(inputs["path"])
    assert hashlib.sha256(bundle.read_bytes()).hexdigest() == inputs["digest"]
    names = {
        d["metadata"]["name"] for d in yaml.load_all(bundle.read_text(), yaml.CSafeLoader) if d
    }
    assert names == {
        f"{kind}.ray.io" for kind in ("rayclusters", "rayjobs", "rayservices", "raycronjobs")
    }


def test_the_crds_digest_follows_the_chart(tmp_path: Path) -> None:
    chart = tmp_path / "kuberay-operator"
    shutil.copytree(KUBERAY_CHART, chart)
    before = crds_of(run_program(f"topology.operator.chart_path={chart}"))["inputs"]  # type: ignore[index]
    crd = chart / "crds" / "ray.io_rayjobs.yaml"
    crd.write_text(crd.read_text() + "# the next chart's CRD\n")
    after = crds_of(run_program(f"topology.operator.chart_path={chart}"))["inputs"]  # type: ignore[index]
    assert before["digest"] != after["digest"] and before["version"] == after["version"]


def test_crds_skip_leaves_existing_crds_alone() -> None:
    report = run_program("topology.operator.crds=skip")
    assert crds_of(report) is None
    (chart,) = resources_of(report, "kubernetes:helm.sh/v4:Chart").values()
    assert chart["inputs"]["skipCrds"] is True


def test_crds_adopt_takes_over_the_crds_and_installs_the_chart_through_an_upserting_provider() -> (
    None
):
    report = run_program("topology.operator.crds=adopt")
    assert crds_of(report)["inputs"]["mode"] == "adopt"  # type: ignore[index]
    provider = resources_of(report, "pulumi:providers:kubernetes")["kuberay-adopt"]
    assert provider["inputs"]["upsertExistingObjects"] == "true"
    assert provider["inputs"]["enablePatchForce"] == "true"
    (chart,) = resources_of(report, "kubernetes:helm.sh/v4:Chart").values()
    # A provider reference is "<provider URN>::<id>"; the URN's stack/project part is
    # whatever the mocks call them (it differs between SDK versions).
    urn = chart["providers"]["kubernetes"].rsplit("::", 1)[0]
    assert urn.endswith("::uerl:infra:KubeRayOperator$pulumi:providers:kubernetes::kuberay-adopt")


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
    # The build's claim and the runs'.
    assert (counts["kubernetes:batch/v1:Job"], counts[CLAIM]) == (1, 2)
    games = [
        *resources_of(unreal_loader, STATEFULSET).values(),
        *resources_of(unreal_loader, SERVICE).values(),
    ]
    assert len(games) == 2
    for game in games:
        assert "kubernetes:batch/v1:Job::uerl-ue-loader" in game["dependencies"]


def test_loader_job_is_awaited_by_its_annotation_not_a_custom_timeout(unreal_loader) -> None:
    (job,) = resources_of(unreal_loader, "kubernetes:batch/v1:Job").values()
    # A customTimeouts option would override the annotation the topology sets.
    assert job["customTimeouts"] is None
    assert job["inputs"]["metadata"]["annotations"]["pulumi.com/timeoutSeconds"] == "3600"


def test_raycluster_carries_the_await_annotations_pulumi_reads(sidecar) -> None:
    (cluster,) = resources_of(sidecar, RAYCLUSTER).values()
    annotations = cluster["inputs"]["metadata"]["annotations"]
    assert set(annotations) == {"pulumi.com/waitFor", "pulumi.com/timeoutSeconds"}


@pytest.mark.parametrize("run", ["sidecar", "networked", "unreal_loader"])
def test_exported_endpoints_parse_with_the_contract(run: str, request) -> None:
    report = request.getfixturevalue(run)
    assert report["error"] is None
    endpoints = Endpoints.from_obj(report["exports"])
    sets = {"sidecar": (), "networked": NETWORKED, "unreal_loader": UNREAL_LOADER}[run]
    assert endpoints == dev_topology(*sets).endpoints()


@pytest.mark.parametrize("run", ["sidecar", "networked", "unreal_loader", "own_cluster"])
def test_registered_objects_are_exactly_the_rendered_ones(run: str, request) -> None:
    report = request.getfixturevalue(run)
    sets = {
        "sidecar": (),
        "networked": NETWORKED,
        "unreal_loader": UNREAL_LOADER,
        "own_cluster": OWN_CLUSTER,
    }[run]
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
    # Namespace, ConfigMap, RayCluster, StatefulSet, Service, three NetworkPolicies (Ray's,
    # the games', the supervisors' to the head), the runs' claim.
    assert len(objects) == 9
    for r in objects:
        assert r["inputs"]["metadata"]["name"] == r["name"]


def test_config_set_path_workers_replicas_4_rescales() -> None:
    report = run_program("topology.workers.replicas=4", *NETWORKED)
    (cluster,) = resources_of(report, RAYCLUSTER).values()
    assert cluster["inputs"]["spec"]["workerGroupSpecs"][1]["replicas"] == 4
    (games,) = resources_of(report, STATEFULSET).values()
    assert games["inputs"]["spec"]["replicas"] == 5
    assert report["exports"]["endpoints"]["num_env_runners"] == 4


@pytest.mark.parametrize(
    ("sets", "path"),
    [
        (("topology.workers.replicas=-1",), "topology.workers.replicas"),
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


def test_node_selector_value_true_set_with_config_set_path_reaches_the_pods_as_text() -> None:
    report = run_program('topology.learners.node_selector["nvidia.com/gpu.present"]=true')
    assert report["error"] is None, report["error"]
    (cluster,) = resources_of(report, RAYCLUSTER).values()
    learners = cluster["inputs"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert learners["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


SERVICE_ACCOUNT_TYPE = "kubernetes:core/v1:ServiceAccount"


def test_a_created_service_account_is_one_resource_of_its_component(own_cluster) -> None:
    (account,) = resources_of(own_cluster, SERVICE_ACCOUNT_TYPE).values()
    assert account["name"] == SERVICE_ACCOUNT
    assert account["parent"] == "uerl:infra:StackServiceAccounts::service-accounts"


def test_every_pod_waits_for_the_account_it_runs_as(own_cluster) -> None:
    pods = [
        *resources_of(own_cluster, RAYCLUSTER).values(),
        *resources_of(own_cluster, STATEFULSET).values(),
        *resources_of(own_cluster, "kubernetes:batch/v1:Job").values(),
    ]
    assert len(pods) == 3
    for pod in pods:
        assert f"{SERVICE_ACCOUNT_TYPE}::{SERVICE_ACCOUNT}" in pod["dependencies"], pod["name"]


def test_without_an_account_to_create_the_stack_has_no_account_component(sidecar) -> None:
    assert "uerl:infra:StackServiceAccounts" not in type_counts(sidecar)


def one_and_provider(
    report: dict[str, Any], typ: str
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The one resource of `typ`, and the explicit provider it is created through (None:
    the default)."""
    (resource,) = resources_of(report, typ).values()
    if resource["provider"] is None:
        return resource, None
    # A provider reference is "<provider URN>::<id>"; the URN ends "<type>::<name>".
    urn = resource["provider"].rsplit("::", 1)[0]
    (provider,) = [
        r for r in report["resources"]
        if r["type"].startswith("pulumi:providers:") and urn.endswith(f"{r['type']}::{r['name']}")
    ]  # fmt: skip
    return resource, provider


def claim_and_provider(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The runs claim, and the explicit provider it is created through (None: the default)."""
    return one_and_provider(report, CLAIM)


def test_the_runs_claim_outlives_pulumi_destroy(sidecar) -> None:
    runs, _ = claim_and_provider(sidecar)
    assert runs["name"] == "uerl-runs" and runs["retainOnDelete"] is True


def test_a_later_pulumi_up_takes_back_the_claim_destroy_left_without_forcing_it(sidecar) -> None:
    # Creating it again would fail with AlreadyExists; the provider upserts instead, and
    # a claim that differs (another size) stops the update rather than being overwritten.
    _, provider = claim_and_provider(sidecar)
    assert provider is not None
    assert provider["inputs"]["upsertExistingObjects"] == "true"
    assert "enablePatchForce" not in provider["inputs"]


def test_runs_keep_on_destroy_false_lets_destroy_delete_the_claim() -> None:
    runs, provider = claim_and_provider(run_program("topology.runs.claim.keep_on_destroy=false"))
    assert runs["retainOnDelete"] is False and provider is None


NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"


def test_the_stacks_namespace_outlives_destroy_with_the_runs_claim_it_keeps(sidecar) -> None:
    # Deleting the namespace would delete the kept claim in it, and its runs with it.
    namespace, provider = one_and_provider(sidecar, NAMESPACE_TYPE)
    assert namespace["retainOnDelete"] is True
    assert provider is not None and provider["inputs"]["upsertExistingObjects"] == "true"
    assert "enablePatchForce" not in provider["inputs"]


def test_the_kept_namespace_says_it_was_top_level_so_an_existing_stack_does_not_replace_it(
    sidecar,
) -> None:
    # A new parent changes its URN: without the alias the engine would delete it, and
    # everything in it.
    namespace, _ = one_and_provider(sidecar, NAMESPACE_TYPE)
    assert namespace["name"] == "uerl"
    assert namespace["parent"] == f"{TRAINING_CLUSTER}::uerl"
    assert {"name": None, "type": None, "parent": None} in namespace["aliases"]


@pytest.mark.parametrize(
    "config",
    [
        ("topology.runs.claim.keep_on_destroy=false",),
        ("topology.runs.store=s3", "topology.runs.s3.bucket=team-runs"),
    ],
    ids=["claim-not-kept", "runs-in-a-bucket"],
)
def test_without_a_kept_claim_destroy_deletes_the_stacks_namespace(config: tuple[str, ...]) -> None:
    namespace, provider = one_and_provider(run_program(*config), NAMESPACE_TYPE)
    assert namespace["retainOnDelete"] is False and provider is None


# -- one component: TrainingCluster -------------------------------------------------


@pytest.mark.parametrize("variant", ["sidecar", "networked", "unreal_loader", "own_cluster"])
def test_every_resource_is_the_training_clusters_or_below_it(variant: str, request) -> None:
    report = request.getfixturevalue(variant)
    assert report["error"] is None, report["error"]
    (cluster,) = resources_of(report, TRAINING_CLUSTER).values()
    assert cluster["parent"] is None
    others = [r for r in report["resources"] if r["type"] != TRAINING_CLUSTER]
    assert others and all(r["parent"] is not None for r in others), [
        (r["type"], r["name"]) for r in others if r["parent"] is None
    ]


@pytest.mark.parametrize("variant", ["sidecar", "networked", "unreal_loader", "own_cluster"])
def test_each_child_that_was_top_level_has_an_alias_to_its_old_place(variant, request) -> None:
    # Stacks made before the component: the engine then moves them, replacing nothing.
    report = request.getfixturevalue(variant)
    children = [r for r in report["resources"] if r["parent"] == f"{TRAINING_CLUSTER}::uerl"]
    assert len(children) >= 5
    for child in children:
        assert {"name": None, "type": None, "parent": None} in child["aliases"], child["name"]


def test_the_stack_exports_the_endpoints_of_its_topology_as_the_cluster_outputs_them(
    sidecar,
) -> None:
    expected = dev_topology().endpoints().model_dump(mode="json")
    assert integral_floats_to_int(sidecar["exports"]["endpoints"]) == expected
