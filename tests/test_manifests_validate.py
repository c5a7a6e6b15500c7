"""Every object the stack creates is valid Kubernetes; the RayCluster follows KubeRay's rules."""

from __future__ import annotations

import json
import shlex
from typing import Any

import kubernetes_validate
import pytest
from infra_fixtures import TOPOLOGY_VARIANTS, dev_topology, raycluster_errors

from infra import manifests
from infra.endpoints import ENDPOINTS_FILENAME, HEAD_MOUNT_DIR, Endpoints
from infra.manifests.raycluster import custom_resources_param
from infra.manifests.volume import READY_MARKER
from infra.topology import Topology

# The newest Kubernetes version kubernetes-validate ships schemas for.
K8S_VERSION = kubernetes_validate.latest_version()
LABEL_KEYS = {
    f"app.kubernetes.io/{key}" for key in ("name", "instance", "component", "part-of", "managed-by")
}


def built(variant: str) -> manifests.Manifests:
    return manifests.build(dev_topology(*TOPOLOGY_VARIANTS[variant]))


def groups(raycluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = raycluster["spec"]
    return {"head": spec["headGroupSpec"]} | {g["groupName"]: g for g in spec["workerGroupSpecs"]}


ALL = pytest.mark.parametrize("variant", sorted(TOPOLOGY_VARIANTS))


@ALL
def test_core_objects_validate_strictly_against_kubernetes_schemas(variant: str) -> None:
    core = [o for o in built(variant).objects() if o["kind"] != "RayCluster"]
    assert core
    for obj in core:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@ALL
def test_raycluster_validates_against_the_kuberay_crd_schema(variant: str) -> None:
    assert raycluster_errors(built(variant).raycluster) == []


def test_crd_validation_rejects_fields_the_schema_does_not_name() -> None:
    obj = built("dev-sidecar").raycluster
    obj["spec"]["headGroupSpec"]["rayStartParam"] = {"num-cpus": "0"}
    assert any("rayStartParam" in e for e in raycluster_errors(obj))


def test_crd_validation_rejects_non_string_ray_start_params() -> None:
    obj = built("dev-sidecar").raycluster
    obj["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    assert any("rayStartParams/num-cpus" in e for e in raycluster_errors(obj))


@ALL
def test_every_object_and_pod_template_carries_the_recommended_labels(variant: str) -> None:
    objects = built(variant).objects()
    templates = [
        g["template"] for o in objects if o["kind"] == "RayCluster" for g in groups(o).values()
    ]
    templates += [o["spec"]["template"] for o in objects if o["kind"] in ("Deployment", "Job")]
    assert templates
    for meta in [o["metadata"] for o in objects] + [t["metadata"] for t in templates]:
        assert set(meta["labels"]) >= LABEL_KEYS, meta


def test_head_schedules_nothing_and_serves_the_dashboard() -> None:
    head = groups(built("dev-sidecar").raycluster)["head"]
    assert head["rayStartParams"] == {"num-cpus": "0", "dashboard-host": "0.0.0.0"}


@ALL
def test_ray_container_is_first_and_requests_equal_limits_in_every_group(variant: str) -> None:
    for name, group in groups(built(variant).raycluster).items():
        ray = group["template"]["spec"]["containers"][0]
        assert ray["name"].startswith("ray-"), name
        assert ray["resources"]["requests"] == ray["resources"]["limits"], name


def test_worker_group_sizes_are_fixed_at_the_topology_counts() -> None:
    g = groups(manifests.build(dev_topology("topology.workers.replicas=5")).raycluster)
    assert (g["workers"]["replicas"], g["workers"]["minReplicas"], g["workers"]["maxReplicas"]) == (
        5,
        5,
        5,
    )
    assert g["learners"]["replicas"] == 1


def test_learners_get_gpu_limits_node_selector_and_tolerations_when_configured() -> None:
    spec = groups(built("unreal-networked-gpu").raycluster)["learners"]["template"]["spec"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert spec["nodeSelector"] == {"gpu": "a100"}
    assert spec["tolerations"] == [
        {"operator": "Exists", "key": "nvidia.com/gpu", "effect": "NoSchedule"}
    ]


def test_learners_without_gpus_ask_for_none() -> None:
    ray = groups(built("dev-sidecar").raycluster)["learners"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in ray["resources"]["limits"]


def test_fractional_cpus_become_millicores() -> None:
    ray = groups(built("unreal-networked-gpu").raycluster)["workers"]["template"]["spec"]
    assert ray["containers"][0]["resources"]["limits"]["cpu"] == "1500m"


# -- the custom resource: bash, the operator and the autoscaler must all read it ----------


def test_custom_resource_parses_as_ue_worker_1_after_bash_unquoting() -> None:
    value = groups(built("dev-sidecar").raycluster)["workers"]["rayStartParams"]["resources"]
    # The operator inserts the value raw into `ray start ... --resources=<value>` run by bash.
    (arg,) = shlex.split(f"--resources={value}")
    assert json.loads(arg.removeprefix("--resources=")) == {"ue_worker": 1}


def test_custom_resource_parses_after_the_operators_trimming() -> None:
    value = groups(built("dev-sidecar").raycluster)["workers"]["rayStartParams"]["resources"]
    # KubeRay trims quotes and spaces from both ends, then parses JSON.
    assert json.loads(value.strip("'\" ")) == {"ue_worker": 1}


def test_custom_resource_is_read_by_the_ray_autoscaler() -> None:
    config = pytest.importorskip("ray.autoscaler._private.kuberay.autoscaling_config")
    params = groups(built("dev-sidecar").raycluster)["workers"]["rayStartParams"]
    assert config._get_custom_resources({}, params, "workers") == {"ue_worker": 1}


def test_custom_resource_name_comes_from_the_topology() -> None:
    topology = dev_topology("topology.workers.custom_resource=game_slot")
    assert custom_resources_param(topology) == """'{"game_slot":1}'"""


# -- the game's container -------------------------------------------------------------------


def test_sidecar_puts_the_game_second_in_worker_pods_with_the_build_read_only() -> None:
    m = built("unreal-sidecar-loader")
    spec = groups(m.raycluster)["workers"]["template"]["spec"]
    ray, ue = spec["containers"]
    assert ray["name"] == "ray-worker" and ue["name"] == "ue"
    assert ue["command"] == ["/opt/ue/Game.sh"]
    assert "-ScholaPort=50051" in ue["args"]
    assert ue["volumeMounts"] == [
        {"name": "ue-executables", "mountPath": "/opt/ue", "readOnly": True}
    ]
    assert spec["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "uerl-ue-executables",
        "readOnly": True,
    }
    assert ue["readinessProbe"]["tcpSocket"] == {"port": 50051}


def test_mock_games_need_no_executables_volume() -> None:
    m = built("dev-sidecar")
    spec = groups(m.raycluster)["workers"]["template"]["spec"]
    assert m.pvc is None and "volumes" not in spec
    assert spec["containers"][1]["command"] == ["uerl", "mock-ue"]


def test_startup_probe_allows_the_configured_startup_timeout() -> None:
    topology = dev_topology("topology.simulator.startup_timeout_s=300")
    ue = manifests.build(topology).raycluster["spec"]["workerGroupSpecs"][1]["template"]["spec"][
        "containers"
    ][1]
    probe = ue["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 300


def test_networked_games_are_single_replica_deployments_behind_clusterip_services() -> None:
    m = built("dev-networked")
    assert [i.name for i in m.ue_instances] == ["ue-disc", "ue-1", "ue-2"]
    for instance in m.ue_instances:
        dep, svc = instance.deployment, instance.service
        assert dep["spec"]["replicas"] == 1
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert svc["spec"]["type"] == "ClusterIP"
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        (ue,) = dep["spec"]["template"]["spec"]["containers"]
        assert ue["readinessProbe"]["tcpSocket"] == {"port": 50051}
        assert svc["spec"]["ports"][0]["port"] == 50051


def test_each_service_selects_only_its_own_game() -> None:
    selectors = [
        json.dumps(i.service["spec"]["selector"]) for i in built("dev-networked").ue_instances
    ]
    assert len(set(selectors)) == len(selectors) == 3


def test_networked_worker_pods_hold_only_the_ray_container() -> None:
    spec = groups(built("dev-networked").raycluster)["workers"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["ray-worker"]


def test_discovery_reusing_instance_1_creates_no_ue_disc() -> None:
    assert [i.name for i in built("networked-worker1-discovery").ue_instances] == ["ue-1", "ue-2"]


# -- executables volume and loader ------------------------------------------------------------


def test_created_claim_is_read_write_many_with_the_configured_size_and_class() -> None:
    pvc = built("unreal-sidecar-loader").pvc
    assert pvc is not None
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "nfs",
    }


def test_existing_claim_is_used_not_created() -> None:
    m = built("unreal-networked-gpu")
    assert m.pvc is None
    volumes = m.ue_instances[0].deployment["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["persistentVolumeClaim"]["claimName"] == "shared-builds"


def test_loader_job_exists_only_with_a_source_url() -> None:
    assert built("unreal-sidecar-loader").loader_job is not None
    assert manifests.build(dev_topology("topology.simulator.kind=unreal")).loader_job is None


def test_loader_job_writes_the_marker_that_games_wait_for() -> None:
    m = built("unreal-networked-gpu")
    assert m.loader_job is not None
    script = m.loader_job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert f"/opt/ue/{READY_MARKER}" in script and "unzip" in script
    (wait,) = m.ue_instances[0].deployment["spec"]["template"]["spec"]["initContainers"]
    assert f"/opt/ue/{READY_MARKER}" in wait["command"][-1]


# -- endpoints on the head --------------------------------------------------------------------


def test_head_mounts_the_endpoints_configmap() -> None:
    m = built("dev-networked")
    head = groups(m.raycluster)["head"]["template"]["spec"]
    (mount,) = head["containers"][0]["volumeMounts"]
    (vol,) = head["volumes"]
    assert mount["mountPath"] == HEAD_MOUNT_DIR and mount["name"] == vol["name"]
    assert vol["configMap"]["name"] == m.endpoints["metadata"]["name"]


def test_endpoints_configmap_holds_the_topologys_endpoints() -> None:
    topology: Topology = dev_topology("topology.pattern=networked")
    data = manifests.build(topology).endpoints["data"][ENDPOINTS_FILENAME]
    assert Endpoints.from_json(data) == topology.endpoints()


def test_unreal_games_run_as_a_non_root_user_with_a_writable_home() -> None:
    ue = built("unreal-networked-gpu").ue_instances[0].deployment["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert ue["securityContext"]["runAsNonRoot"] is True
    assert {"name": "HOME", "value": "/tmp"} in ue["env"]
    assert {"name": "UE_LOG", "value": "verbose"} in ue["env"]
