"""The KubeRay CRDs as one stack resource: where the bundle comes from, what its
provider diffs, and what it refuses (applying them for real: tests/k8s/test_pulumi_up.py)."""

from __future__ import annotations

import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fake_crd_api import FakeCrdAPI, crd_object, custom_resource, serving
from infra_fixtures import KUBERAY_CHART

from infra.components.crds_component import CrdError, CrdsProvider, _refuse_foreign
from infra.manifests.operator import ChartRelease
from infra.manifests.operator_crds import crd_bundle
from infra.topology import KUBERAY_REPOSITORY, TopologyError

OTHER_VERSION = "1.7.1"


def chart_archive(version: str) -> bytes:
    """The vendored chart packaged as `helm package` does, under another version."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(KUBERAY_CHART.rglob("*")):
            if path.is_file():
                data = path.read_bytes()
                if path.name == "Chart.yaml":
                    data = data.replace(b"version: 1.7.0", f"version: {version}".encode())
                info = tarfile.TarInfo(f"kuberay-operator/{path.relative_to(KUBERAY_CHART)}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture()
def helm_repository() -> Iterator[tuple[str, list[str]]]:
    """A Helm repository on loopback serving one chart version; yields its URL and the
    paths asked for."""
    archive = chart_archive(OTHER_VERSION)
    index = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "entries": {
                "kuberay-operator": [
                    {"version": OTHER_VERSION, "urls": [f"kuberay-operator-{OTHER_VERSION}.tgz"]}
                ]
            },
        }
    ).encode()
    files = {"/index.yaml": index, f"/kuberay-operator-{OTHER_VERSION}.tgz": archive}
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", asked
    finally:
        server.shutdown()
        server.server_close()


def release(version: str, repository: str | None, chart: str = "kuberay-operator") -> ChartRelease:
    return ChartRelease(chart, version, repository, "uerl")


def crd_names(path: Path) -> set[str]:
    return {d["metadata"]["name"] for d in yaml.load_all(path.read_text(), yaml.CSafeLoader) if d}


KUBERAY_CRDS = {f"{k}.ray.io" for k in ("rayclusters", "rayjobs", "rayservices", "raycronjobs")}


def test_the_default_chart_reads_the_vendored_crds_without_the_network(tmp_path: Path) -> None:
    bundle = crd_bundle(release("1.7.0", KUBERAY_REPOSITORY), cache=tmp_path)
    assert crd_names(bundle.path) == KUBERAY_CRDS
    assert bundle.digest in {  # the same bundle from the chart directory itself
        crd_bundle(release("1.7.0", None, str(KUBERAY_CHART)), cache=tmp_path).digest
    }


def test_another_chart_version_is_fetched_from_its_repository_once(
    helm_repository: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, asked = helm_repository
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = crd_bundle(release(OTHER_VERSION, url), cache=tmp_path / "bundles")
    second = crd_bundle(release(OTHER_VERSION, url), cache=tmp_path / "bundles")
    assert crd_names(first.path) == KUBERAY_CRDS and first == second
    assert asked == ["/index.yaml", f"/kuberay-operator-{OTHER_VERSION}.tgz"]  # then cached


def test_a_version_the_repository_lacks_is_refused_naming_chart_version(
    helm_repository: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = helm_repository
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(TopologyError, match=r"topology\.operator\.chart_version: .*1\.7\.1"):
        crd_bundle(release("9.9.9", url), cache=tmp_path)


def test_an_unreachable_repository_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(TopologyError, match=r"topology\.operator\.repository: could not fetch"):
        crd_bundle(release(OTHER_VERSION, "http://127.0.0.1:9/"), cache=tmp_path)


def test_an_update_acts_on_the_digest_version_and_mode_not_on_where_the_bundle_sits() -> None:
    olds = {"version": "1.7.0", "digest": "a", "mode": "install", "path": "/x", "context": None}
    diff = CrdsProvider().diff

    assert diff("id", olds, {**olds, "path": "/elsewhere", "context": "other"}).changes is False
    for key, value in (("digest", "b"), ("version", "1.7.1"), ("mode", "adopt")):
        result = diff("id", olds, {**olds, key: value})
        assert result.changes is True and result.replaces == [], key


def crd(*managers: str) -> dict[str, object]:
    return {
        "metadata": {"name": "rayjobs.ray.io", "managedFields": [{"manager": m} for m in managers]}
    }


def test_install_refuses_a_crd_left_by_an_earlier_kuberay_naming_adopt() -> None:
    with pytest.raises(CrdError, match=r"topology\.operator\.crds: 'install'.*adopt"):
        _refuse_foreign("rayjobs.ray.io", crd("helm"), "install")
    _refuse_foreign("rayjobs.ray.io", crd("helm"), "adopt")  # taken over


@pytest.mark.parametrize("mode", ["install", "adopt"])
def test_a_crd_another_pulumi_resource_manages_is_refused_with_the_hand_over(mode: str) -> None:
    # Adopting it would leave that resource to delete it (with every RayCluster) later.
    with pytest.raises(CrdError, match=r"pulumi state delete"):
        _refuse_foreign("rayjobs.ray.io", crd("helm", "pulumi-kubernetes-1a2b3c4d"), mode)


# -- the provider against a fake API server: what `pulumi destroy` and an update do ------

STACK = {"stack_namespace": "uerl", "stack_name": "uerl"}
THIS_STACKS = {"app.kubernetes.io/instance": "uerl"}
RAYCLUSTERS = "/apis/ray.io/v1/rayclusters"
RAYJOBS = "/apis/ray.io/v1/rayjobs"


@pytest.fixture()
def kube() -> Iterator[FakeCrdAPI]:
    api = FakeCrdAPI(crds={name: crd_object(name, "uerl") for name in sorted(KUBERAY_CRDS)})
    with serving(api):
        yield api


def provider_props(kube: FakeCrdAPI, mode: str, **extra: object) -> dict[str, object]:
    return {"names": sorted(KUBERAY_CRDS), "mode": mode, "context": None,
            "kubeconfig": kube.kubeconfig(), **STACK, **extra}  # fmt: skip


def test_destroy_in_adopt_mode_leaves_the_crds_in_place(kube: FakeCrdAPI) -> None:
    # They were there before the stack: other teams' RayClusters may depend on them.
    CrdsProvider().delete("id", provider_props(kube, "adopt"))
    assert kube.calls("DELETE") == [] and set(kube.crds) == KUBERAY_CRDS


@pytest.mark.parametrize(
    ("kind", "plural", "namespace", "labels"),
    [
        ("RayCluster", RAYCLUSTERS, "team-b", THIS_STACKS),  # another namespace
        ("RayJob", RAYJOBS, "uerl", {"app.kubernetes.io/instance": "other"}),  # another stack
        ("RayJob", RAYJOBS, "uerl", {}),  # made by hand in the stack's namespace
    ],
)
def test_destroy_in_install_mode_refuses_while_another_stack_has_custom_resources(
    kube: FakeCrdAPI, kind: str, plural: str, namespace: str, labels: dict[str, str]
) -> None:
    kube.resources[plural] = [custom_resource(kind, "theirs", namespace, **labels)]
    with pytest.raises(CrdError, match=rf"topology\.operator\.crds: .*{kind} {namespace}/theirs"):
        CrdsProvider().delete("id", provider_props(kube, "install"))
    assert kube.calls("DELETE") == []


def test_destroy_in_install_mode_deletes_the_crds_when_only_the_stacks_own_resources_are_left(
    kube: FakeCrdAPI,
) -> None:
    kube.resources[RAYCLUSTERS] = [custom_resource("RayCluster", "uerl", "uerl", **THIS_STACKS)]
    CrdsProvider().delete("id", provider_props(kube, "install"))
    assert len(kube.calls("DELETE")) == len(KUBERAY_CRDS) and kube.crds == {}


@pytest.fixture()
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "crds.yaml"
    path.write_text(yaml.safe_dump(crd_object("rayjobs.ray.io")))
    return path


def test_an_update_takes_over_no_field_another_manager_owns(kube: FakeCrdAPI, bundle: Path) -> None:
    kube.conflicts["rayjobs.ray.io"] = "kubectl-edit"
    props = provider_props(kube, "install", path=str(bundle), version="1.7.0", digest="b")
    with pytest.raises(
        CrdError, match=r"topology\.operator\.crds: .*rayjobs\.ray\.io.*kubectl-edit"
    ):
        CrdsProvider().update("id", props, props)
    assert [a for a in kube.calls("PATCH") if "force=true" in a] == []


def test_adopting_takes_over_the_fields_of_the_crds_former_installer(
    kube: FakeCrdAPI, bundle: Path
) -> None:
    # `adopt` is the user's word that the CRDs left by Helm are uerl's from now on.
    kube.crds["rayjobs.ray.io"] = crd_object("rayjobs.ray.io", "helm")
    kube.conflicts["rayjobs.ray.io"] = "helm"
    props = provider_props(kube, "adopt", path=str(bundle), version="1.7.0", digest="b")
    CrdsProvider().create(props)
    assert kube.crds["rayjobs.ray.io"]["metadata"]["managedFields"] == [{"manager": "uerl"}]
