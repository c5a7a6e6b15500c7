"""The real control plane (kube-apiserver, controllers, KWOK nodes, KubeRay operator)
accepts and reconciles what `uerl render` produces.

The plane is shared with the modules run beside this one (tests/k8s/conftest.py): the
module's stacks are removed at its end, and the volume its Unreal stack claimed made free
again, so the next module finds the plane as this one did (test_package_consumers.py's
own `dev` stack is `uerl` in namespace `uerl` too)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from controlplane import KUBERAY_CRDS_DIR, ControlPlane, pinned_versions
from host_speed import guard
from stacks import WORKLOADS, deploy_and_wait

# pyproject's limit, scaled here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(guard(600))]

RWX_VOLUME = "uerl-test-rwx"


@pytest.fixture(scope="module", autouse=True)
def _leave_the_plane_as_found(control_plane: ControlPlane) -> Iterator[None]:
    """After the module: its namespaces deleted and waited for (another module may make
    one of the same name at once), and the ReadWriteMany volume, Released by its claim's
    deletion (reclaim policy Retain), Available again."""
    cp = control_plane
    before = _namespaces(cp)
    yield
    made = sorted(_namespaces(cp) - before)
    for namespace in made:
        cp.kubectl("delete", "namespace", namespace, "--wait=false")
    # Hang guards: the namespace controller takes about 10 s idle, the volume binder
    # resyncs every 15 s.
    cp.wait_until(lambda: not _namespaces(cp) & set(made), guard(180), f"namespaces {made} gone")
    if cp.get_json("pv", RWX_VOLUME)["spec"].get("claimRef"):
        cp.wait_until(
            lambda: cp.get_json("pv", RWX_VOLUME)["status"].get("phase") == "Released",
            guard(180),
            f"volume {RWX_VOLUME} Released",
        )
        cp.kubectl(
            "patch", "pv", RWX_VOLUME, "--type=json",
            "-p", '[{"op": "remove", "path": "/spec/claimRef"}]',
        )  # fmt: skip
    cp.wait_until(
        lambda: cp.get_json("pv", RWX_VOLUME)["status"].get("phase") == "Available",
        guard(180),
        f"volume {RWX_VOLUME} Available",
    )


def _namespaces(cp: ControlPlane) -> set[str]:
    return {n["metadata"]["name"] for n in cp.get_json("namespaces")["items"]}


def test_kwok_node_is_ready(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == pinned_versions()["kubernetes"]

    lines = control_plane.kubectl("get", "nodes", "--no-headers").stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["kwok-node-0", "Ready"]]
    node = control_plane.get_json("node", "kwok-node-0")
    assert node["status"]["allocatable"]["cpu"] == "32"
    assert node["status"]["allocatable"]["memory"] == "64Gi"


def test_kuberay_crds_apply(control_plane: ControlPlane) -> None:
    # Server-side: client-side apply of the RayCluster, RayJob and RayService
    # CRDs fails (the last-applied-configuration annotation exceeds 256 KiB).
    out = control_plane.kubectl("apply", "--server-side", "-f", str(KUBERAY_CRDS_DIR)).stdout
    assert sorted(line.split()[0] for line in out.splitlines()) == [
        f"customresourcedefinition.apiextensions.k8s.io/{kind}.ray.io"
        for kind in ("rayclusters", "raycronjobs", "rayjobs", "rayservices")
    ]
    control_plane.kubectl(
        "wait", "--for=condition=Established", f"--timeout={guard(120):.0f}s",
        "crd/rayclusters.ray.io",
    )  # fmt: skip


def test_dev_stack_is_reconciled(control_plane: ControlPlane) -> None:
    """The dev stack (mock game, sidecar pattern): head + learners + workers Running."""
    objects = deploy_and_wait(control_plane, "--stack", "dev")
    kinds = [o["kind"] for o in objects]
    assert kinds == [
        "Namespace",
        "NetworkPolicy",
        "NetworkPolicy",  # the run supervisors' way to the head's job API
        "PersistentVolumeClaim",  # the runs'
        "ConfigMap",
        "RayCluster",
    ]


def test_unreal_networked_stack_claims_the_rwx_volume(control_plane: ControlPlane) -> None:
    """An Unreal stack, networked: its executables claim binds a ReadWriteMany volume,
    the games' workload rolls out and the RayCluster comes up."""
    objects = deploy_and_wait(
        control_plane,
        "--stack", "dev",
        "--set", "topology.name=ue",
        "--set", "topology.namespace=uerl-ue",
        "--set", "topology.simulator.kind=unreal",
        "--set", "topology.pattern=networked",
        "--set", "topology.workers.replicas=3",
    )  # fmt: skip
    claim = next(
        o
        for o in objects
        if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == "ue-ue-executables"
    )
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]

    def bound() -> bool:
        got = control_plane.get_json(
            "pvc", "-n", claim["metadata"]["namespace"], claim["metadata"]["name"]
        )
        return got.get("status", {}).get("phase") == "Bound"

    # The volume binder resyncs every 15 s: a hang guard well above that.
    control_plane.wait_until(bound, guard(180), f"claim {claim['metadata']['name']} Bound")
    pv = control_plane.get_json("pv", RWX_VOLUME)
    assert pv["spec"]["claimRef"]["name"] == claim["metadata"]["name"]
    assert any(o["kind"] in WORKLOADS for o in objects)
