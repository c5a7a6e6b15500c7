"""UeInstances: the networked pattern's games, one Deployment + ClusterIP Service each."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import register
from infra.manifests import UeInstance


class UeInstances(pulumi.ComponentResource):
    deployments: dict[str, pulumi.CustomResource]
    services: dict[str, pulumi.CustomResource]

    def __init__(
        self,
        name: str,
        instances: Sequence[UeInstance],
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:UeInstances", name, None, opts)
        self.deployments, self.services = {}, {}
        for instance in instances:
            # Resource names are the instance names: scaling adds or removes
            # ue-N without touching the others.
            self.deployments[instance.name] = register(
                instance.deployment,
                pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)),
            )
            self.services[instance.name] = register(
                instance.service, pulumi.ResourceOptions(parent=self, depends_on=list(depends_on))
            )
        self.register_outputs({"instances": sorted(self.deployments)})
