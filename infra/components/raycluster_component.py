"""UerlRayCluster: the RayCluster custom resource and the endpoints ConfigMap its head mounts."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import register
from infra.manifests.common import K8sObject


class UerlRayCluster(pulumi.ComponentResource):
    endpoints: pulumi.CustomResource
    raycluster: pulumi.CustomResource

    def __init__(
        self,
        name: str,
        raycluster: K8sObject,
        endpoints: K8sObject,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:UerlRayCluster", name, None, opts)
        self.endpoints = register(
            endpoints, pulumi.ResourceOptions(parent=self, depends_on=list(depends_on))
        )
        # After the operator (its CRD must exist) and the ConfigMap the head mounts.
        self.raycluster = register(
            raycluster,
            pulumi.ResourceOptions(parent=self, depends_on=[*depends_on, self.endpoints]),
        )
        self.register_outputs({"name": raycluster["metadata"]["name"]})
