"""Where a group's pods run and as whom: a topology group's pod fields (`PodSpec`) in
its pod template, and the ServiceAccounts the stack creates for them.

Every pod uerl makes goes through `place` and `pod_metadata`: the Ray head, learners
and workers (with their sidecar games), the networked games (their forwarder is a
container of the same pod) and the loader Job.
"""

from __future__ import annotations

import copy
from typing import Any

from infra.manifests.common import K8sObject, labels, metadata
from infra.topology import PodSpec, Topology

ACCOUNT_APP = "service-account"
ACCOUNT_COMPONENT = "identity"


def pod_metadata(
    topology: Topology, group: PodSpec, *, name: str, component: str
) -> dict[str, Any]:
    """The pod template's metadata: uerl's labels (the topology refuses extra labels
    naming them) and the group's extra labels and annotations."""
    meta: dict[str, Any] = {
        "labels": {**group.labels, **labels(topology, name=name, component=component)}
    }
    if group.annotations:
        meta["annotations"] = dict(group.annotations)
    return meta


def place(pod_spec: dict[str, Any], group: PodSpec) -> dict[str, Any]:
    """Sets the group's scheduling and identity fields on `pod_spec` (in place, and
    returns it); a field left at its default leaves the pod spec as Kubernetes defaults it."""
    if group.node_selector:
        pod_spec["nodeSelector"] = dict(group.node_selector)
    if group.tolerations:
        pod_spec["tolerations"] = [t.to_k8s() for t in group.tolerations]
    if group.affinity is not None:
        pod_spec["affinity"] = copy.deepcopy(group.affinity)
    if group.priority_class_name is not None:
        pod_spec["priorityClassName"] = group.priority_class_name
    if group.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in group.image_pull_secrets]
    account = group.service_account
    if account is not None:
        pod_spec["serviceAccountName"] = account.name
        pod_spec["automountServiceAccountToken"] = account.automount_token
    return pod_spec


def service_accounts(topology: Topology) -> list[K8sObject]:
    """The ServiceAccounts a group asks the stack to create (`service_account.create`),
    one per name."""
    out = []
    for account in topology.created_service_accounts():
        meta = metadata(topology, account.name, name=ACCOUNT_APP, component=ACCOUNT_COMPONENT)
        if account.annotations:
            meta["annotations"] = dict(account.annotations)
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    return out
