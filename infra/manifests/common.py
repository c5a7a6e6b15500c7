"""Helpers shared by the object builders: labels, metadata, resource quantities."""

from __future__ import annotations

import json
import math
from typing import Any

from infra.topology import GPU_RESOURCE, OWN_LABELS, SizedSpec, Topology

PART_OF = "uerl"
MANAGED_BY = "pulumi"

K8sObject = dict[str, Any]


def labels(topology: Topology, *, name: str, component: str) -> dict[str, str]:
    """The app.kubernetes.io labels every object (and pod template) carries."""
    values = (name, topology.name, component, PART_OF, MANAGED_BY)
    return dict(zip(OWN_LABELS, values, strict=True))


def metadata(
    topology: Topology, object_name: str, *, name: str, component: str, namespaced: bool = True
) -> dict[str, Any]:
    # metadata.name is always explicit: Pulumi's auto-naming would add random
    # suffixes, and a changed name means a replaced object.
    meta: dict[str, Any] = {"name": object_name}
    if namespaced:
        meta["namespace"] = topology.namespace
    meta["labels"] = labels(topology, name=name, component=component)
    return meta


def claim(
    topology: Topology,
    object_name: str,
    *,
    name: str,
    component: str,
    access_mode: str,
    size: str,
    storage_class: str | None,
) -> K8sObject:
    """A PersistentVolumeClaim; no storage class means the cluster's default."""
    spec: dict[str, Any] = {
        "accessModes": [access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(topology, object_name, name=name, component=component),
        "spec": spec,
    }


def cpu_quantity(cpus: float) -> str:
    """2 -> "2", 1.5 -> "1500m" (Kubernetes canonical forms; Ray rounds up)."""
    if float(cpus).is_integer():
        return str(int(cpus))
    return f"{round(cpus * 1000)}m"


def container_resources(
    cpus: float,
    memory: str,
    *,
    cpu_limit: bool = True,
    gpus: int = 0,
    gpu_resource: str = GPU_RESOURCE,
    ephemeral_storage: str | None = None,
) -> dict[str, dict[str, str]]:
    """Memory and GPUs requested and limited alike, CPUs too unless `cpu_limit` is
    false: Guaranteed QoS, and what Ray advertises is what the pod gets. Ephemeral
    storage is requested only: a run writing more is not evicted for it."""
    limits = {"cpu": cpu_quantity(cpus), "memory": memory}
    if gpus > 0:
        limits[gpu_resource] = str(gpus)  # an extended resource: requests must equal limits
    requests = dict(limits)
    if not cpu_limit:
        del limits["cpu"]
    if ephemeral_storage is not None:
        requests["ephemeral-storage"] = ephemeral_storage
    return {"requests": requests, "limits": limits}


def sized_resources(
    spec: SizedSpec, gpus: int = 0, gpu_resource: str = GPU_RESOURCE
) -> dict[str, dict[str, str]]:
    """The resources of the container a topology group sizes."""
    return container_resources(
        spec.cpus,
        spec.memory,
        cpu_limit=spec.cpu_limits,
        gpus=gpus,
        gpu_resource=gpu_resource,
        ephemeral_storage=spec.ephemeral_storage,
    )


# pulumi-kubernetes reads these on every object it creates or updates: how long
# to await readiness, and (custom resources, which otherwise get no await at
# all) what readiness is. Rendered into the objects, so `uerl render` and
# `kubectl get -o yaml` show exactly what `pulumi up` waits for.
TIMEOUT_ANNOTATION = "pulumi.com/timeoutSeconds"
WAIT_FOR_ANNOTATION = "pulumi.com/waitFor"


def await_annotations(timeout_s: float, wait_for: list[str] | None = None) -> dict[str, str]:
    out = {TIMEOUT_ANNOTATION: str(math.ceil(timeout_s))}
    if wait_for:
        # One expression as is; several as a JSON list, all of which must hold.
        out[WAIT_FOR_ANNOTATION] = wait_for[0] if len(wait_for) == 1 else json.dumps(wait_for)
    return out


def annotate(obj: K8sObject, annotations: dict[str, str]) -> K8sObject:
    obj["metadata"].setdefault("annotations", {}).update(annotations)
    return obj
