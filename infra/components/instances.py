"""UeGames: the networked pattern's games, one StatefulSet behind one headless Service."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.components.k8s import register
from infra.manifests.common import K8sObject


class UeGames(pulumi.ComponentResource):
    """Two resources whatever the number of games: rescaling updates one field."""

    statefulset: pulumi.CustomResource
    service: pulumi.CustomResource

    def __init__(
        self,
        name: str,
        statefulset: K8sObject,
        service: K8sObject,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:UeGames", name, None, opts)
        # The Service first: the StatefulSet's pods get their DNS names from it.
        self.service = register(
            service, pulumi.ResourceOptions(parent=self, depends_on=list(depends_on))
        )
        self.statefulset = register(
            statefulset,
            pulumi.ResourceOptions(parent=self, depends_on=[*depends_on, self.service]),
        )
        self.register_outputs({"replicas": statefulset["spec"]["replicas"]})
