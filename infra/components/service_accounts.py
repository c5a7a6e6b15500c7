"""StackServiceAccounts: the ServiceAccounts the stack creates, before any pod runs as one."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import register
from infra.manifests.common import K8sObject


class StackServiceAccounts(pulumi.ComponentResource):
    accounts: list[pulumi.CustomResource]

    def __init__(
        self,
        name: str,
        accounts: Sequence[K8sObject],
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:StackServiceAccounts", name, None, opts)
        self.accounts = [
            register(account, pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)))
            for account in accounts
        ]
        self.register_outputs({"names": [a["metadata"]["name"] for a in accounts]})
