"""The RayCluster (`ray.io/v1`): a head that schedules nothing, X learners, Y env-runner workers.

Facts this relies on (KubeRay v1.7.0, read from its operator source; its CRDs are in
third_party/kuberay-operator-1.7.0/crds):
every rayStartParams value is a string; the Ray container is containers[0];
custom resources are single-quoted compact JSON so bash, the operator and
the autoscaler all read `{"ue_worker": 1}`; pods are recreated on a pod
template change only with `upgradeStrategy.type: Recreate` (the hash compared
ignores replica counts, so rescaling recreates nothing); `.status.conditions`
(RayClusterStatusConditions, on by default) say when the pods are ready.
"""

from __future__ import annotations

import json
from typing import Any

from infra.contract import (
    CLIENT_PORT,
    DASHBOARD_PORT,
    GCS_PORT,
    JOB_STOP_GRACE_ENV,
    JOB_STOP_GRACE_S,
)
from infra.endpoints import HEAD_MOUNT_DIR
from infra.manifests import game_tls, placement, pod_security, runs_storage, simulator, volume
from infra.manifests.common import K8sObject, await_annotations, metadata, sized_resources
from infra.manifests.endpoints_configmap import configmap_name
from infra.topology import RayGroupSpec, Topology

APP_NAME = "ray"
LEARNER_GROUP = "learners"
WORKER_GROUP = "workers"
ENDPOINTS_VOLUME = "uerl-endpoints"
# Ray's object store lives in /dev/shm (64 MB in a container unless mounted). KubeRay
# mounts one as large as the memory limit where the Ray container has none; uerl mounts
# its own, so its size is a topology field and `uerl render` shows it.
SHM_VOLUME = "uerl-shm"
SHM_PATH = "/dev/shm"
# The Ray container's metrics port, by KubeRay's own name for it.
METRICS_PORT_NAME = "metrics"
# What `pulumi up` waits for: the head pod ready now, and every Ray pod ready
# (RayClusterProvisioned turns true once, when all of them first are).
READY_CONDITIONS = ["condition=HeadPodReady", "condition=RayClusterProvisioned"]


def custom_resources_param(resource: str) -> str:
    """rayStartParams.resources advertising one unit of `resource`, e.g. `'{"ue_worker":1}'`."""
    compact = json.dumps({resource: 1}, separators=(",", ":"))
    return f"'{compact}'"


def _pod_template(
    topology: Topology,
    component: str,
    group: RayGroupSpec,
    pod_spec: dict[str, Any],
    *,
    fs_group: int | None = None,
) -> dict[str, Any]:
    ray = pod_spec["containers"][0]
    ray.setdefault("volumeMounts", []).append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    pod_spec.setdefault("volumes", []).append(
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": group.shm_ref}}
    )
    placement.place(pod_spec, group)
    return {
        "metadata": placement.pod_metadata(topology, group, name=APP_NAME, component=component),
        "spec": pod_security.restrict(pod_spec, fs_group=fs_group),
    }


def _ray_container(
    topology: Topology,
    name: str,
    resources: dict[str, Any],
    image: str | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image or topology.ray.image_ref,
        "imagePullPolicy": topology.image_pull_policy,
        "resources": resources,
        "securityContext": pod_security.container_context(
            pod_security.RAY_UID, pod_security.RAY_GID, read_only_root=False
        ),
    }


def _metrics(topology: Topology) -> dict[str, str]:
    """Ray's metrics export port, the topology's (KubeRay would give every container
    its default port otherwise, whatever the topology says)."""
    return {"metrics-export-port": str(topology.metrics.port)}


def _metrics_port(topology: Topology) -> dict[str, Any]:
    # Named as KubeRay names it: KubeRay adds no second one, and the PodMonitor finds it.
    return {"name": METRICS_PORT_NAME, "containerPort": topology.metrics.port}


# The head's preStop hook (training.headstop.stop_jobs: a module name, not an import:
# infra knows nothing of training), and the grace that covers it: Ray's wait for a
# stopped job, then Ray's own shutdown.
HEAD_PRE_STOP = ("python", "-m", "training.headstop.stop_jobs")
HEAD_STOP_GRACE_S = JOB_STOP_GRACE_S + 30


