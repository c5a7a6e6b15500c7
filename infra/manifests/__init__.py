"""Pure builders: topology -> the Kubernetes objects of a uerl deployment, as plain dicts.

`pulumi up` (infra/components), `uerl render` and the tests all use these,
so what is rendered is what is deployed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.manifests import endpoints, namespace, operator, raycluster, simulator, volume
from infra.manifests.common import K8sObject
from infra.manifests.operator import ChartRelease
from infra.topology import Topology


@dataclass(frozen=True)
class UeInstance:
    """One networked game: a Deployment and the ClusterIP Service in front of it."""

    name: str
    deployment: K8sObject
    service: K8sObject


@dataclass(frozen=True)
class Manifests:
    topology: Topology
    operator: ChartRelease | None
    namespace: K8sObject | None
    pvc: K8sObject | None
    loader_job: K8sObject | None
    endpoints: K8sObject
    raycluster: K8sObject
    ue_instances: list[UeInstance] = field(default_factory=list)

    def objects(self) -> list[K8sObject]:
        """Every object, in apply order."""
        out = [
            obj
            for obj in (self.namespace, self.pvc, self.loader_job, self.endpoints, self.raycluster)
            if obj is not None
        ]
        for instance in self.ue_instances:
            out += [instance.deployment, instance.service]
        return out


def build(topology: Topology) -> Manifests:
    return Manifests(
        topology=topology,
        operator=operator.chart_release(topology),
        namespace=namespace.namespace(topology),
        pvc=volume.pvc(topology),
        loader_job=volume.loader_job(topology),
        endpoints=endpoints.configmap(topology),
        raycluster=raycluster.raycluster(topology),
        ue_instances=[
            UeInstance(
                name, simulator.deployment(topology, name), simulator.service(topology, name)
            )
            for name in simulator.instance_names(topology)
        ],
    )


__all__ = ["Manifests", "UeInstance", "build"]
