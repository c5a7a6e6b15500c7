"""Pure builders: topology -> the Kubernetes objects of a uerl deployment, as plain dicts.

`pulumi up` (infra/components), `uerl render` and the tests all use these,
so what is rendered is what is deployed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.manifests import (
    endpoints_configmap,
    namespace,
    network_policy,
    operator,
    placement,
    pod_monitor,
    raycluster,
    runs_storage,
    simulator,
    volume,
)
from infra.manifests.common import K8sObject
from infra.manifests.operator import ChartRelease
from infra.topology import Topology

# Where Pulumi.yaml is: relative paths in the topology (operator.chart_path) start here.
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Manifests:
    topology: Topology
    operator: ChartRelease | None
    namespace: K8sObject | None
    pvc: K8sObject | None
    loader_job: K8sObject | None
    endpoints: K8sObject
    raycluster: K8sObject
    # Networked pattern: the games' StatefulSet and its headless Service.
    ue_statefulset: K8sObject | None = None
    ue_service: K8sObject | None = None
    # Who may reach the games and Ray (security.network_policies).
    network_policies: tuple[K8sObject, ...] = ()
    # The accounts pods run as that the stack creates (`service_account.create`).
    service_accounts: tuple[K8sObject, ...] = ()
    # The claim the runs are stored on (`runs.store: claim`, unless an existing one).
    runs_pvc: K8sObject | None = None
    # The Prometheus Operator's PodMonitor for the Ray pods (`metrics.pod_monitor`).
    pod_monitor: K8sObject | None = None

    def objects(self) -> list[K8sObject]:
        """Every object, in apply order."""
        return [
            obj
            for obj in (
                self.namespace,
                *self.service_accounts,  # before any pod that runs as one
                *self.network_policies,  # before any pod they guard
                self.pvc,
                self.runs_pvc,
                self.loader_job,
                self.endpoints,
                self.raycluster,
                self.pod_monitor,
                self.ue_service,
                self.ue_statefulset,
            )
            if obj is not None
        ]


def build(topology: Topology, project_root: Path = PROJECT_ROOT) -> Manifests:
    """Raises TopologyError naming the config path when the topology points at
    something unusable on this machine (operator.chart_path)."""
    return Manifests(
        topology=topology,
        operator=operator.chart_release(topology, project_root),
        namespace=namespace.namespace(topology),
        pvc=volume.pvc(topology),
        loader_job=volume.loader_job(topology),
        endpoints=endpoints_configmap.configmap(topology),
        raycluster=raycluster.raycluster(topology),
        ue_statefulset=simulator.statefulset(topology),
        ue_service=simulator.service(topology),
        network_policies=tuple(network_policy.policies(topology)),
        service_accounts=tuple(placement.service_accounts(topology)),
        runs_pvc=runs_storage.pvc(topology),
        pod_monitor=pod_monitor.pod_monitor(topology),
    )


__all__ = ["PROJECT_ROOT", "Manifests", "build"]
