"""StackMetrics: the PodMonitor through which a Prometheus Operator scrapes the stack's
Ray pods (`metrics.pod_monitor`)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.crds_component import served_crd
from infra.components.k8s import ClusterAccess, register
from infra.manifests import pod_monitor
from infra.manifests.common import K8sObject

MISSING_CRD = (
    "topology.metrics.pod_monitor: the cluster has no PodMonitor CRD "
    f"({pod_monitor.CRD_NAME}): install the Prometheus Operator (or its CRDs) first, "
    "or set metrics.pod_monitor false"
)


def require_pod_monitor_crd(access: ClusterAccess) -> None:
    """Stops `pulumi preview` with one line when the cluster cannot hold a PodMonitor
    (the provider's own error would come at `up`, deep in a diff). A kubeconfig that is
    another resource's output is not known at preview: the provider then says so."""
    kubeconfig, context = access.kubeconfig, access.context
    if not isinstance(kubeconfig, str | None) or not isinstance(context, str | None):
        return
    served = served_crd(kubeconfig, context, pod_monitor.CRD_NAME)
    if served is False:
        raise pulumi.RunError(MISSING_CRD)


class StackMetrics(pulumi.ComponentResource):
    pod_monitor: pulumi.CustomResource

    def __init__(
        self,
        name: str,
        monitor: K8sObject,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:StackMetrics", name, None, opts)
        self.pod_monitor = register(
            monitor, pulumi.ResourceOptions(parent=self, depends_on=list(depends_on))
        )
        self.register_outputs({"pod_monitor": monitor["metadata"]["name"]})
