"""RunStorage: the claim a stack's training runs are stored on (`runs.store: claim`)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import ClusterAccess, register, stack_provider
from infra.manifests.common import K8sObject


class RunStorage(pulumi.ComponentResource):
    pvc: pulumi.CustomResource

    def __init__(
        self,
        name: str,
        pvc: K8sObject,
        keep: bool,
        access: ClusterAccess,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:RunStorage", name, None, opts)
        # Outlives every update of the Ray pods (a new image recreates them all): only a
        # new storage class or access mode replaces it, which `pulumi preview` shows.
        claim_opts = pulumi.ResourceOptions(parent=self, depends_on=list(depends_on))
        if keep:
            # `runs.claim.keep_on_destroy`: destroy leaves the claim and its runs. The next
            # `pulumi up` finds it there: an upserting provider takes it back where the
            # default one fails with AlreadyExists; without patch force, a claim that
            # differs stops the update instead of being overwritten.
            claim_opts.retain_on_delete = True
            claim_opts.provider = stack_provider(
                f"{name}-keep", self, access, upsert_existing_objects=True
            )
        self.pvc = register(pvc, claim_opts)
        self.register_outputs({"claim_name": pvc["metadata"]["name"]})
