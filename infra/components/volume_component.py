"""UeExecutablesVolume: the PVC holding the packaged game, and the optional loader Job."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import register
from infra.manifests.common import K8sObject


class UeExecutablesVolume(pulumi.ComponentResource):
    pvc: pulumi.CustomResource | None
    loader_job: pulumi.CustomResource | None

    def __init__(
        self,
        name: str,
        claim_name: str,
        pvc: K8sObject | None,
        loader_job: K8sObject | None,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:UeExecutablesVolume", name, None, opts)
        deps = list(depends_on)
        self.pvc = None
        if pvc is not None:
            self.pvc = register(pvc, pulumi.ResourceOptions(parent=self, depends_on=deps))
            deps.append(self.pvc)
        self.loader_job = None
        if loader_job is not None:
            # Pulumi waits for the Job to complete, as long as its
            # pulumi.com/timeoutSeconds annotation says (executables.loader_timeout_s).
            self.loader_job = register(
                loader_job, pulumi.ResourceOptions(parent=self, depends_on=deps)
            )
        self.claim_name = claim_name
        self.register_outputs({"claim_name": claim_name})

    @property
    def ready(self) -> list[pulumi.Resource]:
        """What a game must wait for: the unpacked build (or at least the claim)."""
        return [r for r in (self.loader_job or self.pvc,) if r is not None]
