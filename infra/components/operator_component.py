"""KubeRayOperator: the kuberay-operator Helm chart, pinned to the configured version."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.components.crds_component import KubeRayCRDs
from infra.components.k8s import ClusterAccess, stack_provider
from infra.manifests.operator import ChartRelease
from infra.manifests.operator_crds import crd_bundle


def adopting_provider(name: str, parent: pulumi.Resource, access: ClusterAccess) -> k8s.Provider:
    """A provider that takes over objects that already exist instead of failing
    with AlreadyExists (upsert), forcing field-manager conflicts with whoever
    applied them before (Helm, kubectl)."""
    return stack_provider(
        name, parent, access, upsert_existing_objects=True, enable_patch_force=True
    )


class KubeRayOperator(pulumi.ComponentResource):
    """The chart's CRDs (one KubeRayCRDs resource, upgraded with the chart, which
    helm itself never does), then the chart without them (helm.v4.Chart); every
    RayCluster depends on this.

    CRDs left behind by an earlier KubeRay (Helm never deletes them) make a
    plain install fail, naming the setting that fixes it: `crds: adopt` takes
    them over (and the rest of the chart's objects, should they exist too),
    `crds: skip` leaves them alone (they must then serve KubeRay 1.7's schema)."""

    chart: k8s.helm.v4.Chart
    crds: KubeRayCRDs | None

    def __init__(
        self,
        name: str,
        release: ChartRelease,
        stack: tuple[str, str],
        access: ClusterAccess,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:KubeRayOperator", name, None, opts)
        repository_opts = (
            k8s.helm.v4.RepositoryOptsArgs(repo=release.repository) if release.repository else None
        )
        self.crds = None
        chart_deps = list(depends_on)
        if release.crds != "skip":
            self.crds = KubeRayCRDs(
                f"{name}-crds",
                crd_bundle(release),
                release.crds,
                stack,
                access,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)),
            )
            chart_deps.append(self.crds)
        chart_opts = pulumi.ResourceOptions(parent=self, depends_on=chart_deps)
        if release.crds == "adopt":
            # `providers`: a component (the chart) hands it to the objects it creates.
            chart_opts.providers = [adopting_provider(f"{name}-adopt", self, access)]
        self.chart = k8s.helm.v4.Chart(
            release.release_name,
            chart=release.chart,
            version=release.version,
            repository_opts=repository_opts,
            namespace=release.namespace,
            name=release.release_name,
            values=release.values or None,
            skip_crds=True,  # KubeRayCRDs has them
            opts=chart_opts,
        )
        self.register_outputs({"version": release.version, "namespace": release.namespace})
