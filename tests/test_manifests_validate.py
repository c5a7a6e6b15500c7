"""Every object the stack creates is valid Kubernetes; the RayCluster follows KubeRay's rules."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from infra_fixtures import (
    POD_GROUPS,
    SERVICE_ACCOUNT,
    TOPOLOGY_VARIANTS,
    WORKLOAD_IDENTITY,
    dev_topology,
    raycluster_errors,
)

from infra import manifests
from infra.endpoints import ENDPOINTS_FILENAME, HEAD_MOUNT_DIR, Endpoints
from infra.manifests import pod_security
from infra.manifests.raycluster import ENDPOINTS_VOLUME, custom_resources_param
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
    templates += [o["spec"]["template"] for o in objects if o["kind"] in ("StatefulSet", "Job")]
    assert templates
    for meta in [o["metadata"] for o in objects] + [t["metadata"] for t in templates]:
        assert set(meta["labels"]) >= LABEL_KEYS, meta


def test_head_schedules_nothing_and_serves_the_dashboard() -> None:
    head = groups(built("dev-sidecar").raycluster)["head"]
    params = head["rayStartParams"]
    assert (params["num-cpus"], params["dashboard-host"]) == ("0", "0.0.0.0")


@ALL
def test_every_ray_pod_serves_metrics_on_the_topologys_port_by_kuberays_port_name(
    variant: str,
) -> None:
    port = str(dev_topology(*TOPOLOGY_VARIANTS[variant]).metrics.port)
    for name, group in groups(built(variant).raycluster).items():
        assert group["rayStartParams"]["metrics-export-port"] == port, name
        ray = group["template"]["spec"]["containers"][0]
        assert {"name": "metrics", "containerPort": int(port)} in ray["ports"], name


@ALL
def test_ray_container_is_first_and_limited_to_its_requests_unless_cpu_limits_is_off(
    variant: str,
) -> None:
    topology = dev_topology(*TOPOLOGY_VARIANTS[variant])
    specs = {"head": topology.ray.head, "learners": topology.learners, "workers": topology.workers}
    for name, group in groups(built(variant).raycluster).items():
        ray = group["template"]["spec"]["containers"][0]
        assert ray["name"].startswith("ray-"), name
        requests, limits = ray["resources"]["requests"], ray["resources"]["limits"]
        # Guaranteed QoS (decided by CPU and memory) unless the group asks for none.
        assert limits["memory"] == requests["memory"], name
        assert limits.get("cpu") == (requests["cpu"] if specs[name].cpu_limits else None), name


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
    workers = groups(manifests.build(topology).raycluster)["workers"]["rayStartParams"]
    assert workers["resources"] == custom_resources_param("game_slot") == """'{"game_slot":1}'"""


def test_the_head_gives_a_stopped_job_time_for_its_final_checkpoint() -> None:
    """`ray job stop` SIGTERMs the driver, which finishes its iteration and checkpoints;
    Ray SIGKILLs it after RAY_JOB_STOP_WAIT_TIME_S (3 s unless set: on the real node a
    final checkpoint took longer)."""
    head = groups(built("dev-sidecar").raycluster)["head"]["template"]["spec"]["containers"][0]
    assert {"name": "RAY_JOB_STOP_WAIT_TIME_S", "value": "120"} in head["env"]


def test_the_heads_pod_reaps_a_stopped_jobs_orphans() -> None:
    """On `ray job stop` the job's shell dies before its driver; the orphaned driver's
    zombie must be reaped (by the pause process, PID 1 of a shared PID namespace) or Ray
    waits for it until its SIGKILL, the whole grace above."""
    head = groups(built("dev-sidecar").raycluster)["head"]["template"]["spec"]
    assert head["shareProcessNamespace"] is True
    # Only the head: a worker pod's game sidecar does not see the Ray processes.
    workers = groups(built("dev-sidecar").raycluster)["workers"]["template"]["spec"]
    assert "shareProcessNamespace" not in workers


def test_a_head_deleted_gracefully_stops_its_jobs_first_within_a_grace_that_covers_them() -> None:
    """Issue 63, item 8. Before: the pod default (30 s) while Ray gives a stopped job 120 s
    and the final upload is budgeted 60 s: a drained head was SIGKILLed mid-upload."""
    from training.runstore.bucket_mirror import CLOSE_TIMEOUT_S

    spec = groups(built("dev-sidecar").raycluster)["head"]["template"]["spec"]
    [head] = spec["containers"]
    assert head["lifecycle"]["preStop"]["exec"]["command"] == [
        "python", "-m", "training.headstop.stop_jobs"
    ]  # fmt: skip
    assert (
        spec["terminationGracePeriodSeconds"]
        > int(next(e["value"] for e in head["env"] if e["name"] == "RAY_JOB_STOP_WAIT_TIME_S"))
        >= CLOSE_TIMEOUT_S
    )
    import importlib

    importlib.import_module("training.headstop.stop_jobs")  # the hook's module is there


def test_learner_nodes_advertise_the_learner_resource() -> None:
    """Learners ask for one unit of it, so Ray never puts one on a worker node (whose pod
    a shrink may delete, learner and all)."""
    params = groups(built("dev-sidecar").raycluster)["learners"]["rayStartParams"]
    assert json.loads(params["resources"].strip("'")) == {"uerl_learner": 1}


# -- the game's container -------------------------------------------------------------------


def worker_pod(m: manifests.Manifests) -> dict[str, Any]:
    return groups(m.raycluster)["workers"]["template"]["spec"]


def games_pod(m: manifests.Manifests) -> dict[str, Any]:
    assert m.ue_statefulset is not None
    return m.ue_statefulset["spec"]["template"]["spec"]


def sidecar_game(m: manifests.Manifests) -> dict[str, Any]:
    (game,) = [c for c in worker_pod(m)["initContainers"] if c["name"] == "ue"]
    return game


def test_sidecar_game_is_a_native_sidecar_started_before_the_ray_container() -> None:
    spec = worker_pod(built("unreal-sidecar-loader"))
    assert [c["name"] for c in spec["containers"]] == ["ray-worker"]
    # Init containers run in order: the build is there, then the game answers.
    assert [c["name"] for c in spec["initContainers"]] == ["wait-for-build", "ue"]
    game = spec["initContainers"][1]
    assert game["restartPolicy"] == "Always"  # restarted by the kubelet, not a one-off init
    assert "startupProbe" in game  # what holds the Ray container back


def test_worker_pods_keep_the_default_restart_policy_and_no_autoscaler() -> None:
    # KubeRay forces restartPolicy Never only with autoscaler v2, which uerl does not enable.
    cluster = built("dev-sidecar").raycluster
    assert "enableInTreeAutoscaling" not in cluster["spec"]
    assert "autoscalerOptions" not in cluster["spec"]
    for group in groups(cluster).values():
        assert "restartPolicy" not in group["template"]["spec"]


def test_sidecar_game_runs_the_build_read_only_with_schola_on_the_served_port() -> None:
    m = built("unreal-sidecar-loader")
    ue = sidecar_game(m)
    assert ue["command"] == ["/opt/ue/Game.sh"]
    assert "-ScholaPort=50051" in ue["args"]
    assert ue["volumeMounts"] == [
        {"name": "ue-executables", "mountPath": "/opt/ue", "readOnly": True},
        {"name": "uerl-tmp", "mountPath": "/tmp"},  # the game's only writable place
    ]
    assert worker_pod(m)["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "uerl-ue-executables",
        "readOnly": True,
    }


LOOPBACK_PROBE = {"exec": {"command": ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/50051"]}}


def test_loopback_games_are_probed_from_inside_their_container_where_they_listen() -> None:
    ue = sidecar_game(built("unreal-sidecar-loader"))
    for probe in ("startupProbe", "readinessProbe"):
        assert ue[probe]["exec"] == LOOPBACK_PROBE["exec"]
        assert "tcpSocket" not in ue[probe]


def test_games_bound_to_all_interfaces_are_probed_over_tcp_on_the_pod_ip() -> None:
    ue = sidecar_game(manifests.build(dev_topology("topology.simulator.listen=all_interfaces")))
    assert ue["startupProbe"]["tcpSocket"] == ue["readinessProbe"]["tcpSocket"] == {"port": 50051}


def test_mock_games_need_no_executables_volume() -> None:
    m = built("dev-sidecar")
    spec = worker_pod(m)
    assert m.pvc is None
    assert [v for v in spec["volumes"] if "persistentVolumeClaim" in v] == []
    assert [c["name"] for c in spec["initContainers"]] == ["ue"]
    assert sidecar_game(m)["command"] == ["uerl", "mock-ue"]


def test_startup_probe_allows_the_configured_startup_timeout() -> None:
    ue = sidecar_game(manifests.build(dev_topology("topology.simulator.startup_timeout_s=300")))
    probe = ue["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 300


def test_networked_games_are_one_parallel_statefulset_numbered_from_1() -> None:
    m = built("networked-worker1-discovery")
    assert m.ue_statefulset is not None
    spec = m.ue_statefulset["spec"]
    assert (spec["replicas"], spec["ordinals"], spec["podManagementPolicy"]) == (
        2,
        {"start": 1},
        "Parallel",
    )
    assert spec["serviceName"] == m.ue_statefulset["metadata"]["name"] == "uerl-ue"


def test_dedicated_discovery_game_is_ordinal_0_of_the_same_statefulset() -> None:
    m = built("dev-networked")
    assert m.ue_statefulset is not None
    spec = m.ue_statefulset["spec"]
    assert (spec["replicas"], spec["ordinals"]) == (3, {"start": 0})
    discovery_host = m.topology.endpoints().discovery_endpoint.split(":")[0]
    assert discovery_host.startswith("uerl-ue-0.uerl-ue.")


def test_games_service_is_headless_and_selects_the_statefulsets_pods() -> None:
    m = built("dev-networked")
    assert m.ue_service is not None and m.ue_statefulset is not None
    svc = m.ue_service["spec"]
    assert svc["clusterIP"] == "None"
    pod_labels = m.ue_statefulset["spec"]["template"]["metadata"]["labels"]
    assert svc["selector"].items() <= pod_labels.items()
    assert m.ue_statefulset["spec"]["selector"]["matchLabels"] == svc["selector"]
    assert svc["ports"][0]["port"] == 50051


def test_each_game_pods_dns_name_is_what_the_endpoints_template_expands_to() -> None:
    m = built("dev-networked")
    assert m.ue_statefulset is not None and m.ue_service is not None
    ns, sts, svc = (
        m.topology.namespace,
        m.ue_statefulset["metadata"]["name"],
        m.ue_service["metadata"]["name"],
    )
    endpoints = m.topology.endpoints()
    for i in range(1, endpoints.num_env_runners + 1):
        # Kubernetes names StatefulSet pods <sts>-<ordinal>, resolvable under the headless service.
        assert endpoints.worker_endpoint(i) == f"{sts}-{i}.{svc}.{ns}.svc.cluster.local:50051"


def test_networked_loopback_game_listens_on_the_internal_port_behind_a_forwarder() -> None:
    pod = games_pod(built("dev-networked"))
    game, forward = pod["containers"]
    assert game["args"] == ["--host", "127.0.0.1", "--port", "50052"]
    assert "ports" not in game  # nothing reachable on the pod IP
    assert forward["command"][:2] == ["python", "-c"]
    assert forward["args"] == ["50051", "127.0.0.1", "50052"]
    assert forward["ports"] == [{"name": "schola", "containerPort": 50051, "protocol": "TCP"}]
    assert forward["readinessProbe"]["tcpSocket"] == {"port": 50051}
    assert game["readinessProbe"]["exec"]["command"][-1].endswith("/127.0.0.1/50052")


def test_forwarder_runs_the_forwarder_module_source() -> None:
    from infra import forwarder

    forward = games_pod(built("dev-networked"))["containers"][1]
    assert forward["command"][2] == Path(forwarder.__file__).read_text()


def test_networked_games_bound_to_all_interfaces_need_no_forwarder() -> None:
    pod = games_pod(built("networked-all-interfaces"))
    (game,) = pod["containers"]
    assert game["args"] == ["--host", "0.0.0.0", "--port", "50051"]
    assert game["readinessProbe"]["tcpSocket"] == {"port": 50051}


def test_networked_worker_pods_hold_only_the_ray_container() -> None:
    spec = worker_pod(built("dev-networked"))
    assert [c["name"] for c in spec["containers"]] == ["ray-worker"]
    assert "initContainers" not in spec


@ALL
def test_every_container_states_the_topologys_image_pull_policy(variant: str) -> None:
    m = built(variant)
    pods = [g["template"]["spec"] for g in groups(m.raycluster).values()]
    pods += [
        o["spec"]["template"]["spec"] for o in m.objects() if o["kind"] in ("StatefulSet", "Job")
    ]
    containers = [c for pod in pods for c in pod["containers"] + pod.get("initContainers", [])]
    assert len(containers) >= 4
    assert {c["imagePullPolicy"] for c in containers} == {"IfNotPresent"}


def test_image_pull_policy_comes_from_the_topology() -> None:
    m = manifests.build(dev_topology("topology.image_pull_policy=Always"))
    assert sidecar_game(m)["imagePullPolicy"] == "Always"


# -- what `pulumi up` waits for, and how long -----------------------------------------------


def annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    assert obj is not None
    return obj["metadata"]["annotations"]


def test_pod_template_changes_recreate_the_ray_pods() -> None:
    assert built("dev-sidecar").raycluster["spec"]["upgradeStrategy"] == {"type": "Recreate"}


def test_pulumi_waits_for_the_raycluster_head_and_all_pods_ready() -> None:
    wait_for = json.loads(annotations(built("dev-sidecar").raycluster)["pulumi.com/waitFor"])
    assert wait_for == ["condition=HeadPodReady", "condition=RayClusterProvisioned"]


def test_waited_conditions_are_ones_kuberay_sets() -> None:
    # KubeRay v1.7.0 RayClusterConditionType values (apis/ray/v1/raycluster_types.go).
    kuberay_conditions = {"RayClusterProvisioned", "HeadPodReady", "ReplicaFailure"}
    wait_for = json.loads(annotations(built("dev-sidecar").raycluster)["pulumi.com/waitFor"])
    assert {w.removeprefix("condition=") for w in wait_for} <= kuberay_conditions


def test_raycluster_timeout_covers_pull_game_startup_and_ray_start_in_the_sidecar_pattern() -> None:
    sidecar = dev_topology("topology.simulator.startup_timeout_s=1800")
    networked = dev_topology(
        "topology.simulator.startup_timeout_s=1800", "topology.pattern=networked"
    )
    timeout = {
        t.pattern: int(annotations(manifests.build(t).raycluster)["pulumi.com/timeoutSeconds"])
        for t in (sidecar, networked)
    }
    # 600 s pull margin + 300 s for KubeRay and `ray start`; sidecar games gate the Ray container.
    assert timeout == {"sidecar": 600 + 1800 + 300, "networked": 600 + 300}


def test_games_timeout_is_the_pull_margin_plus_the_startup_timeout() -> None:
    m = manifests.build(
        dev_topology(
            "topology.pattern=networked",
            "topology.simulator.startup_timeout_s=3600",
            "topology.image_pull_timeout_s=900",
        )
    )
    for obj in (m.ue_statefulset, m.ue_service):
        assert annotations(obj)["pulumi.com/timeoutSeconds"] == str(900 + 3600)


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
    volumes = games_pod(m)["volumes"]
    assert volumes[0]["persistentVolumeClaim"]["claimName"] == "shared-builds"


def test_loader_job_exists_only_with_a_source_url() -> None:
    assert built("unreal-sidecar-loader").loader_job is not None
    assert manifests.build(dev_topology("topology.simulator.kind=unreal")).loader_job is None


def test_loader_job_writes_the_marker_that_games_wait_for() -> None:
    m = built("unreal-networked-gpu")
    assert m.loader_job is not None
    script = m.loader_job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert f"/opt/ue/{READY_MARKER}" in script and "unzip" in script
    (wait,) = games_pod(m)["initContainers"]
    assert f"/opt/ue/{READY_MARKER}" in wait["command"][-1]


def test_games_wait_for_a_build_copied_by_hand_too() -> None:
    # No loader: docs/kubernetes.md's manual copy writes the marker last.
    m = manifests.build(dev_topology("topology.simulator.kind=unreal"))
    assert m.loader_job is None
    (wait, _game) = worker_pod(m)["initContainers"]
    assert wait["name"] == "wait-for-build" and READY_MARKER in wait["command"][-1]


def test_loader_timeout_comes_from_the_topology() -> None:
    m = manifests.build(
        dev_topology(
            *TOPOLOGY_VARIANTS["unreal-sidecar-loader"], "topology.executables.loader_timeout_s=900"
        )
    )
    assert annotations(m.loader_job)["pulumi.com/timeoutSeconds"] == "900"


# -- endpoints on the head --------------------------------------------------------------------


def test_head_mounts_the_endpoints_configmap() -> None:
    m = built("dev-networked")
    head = groups(m.raycluster)["head"]["template"]["spec"]
    (mount,) = [m for m in head["containers"][0]["volumeMounts"] if m["name"] == ENDPOINTS_VOLUME]
    (vol,) = [v for v in head["volumes"] if v["name"] == ENDPOINTS_VOLUME]
    assert mount["mountPath"] == HEAD_MOUNT_DIR and mount["name"] == vol["name"]
    assert vol["configMap"]["name"] == m.endpoints["metadata"]["name"]


def test_endpoints_configmap_holds_the_topologys_endpoints() -> None:
    topology: Topology = dev_topology("topology.pattern=networked")
    data = manifests.build(topology).endpoints["data"][ENDPOINTS_FILENAME]
    assert Endpoints.from_json(data) == topology.endpoints()


def test_unreal_games_run_as_a_non_root_user_with_a_writable_home() -> None:
    ue = games_pod(built("unreal-networked-gpu"))["containers"][0]
    assert ue["securityContext"]["runAsNonRoot"] is True
    assert {"name": "HOME", "value": "/tmp"} in ue["env"]
    assert {"name": "UE_LOG", "value": "verbose"} in ue["env"]


# -- a team's own cluster: images, GPUs, placement, identity, pod shape -------------------


def own_cluster_pods() -> dict[str, dict[str, Any]]:
    """Every pod template of the own-cluster variant, by the config path of its group."""
    m = built("own-cluster")
    g = groups(m.raycluster)
    assert m.ue_statefulset is not None and m.loader_job is not None
    return {
        "ray.head": g["head"]["template"],
        "learners": g["learners"]["template"],
        "workers": g["workers"]["template"],
        "simulator": m.ue_statefulset["spec"]["template"],
        "executables.loader": m.loader_job["spec"]["template"],
    }


def test_learners_run_their_own_image_and_head_and_workers_the_ray_image() -> None:
    topology = dev_topology(*TOPOLOGY_VARIANTS["own-cluster"])
    images = {
        name: group["template"]["spec"]["containers"][0]["image"]
        for name, group in groups(built("own-cluster").raycluster).items()
    }
    assert images == {
        "head": topology.ray.image_ref,
        "learners": "registry.example.com/uerl/ray:2.60.0-py311-rocm",
        "workers": topology.ray.image_ref,
    }


def test_learners_without_an_image_of_their_own_run_the_ray_image() -> None:
    m = built("dev-sidecar")
    learner = groups(m.raycluster)["learners"]["template"]["spec"]["containers"][0]
    assert learner["image"] == m.topology.ray.image_ref


def test_gpus_are_asked_for_as_each_groups_gpu_resource() -> None:
    m = built("own-cluster")
    learner = groups(m.raycluster)["learners"]["template"]["spec"]["containers"][0]
    game = games_pod(m)["containers"][0]
    for container, name, count in (
        (learner, "amd.com/gpu", "2"),
        (game, "gpu.intel.com/i915", "1"),
    ):
        assert container["resources"]["limits"][name] == count
        assert container["resources"]["requests"][name] == count  # extended: requests = limits
        assert "nvidia.com/gpu" not in container["resources"]["limits"]


def test_learners_tell_ray_their_gpus_whatever_the_resource_is_called() -> None:
    # KubeRay itself counts only a resource whose name ends in `gpu`.
    gpu = groups(built("unreal-networked-gpu").raycluster)["learners"]["rayStartParams"]
    none = groups(built("dev-sidecar").raycluster)["learners"]["rayStartParams"]
    assert gpu["num-gpus"] == "2" and "num-gpus" not in none


@pytest.mark.parametrize("group", POD_GROUPS)
def test_every_pod_is_placed_by_its_groups_fields(group: str) -> None:
    spec = own_cluster_pods()[group]["spec"]
    assert spec["nodeSelector"] == {"pool": group.split(".")[-1]}
    assert spec["tolerations"] == [
        {"operator": "Equal", "key": "dedicated", "value": "uerl", "effect": "NoSchedule"}
    ]
    term = {
        "matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
    }
    assert spec["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    assert spec["priorityClassName"] == "uerl-high"


@pytest.mark.parametrize("group", POD_GROUPS)
def test_every_pod_carries_its_groups_labels_and_annotations_beside_uerls(group: str) -> None:
    meta = own_cluster_pods()[group]["metadata"]
    assert meta["labels"]["team"] == "rl"
    assert set(meta["labels"]) == LABEL_KEYS | {"team"}
    assert meta["annotations"] == {"example.com/owner": "rl-team"}


@pytest.mark.parametrize("group", POD_GROUPS)
def test_every_pod_pulls_with_its_groups_secrets_and_runs_as_its_account(group: str) -> None:
    spec = own_cluster_pods()[group]["spec"]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["serviceAccountName"] == SERVICE_ACCOUNT
    # Workload identity needs no Kubernetes API token in the pod.
    assert spec["automountServiceAccountToken"] is False


def test_a_named_account_gets_its_api_token_mounted_only_when_asked() -> None:
    m = manifests.build(
        dev_topology(
            "topology.workers.service_account.name=kubectl-user",
            "topology.workers.service_account.automount_token=true",
        )
    )
    spec = worker_pod(m)
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == (
        "kubectl-user",
        True,
    )
    assert m.service_accounts == ()  # named, not created: it exists already


def test_pods_of_groups_without_pod_fields_keep_kubernetes_defaults() -> None:
    fields = {
        "nodeSelector",
        "tolerations",
        "affinity",
        "priorityClassName",
        "imagePullSecrets",
        "serviceAccountName",
        "automountServiceAccountToken",
        "topologySpreadConstraints",
    }
    for variant in ("dev-sidecar", "dev-networked", "unreal-sidecar-loader"):
        for name, spec in pod_security.pod_specs(built(variant).objects()).items():
            assert fields & set(spec) == set(), name


def test_the_stack_creates_an_account_named_by_several_groups_once_with_its_annotations() -> None:
    (account,) = built("own-cluster").service_accounts
    assert account["kind"] == "ServiceAccount"
    assert account["metadata"]["name"] == SERVICE_ACCOUNT
    assert account["metadata"]["annotations"] == WORKLOAD_IDENTITY
    assert set(account["metadata"]["labels"]) == LABEL_KEYS


def test_accounts_are_created_before_any_pod_that_runs_as_one() -> None:
    kinds = [o["kind"] for o in built("own-cluster").objects()]
    first_pod = min(kinds.index(k) for k in ("Job", "RayCluster", "StatefulSet"))
    assert kinds.index("ServiceAccount") < first_pod


def test_games_spread_as_told_counting_the_stacks_games_unless_told_otherwise() -> None:
    (spread,) = games_pod(built("own-cluster"))["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {
            "matchLabels": {"app.kubernetes.io/instance": "uerl", "app.kubernetes.io/name": "ue"}
        },
    }
    own = {"matchLabels": {"tier": "games"}}
    m = manifests.build(
        dev_topology(
            *TOPOLOGY_VARIANTS["own-cluster"],
            "topology.simulator.topology_spread_constraints[0].labelSelector.matchLabels.tier=games",
        )
    )
    assert games_pod(m)["topologySpreadConstraints"][0]["labelSelector"] == own


def shm(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Ray container's /dev/shm mount and its volume."""
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return mount, volume


