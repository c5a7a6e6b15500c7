"""The KubeRay operator Helm release: its arguments, shared by Pulumi and `uerl render`.

The chart's objects are not built here: Helm renders them (Pulumi's
helm.v4.Chart), so CRDs follow chart upgrades.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.topology import Topology

CHART_NAME = "kuberay-operator"
RELEASE_NAME = "kuberay-operator"


@dataclass(frozen=True)
class ChartRelease:
    chart: str  # chart name in `repository`, or a local path (air-gapped clusters)
    version: str
    repository: str | None  # None for a local chart
    namespace: str
    release_name: str = RELEASE_NAME

    def describe(self) -> str:
        source = f"repository {self.repository}" if self.repository else "local chart"
        return (
            f"Helm chart {CHART_NAME} {self.version} ({source}: {self.chart}), "
            f"release {self.release_name} in namespace {self.namespace}"
        )


def chart_release(topology: Topology) -> ChartRelease | None:
    """None when the cluster already runs the operator (`operator.install: false`)."""
    spec = topology.operator
    if not spec.install:
        return None
    namespace = spec.namespace or topology.namespace
    if spec.chart_path is not None:
        return ChartRelease(spec.chart_path, spec.chart_version, None, namespace)
    return ChartRelease(CHART_NAME, spec.chart_version, spec.repository, namespace)
