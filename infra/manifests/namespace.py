"""The topology's Namespace (when `create_namespace`)."""

from __future__ import annotations

from infra.manifests.common import K8sObject, metadata
from infra.topology import Topology


def namespace(topology: Topology) -> K8sObject | None:
    if not topology.create_namespace:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": metadata(
            topology, topology.namespace, name="uerl", component="namespace", namespaced=False
        ),
    }