def _head(topology: Topology) -> dict[str, Any]:
    head = topology.ray.head
    container = _ray_container(topology, "ray-head", sized_resources(head))
    container["ports"] = [
        {"name": "gcs-server", "containerPort": GCS_PORT},
        {"name": "dashboard", "containerPort": DASHBOARD_PORT},
        {"name": "client", "containerPort": CLIENT_PORT},
        _metrics_port(topology),
    ]
    # `ray job stop` then leaves `uerl train` time for its final checkpoint.
    container["env"] = [{"name": JOB_STOP_GRACE_ENV, "value": str(JOB_STOP_GRACE_S)}]
    # The endpoints file, so a job on the head finds the games with no flags.
    container["volumeMounts"] = [
        {"name": ENDPOINTS_VOLUME, "mountPath": HEAD_MOUNT_DIR, "readOnly": True}
    ]
    pod_spec = {
        "containers": [container],
        "volumes": [
            {"name": ENDPOINTS_VOLUME, "configMap": {"name": configmap_name(topology)}},
            # /tmp, as every pod's (pod_security.restrict), but limited: a run bound for a
            # bucket is staged there, and an unlimited emptyDir can fill the node's disk.
            {
                "name": pod_security.TMP_VOLUME,
                "emptyDir": {"sizeLimit": topology.runs.staging_size},
            },
        ],
        # PID 1 of the Ray container is `ray start`, which reaps no orphans. A job's shell
        # dies first on `ray job stop`, its driver is orphaned, and the zombie it leaves
        # holds Ray's stop until the SIGKILL RAY_JOB_STOP_WAIT_TIME_S later (ray#50031).
        # With one PID namespace the pod's pause process is PID 1, and it reaps them.
        "shareProcessNamespace": True,
        # A head deleted gracefully (a drain, an eviction, a replacing `pulumi up`) stops
        # its jobs first (the preStop hook) so a driver writes its final checkpoint and
        # upload; the pod's grace covers Ray's stop of them and Ray's own after it.
        "terminationGracePeriodSeconds": HEAD_STOP_GRACE_S,
    }
    container["lifecycle"] = {"preStop": {"exec": {"command": list(HEAD_PRE_STOP)}}}
    # The driver runs here: discovery (networked) and evaluation dial games.
    game_tls.add_client(topology, pod_spec, container)
    # ... and writes the run's artefacts to the runs claim (owned by Ray's group, so the
    # claim's files are writable by the Ray user) or the object store.
    runs_storage.add_to_head(topology, pod_spec, container)
    fs_group = pod_security.RAY_GID if topology.runs_claim_name is not None else None
    return {
        # The head runs the driver only: no tasks or actors are scheduled on it.
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0", **_metrics(topology)},
        "template": _pod_template(topology, "ray-head", head, pod_spec, fs_group=fs_group),
    }


def _fixed_size(replicas: int) -> dict[str, int]:
    # No autoscaling: the topology fixes each group's size.
    return {"replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas}


def _learners(topology: Topology) -> dict[str, Any]:
    spec = topology.learners
    resources = sized_resources(spec, spec.gpus, spec.gpu_resource)
    container = _ray_container(topology, "ray-worker", resources, spec.image)
    container["ports"] = [_metrics_port(topology)]
    pod_spec: dict[str, Any] = {"containers": [container]}
    # num-cpus and memory come from the container's resources; the learner resource
    # keeps learners here (a worker node's CPUs would fit one too).
    params = {"resources": custom_resources_param(spec.custom_resource), **_metrics(topology)}
    if spec.gpus > 0:
        # KubeRay counts GPUs only from a resource whose name ends in `gpu`.
        params["num-gpus"] = str(spec.gpus)
    return {
        "groupName": LEARNER_GROUP,
        **_fixed_size(spec.replicas),
        "rayStartParams": params,
        "template": _pod_template(topology, "ray-learner", spec, pod_spec),
    }


def _workers(topology: Topology) -> dict[str, Any]:
    spec = topology.workers
    ray = _ray_container(topology, "ray-worker", sized_resources(spec))
    ray["ports"] = [_metrics_port(topology)]
    pod_spec: dict[str, Any] = {"containers": [ray]}
    if topology.pattern == "sidecar":
        # The game shares the pod (and so localhost) with its env runner. As a
        # native sidecar (Kubernetes >= 1.29) it starts first and the Ray
        # container, which advertises the custom resource, starts only once the
        # game answers; the kubelet still restarts the game if it exits. KubeRay
        # appends its own init container (wait for GCS) after these.
        pod_spec["initContainers"] = [
            *volume.wait_for_build(topology),
            simulator.container(topology, native_sidecar=True),
        ]
        volumes = simulator.pod_volumes(topology)
        if volumes:
            pod_spec["volumes"] = volumes
        simulator.add_tls_server(topology, pod_spec)
    game_tls.add_client(topology, pod_spec, ray)
    return {
        "groupName": WORKER_GROUP,
        **_fixed_size(spec.replicas),
        "rayStartParams": {
            "resources": custom_resources_param(spec.custom_resource),
            **_metrics(topology),
        },
        "template": _pod_template(topology, "ray-env-runner", spec, pod_spec),
    }


def ready_timeout_s(topology: Topology) -> float:
    """How long `pulumi up` waits for the RayCluster to be ready."""
    # Sidecar games start before (and gate) the Ray container.
    game = simulator.startup_allowance_s(topology) if topology.pattern == "sidecar" else 0
    return topology.image_pull_timeout_s + game + topology.ray.start_timeout_s


def auth_options(topology: Topology) -> dict[str, str] | None:
    """KubeRay's token authentication: it gives every Ray container (and its own
    wait-for-GCS init container) RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret,
    making that Secret first when none is named. None: no token (KubeRay's default)."""
    if topology.ray_token_secret is None:
        return None
    options = {"mode": "token"}
    if topology.ray.auth.secret_name is not None:
        options["secretName"] = topology.ray.auth.secret_name
    return options


def raycluster(topology: Topology) -> K8sObject:
    meta = metadata(topology, topology.name, name=APP_NAME, component="ray-cluster")
    meta["annotations"] = await_annotations(ready_timeout_s(topology), READY_CONDITIONS)
    spec: dict[str, Any] = {
        "rayVersion": topology.ray.version,
        # Without it KubeRay never replaces running pods: a new image,
        # pattern or size would report success and change nothing.
        "upgradeStrategy": {"type": "Recreate"},
        "headGroupSpec": _head(topology),
        "workerGroupSpecs": [_learners(topology), _workers(topology)],
    }
    auth = auth_options(topology)
    if auth is not None:
        spec["authOptions"] = auth
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta,
        "spec": spec,
    }
