"""The endpoints ConfigMap, mounted into the Ray head at infra.endpoints.HEAD_MOUNT_DIR."""

from __future__ import annotations

from infra.endpoints import ENDPOINTS_FILENAME
from infra.manifests.common import K8sObject, metadata
from infra.topology import Topology


def configmap_name(topology: Topology) -> str:
    return f"{topology.name}-endpoints"


def configmap(topology: Topology) -> K8sObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            topology, configmap_name(topology), name="uerl-endpoints", component="endpoints"
        ),
        "data": {ENDPOINTS_FILENAME: topology.endpoints().to_json() + "\n"},
    }
