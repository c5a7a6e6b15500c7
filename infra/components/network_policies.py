"""StackNetworkPolicies: the stack's NetworkPolicies, created before any pod they guard."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import register
from infra.manifests.common import K8sObject


class StackNetworkPolicies(pulumi.ComponentResource):
    policies: list[pulumi.CustomResource]

    def __init__(
        self,
        name: str,
        policies: Sequence[K8sObject],
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:StackNetworkPolicies", name, None, opts)
        self.policies = [
            register(policy, pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)))
            for policy in policies
        ]
        self.register_outputs({"names": [p["metadata"]["name"] for p in policies]})
