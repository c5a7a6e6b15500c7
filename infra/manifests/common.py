"""Helpers shared by the object builders: labels, metadata, resource quantities."""

from __future__ import annotations

import json
import math
from typing import Any

from infra.topology import Topology

PART_OF = "uerl"
MANAGED_BY = "pulumi"

K8sObject = dict[str, Any]


def labels(topology: Topology, *, name: str, component: str) -> dict[str, str]:
    """The app.kubernetes.io labels every object (and pod template) carries."""
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": topology.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


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


def cpu_quantity(cpus: float) -> str:
    """2 -> "2", 1.5 -> "1500m" (Kubernetes canonical forms; Ray rounds up)."""
    if float(cpus).is_integer():
        return str(int(cpus))
    return f"{round(cpus * 1000)}m"


def fixed_resources(cpus: float, memory: str, gpus: int = 0) -> dict[str, dict[str, str]]:
    """requests == limits: Guaranteed QoS, and what Ray advertises is what the pod gets."""
    amounts = {"cpu": cpu_quantity(cpus), "memory": memory}
    if gpus > 0:
        amounts["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


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
