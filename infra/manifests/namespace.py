"""The topology's Namespace (when `create_namespace`)."""

from __future__ import annotations

from infra.manifests import pod_security
from infra.manifests.common import K8sObject, metadata
from infra.topology import Topology


def namespace(topology: Topology) -> K8sObject | None:
    if not topology.create_namespace:
        return None
    meta = metadata(
        topology, topology.namespace, name="uerl", component="namespace", namespaced=False
    )
    meta["labels"] |= pod_security.namespace_labels(topology)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
