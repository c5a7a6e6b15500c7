"""The KubeRay operator Helm release: its arguments, shared by Pulumi and `uerl render`.

The chart's objects are not built here: Helm renders them (Pulumi's
helm.v4.Chart), so CRDs follow chart upgrades.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.topology import Topology, TopologyError

CHART_NAME = "kuberay-operator"
RELEASE_NAME = "kuberay-operator"


@dataclass(frozen=True)
class ChartRelease:
    chart: str  # chart name in `repository`, or an absolute local path (air-gapped clusters)
    version: str
    repository: str | None  # None for a local chart
    namespace: str
    values: dict[str, Any] = field(default_factory=dict)
    # "install" | "adopt" | "skip": see topology.OperatorSpec.crds.
    crds: str = "install"
    release_name: str = RELEASE_NAME

    def describe(self) -> str:
        source = f"repository {self.repository}" if self.repository else "local chart"
        extras = [f"CRDs: {self.crds}"]
        if self.values:
            extras.append(f"values: {yaml.safe_dump(self.values, default_flow_style=True).strip()}")
        return (
            f"Helm chart {CHART_NAME} {self.version} ({source}: {self.chart}), "
            f"release {self.release_name} in namespace {self.namespace}; {'; '.join(extras)}"
        )


def _error(path: str, message: str) -> TopologyError:
    return TopologyError([(f"topology.operator.{path}", message)])


def local_chart_version(path: Path) -> str:
    """`version` of the chart at `path`: a chart directory or a packaged .tgz."""
    if path.is_dir():
        text = (path / "Chart.yaml").read_text()
    else:
        with tarfile.open(path) as archive:
            member = next(
                (
                    m
                    for m in archive.getmembers()
                    if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")
                ),
                None,
            )
            if member is None:
                raise FileNotFoundError(f"{path} holds no <chart>/Chart.yaml")
            extracted = archive.extractfile(member)
            assert extracted is not None
            text = extracted.read().decode()
    return str((yaml.safe_load(text) or {}).get("version"))


def resolve_chart_path(topology: Topology, project_root: Path) -> Path:
    """`operator.chart_path` as an absolute path, checked against `chart_version`.

    Relative to the project root (where Pulumi.yaml is), not to the directory
    Pulumi runs the program and its plugins in (`infra/`).
    """
    spec = topology.operator
    assert spec.chart_path is not None
    path = (project_root / spec.chart_path).resolve()
    if not path.exists():
        raise _error(
            "chart_path", f"{path} does not exist (relative paths start at {project_root})"
        )
    try:
        version = local_chart_version(path)
    except (OSError, tarfile.TarError, yaml.YAMLError) as exc:
        raise _error("chart_path", f"{path} is not a Helm chart: {exc}") from None
    if version != spec.chart_version:
        raise _error(
            "chart_version",
            f"{spec.chart_version!r} but the chart at {path} is version {version!r} "
            "(set chart_version to the chart's version, or point chart_path at that version)",
        )
    return path


def chart_release(topology: Topology, project_root: Path) -> ChartRelease | None:
    """None when the cluster already runs the operator (`operator.install: false`)."""
    spec = topology.operator
    if not spec.install:
        return None
    namespace = spec.namespace or topology.namespace
    common: dict[str, Any] = {"values": dict(spec.values), "crds": spec.crds}
    if spec.chart_path is not None:
        path = resolve_chart_path(topology, project_root)
        return ChartRelease(str(path), spec.chart_version, None, namespace, **common)
    return ChartRelease(CHART_NAME, spec.chart_version, spec.repository, namespace, **common)


def leftover_crd_message(crd_name: str) -> str:
    """What `crds: install` says when a CRD it creates already exists."""
    return (
        f"topology.operator.crds: 'install', but the cluster already has the CRD {crd_name} "
        "(left by an earlier KubeRay install: Helm never deletes CRDs). Take the CRDs over "
        "with `pulumi config set --path topology.operator.crds adopt` (updated to this "
        "chart's), or keep them as they are with `skip`, then run `pulumi up` again."
    )
