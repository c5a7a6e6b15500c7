"""KubeRayOperator: the kuberay-operator Helm chart, pinned to the configured version."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.manifests.operator import ChartRelease


class KubeRayOperator(pulumi.ComponentResource):
    """helm.v4.Chart installs the chart's CRDs and upgrades them with the chart
    (helm itself never upgrades crds/); every RayCluster depends on this."""

    chart: k8s.helm.v4.Chart

    def __init__(
        self,
        name: str,
        release: ChartRelease,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:KubeRayOperator", name, None, opts)
        repository_opts = (
            k8s.helm.v4.RepositoryOptsArgs(repo=release.repository) if release.repository else None
        )
        self.chart = k8s.helm.v4.Chart(
            release.release_name,
            chart=release.chart,
            version=release.version,
            repository_opts=repository_opts,
            namespace=release.namespace,
            name=release.release_name,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)),
        )
        self.register_outputs({"version": release.version, "namespace": release.namespace})
