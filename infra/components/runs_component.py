"""RunStorage: the claim a stack's training runs are stored on (`runs.store: claim`)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import register
from infra.manifests.common import K8sObject


class RunStorage(pulumi.ComponentResource):
    pvc: pulumi.CustomResource

    def __init__(
        self,
        name: str,
        pvc: K8sObject,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:RunStorage", name, None, opts)
        # Outlives every update of the Ray pods (a new image recreates them all): only a
        # new storage class or access mode replaces it, which `pulumi preview` shows.
        self.pvc = register(pvc, pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)))
        self.register_outputs({"claim_name": pvc["metadata"]["name"]})
