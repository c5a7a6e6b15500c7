"""The KubeRay CRDs the operator chart carries, as one bundle named by its digest.

The chart's four CRDs are 4.1 MB of YAML. Installed as the chart's children, every
`pulumi preview` and `up` sent them through the engine, the provider's Check and Diff
and the state file: 25 s of a no-change preview here against 3.5 s without them
(docs/performance.md). So the stack installs them as one resource whose inputs are
the bundle's digest and the path of a cache file holding it: an update diffs a digest,
and the CRDs still follow the chart (a new chart version is a new digest).

The bundle comes from the chart the topology names: a local chart (`chart_path`), the
copy under third_party/ when the repository and version are the ones it was taken
from, or the chart archive fetched once from the Helm repository into a cache.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from infra.manifests.operator import CHART_NAME, ChartRelease
from infra.topology import KUBERAY_CHART_VERSION, KUBERAY_REPOSITORY, TopologyError

# The chart as upstream serves it (third_party/kuberay-operator-1.7.0/PROVENANCE.md).
VENDORED_CHART = (
    Path(__file__).resolve().parents[2] / "third_party" / f"{CHART_NAME}-{KUBERAY_CHART_VERSION}"
)
FETCH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CrdBundle:
    version: str  # the chart's
    digest: str  # sha256 of the bundle's bytes
    path: Path  # the bundle: the chart's crds/*.yaml, in name order, as one YAML stream


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "uerl" / "kuberay-crds"


def _error(path: str, message: str) -> TopologyError:
    return TopologyError([(f"topology.operator.{path}", message)])


def _crds_from_dir(chart: Path) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted((chart / "crds").glob("*.yaml"))]


def _crds_from_archive(data: bytes) -> list[tuple[str, bytes]]:
    found = []
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            parts = member.name.split("/")
            if len(parts) == 3 and parts[1] == "crds" and parts[2].endswith(".yaml"):
                extracted = archive.extractfile(member)
                if extracted is not None:
                    found.append((parts[2], extracted.read()))
    return sorted(found)


def _get(url: str, field: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return bytes(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _error(field, f"could not fetch {url}: {exc}") from None


def fetch_chart(repository: str, version: str, cache: Path) -> bytes:
    """The chart archive from a Helm repository (its index.yaml names the archive's URL),
    kept in `cache` so that later runs read no network."""
    cached = cache / f"{CHART_NAME}-{version}.tgz"
    if cached.is_file():
        return cached.read_bytes()
    index_url = repository.rstrip("/") + "/index.yaml"
    try:
        index = yaml.load(_get(index_url, "repository"), Loader=yaml.CSafeLoader) or {}
    except yaml.YAMLError as exc:
        raise _error("repository", f"{index_url} is not a Helm repository index: {exc}") from None
    entries = (index.get("entries") or {}).get(CHART_NAME) or []
    entry = next((e for e in entries if str(e.get("version")) == version), None)
    if entry is None or not entry.get("urls"):
        known = ", ".join(sorted(str(e.get("version")) for e in entries)[-5:]) or "none"
        raise _error(
            "chart_version",
            f"{repository} has no {CHART_NAME} {version!r} (latest versions there: {known})",
        )
    data = _get(urllib.parse.urljoin(index_url, entry["urls"][0]), "repository")
    cache.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".part{os.getpid()}")
    partial.write_bytes(data)
    partial.replace(cached)  # complete or absent
    return data


def chart_crds(release: ChartRelease) -> list[tuple[str, bytes]]:
    """(file name, YAML) of each CRD in the chart's crds/, in name order."""
    if release.repository is None:
        path = Path(release.chart)
        crds = _crds_from_dir(path) if path.is_dir() else _crds_from_archive(path.read_bytes())
        source = str(path)
    elif (
        release.repository.rstrip("/") == KUBERAY_REPOSITORY.rstrip("/")
        and release.version == KUBERAY_CHART_VERSION
        and VENDORED_CHART.is_dir()
    ):
        crds, source = _crds_from_dir(VENDORED_CHART), str(VENDORED_CHART)
    else:
        data = fetch_chart(release.repository, release.version, cache_dir() / "charts")
        crds, source = _crds_from_archive(data), f"{release.repository} {release.version}"
    if not crds:
        raise _error("chart_path", f"the chart ({source}) has no CRDs under crds/")
    return crds


def crd_bundle(release: ChartRelease, cache: Path | None = None) -> CrdBundle:
    """The chart's CRDs as one file named by its digest (written once)."""
    body = b"".join(b"---\n" + text.rstrip(b"\n") + b"\n" for _, text in chart_crds(release))
    digest = hashlib.sha256(body).hexdigest()
    directory = cache or cache_dir()
    path = directory / f"{CHART_NAME}-{release.version}-{digest[:16]}.yaml"
    if not (path.is_file() and path.stat().st_size == len(body)):
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".part{os.getpid()}")
        partial.write_bytes(body)
        partial.replace(path)
    return CrdBundle(release.version, digest, path)