@ALL
def test_every_ray_container_has_a_memory_backed_dev_shm(variant: str) -> None:
    for name, group in groups(built(variant).raycluster).items():
        _, volume = shm(group["template"]["spec"])
        assert volume["emptyDir"]["medium"] == "Memory", name
        assert volume["emptyDir"]["sizeLimit"], name


def test_dev_shm_is_30_percent_of_the_containers_memory_in_whole_mib_unless_sized() -> None:
    m = manifests.build(
        dev_topology(
            "topology.ray.head.memory=10Gi",
            "topology.learners.memory=3000M",
            "topology.workers.shm_size=256Mi",
        )
    )
    sizes = {
        name: shm(group["template"]["spec"])[1]["emptyDir"]["sizeLimit"]
        for name, group in groups(m.raycluster).items()
    }
    # 0.3 * 10 GiB = 3072 MiB; 0.3 * 3e9 bytes = 858.3 MiB.
    assert sizes == {"head": "3072Mi", "learners": "858Mi", "workers": "256Mi"}


def test_ray_containers_request_1gi_of_disk_and_games_none_by_default() -> None:
    m = built("dev-networked")
    for name, group in groups(m.raycluster).items():
        resources = group["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"]["ephemeral-storage"] == "1Gi", name
        assert "ephemeral-storage" not in resources["limits"], name  # requested, never evicted for
    game = games_pod(m)["containers"][0]["resources"]
    assert "ephemeral-storage" not in game["requests"]


def test_ephemeral_storage_of_a_group_is_what_the_topology_says() -> None:
    game = games_pod(built("own-cluster"))["containers"][0]["resources"]
    assert game["requests"]["ephemeral-storage"] == "10Gi"
    assert "ephemeral-storage" not in game["limits"]
    m = manifests.build(dev_topology("topology.workers.ephemeral_storage=5Gi"))
    assert worker_pod(m)["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "5Gi"


def test_cpu_limits_false_leaves_cpu_requests_only_for_the_group() -> None:
    m = built("own-cluster")
    g = groups(m.raycluster)
    learner = g["learners"]["template"]["spec"]["containers"][0]["resources"]
    worker = g["workers"]["template"]["spec"]["containers"][0]["resources"]
    game, forwarder = (c["resources"] for c in games_pod(m)["containers"])
    for resources in (learner, game, forwarder):
        assert "cpu" in resources["requests"] and "cpu" not in resources["limits"]
        assert resources["limits"]["memory"] == resources["requests"]["memory"]
    assert worker["limits"]["cpu"] == worker["requests"]["cpu"]  # cpu_limits left true
