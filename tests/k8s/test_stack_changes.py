"""What the real API server and KubeRay operator do with uerl's objects: sidecar games are
native sidecars in the pods the operator creates, two stacks share a namespace, and the
games' StatefulSet gives each game the DNS name the endpoints template expands to.

That a new Ray image recreates the pods while a rescale keeps them is proven through
Pulumi, on the same operator, by test_pulumi_up.py
(`test_a_rescale_updates_only_the_worker_count_and_keeps_the_pods`,
`test_a_new_ray_image_recreates_every_ray_pod`), and on real pods by the bucket run's
NEW_IMAGE fault (test_pods_e2e.py, in `make e2e-long`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane
from host_speed import guard
from stacks import deploy_and_wait

# pyproject's limit, scaled here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(guard(600))]


@pytest.fixture(autouse=True)
def _remove_stacks(control_plane: ControlPlane) -> Iterator[None]:
    """Each test's stacks go away after it, so the fake node has room for the next. Not
    waited for (the namespace controller takes about 10 s): each test has namespaces of
    its own names."""
    before = _uerl_namespaces(control_plane)
    yield
    for namespace in sorted(_uerl_namespaces(control_plane) - before):
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false")


def _uerl_namespaces(cp: ControlPlane) -> set[str]:
    items = cp.get_json("namespaces")["items"]
    return {n["metadata"]["name"] for n in items if n["metadata"]["name"].startswith("uerl-")}


def _ray_pods(cp: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    return cp.get_json("pods", "-n", namespace, "-l", f"ray.io/cluster={name}")["items"]


def _stack(name: str, *sets: str) -> list[str]:
    args = ["--stack", "dev", "--set", f"topology.name={name}"]
    args += ["--set", f"topology.namespace=uerl-{name}"]
    for item in sets:
        args += ["--set", f"topology.{item}"]
    return args


def test_sidecar_games_run_as_native_sidecars_in_the_operators_pods(
    control_plane: ControlPlane,
) -> None:
    cp = control_plane
    deploy_and_wait(cp, *_stack("side", "pattern=sidecar"))
    workers = [
        p
        for p in _ray_pods(cp, "uerl-side", "side")
        if p["metadata"]["labels"]["ray.io/group"] == "workers"
    ]
    assert len(workers) == 2
    for pod in workers:
        spec = pod["spec"]
        assert spec["containers"][0]["name"] == "ray-worker"  # KubeRay's Ray container
        game = next(c for c in spec["initContainers"] if c["name"] == "ue")
        assert game["restartPolicy"] == "Always" and "startupProbe" in game
        # The game comes before the init container KubeRay injects (its wait for the
        # head's GCS, on by default), so it starts first.
        names = [c["name"] for c in spec["initContainers"]]
        assert names == ["ue", "wait-gcs-ready"], names
        assert spec.get("restartPolicy", "Always") == "Always"


def test_two_networked_stacks_share_a_namespace_without_colliding(
    control_plane: ControlPlane,
) -> None:
    cp = control_plane
    for name in ("alpha", "beta"):
        args = _stack(name, "pattern=networked", "workers.replicas=2")
        args[args.index("topology.namespace=uerl-" + name)] = "topology.namespace=uerl-shared"
        deploy_and_wait(cp, *args)
    statefulsets = cp.get_json("statefulsets", "-n", "uerl-shared")["items"]
    assert {s["metadata"]["name"] for s in statefulsets} == {"alpha-ue", "beta-ue"}
    pods = {p["metadata"]["name"] for p in cp.get_json("pods", "-n", "uerl-shared")["items"]}
    assert {"alpha-ue-1", "alpha-ue-2", "beta-ue-1", "beta-ue-2"} <= pods


def test_each_game_pod_has_the_dns_name_the_endpoints_template_expands_to(
    control_plane: ControlPlane,
) -> None:
    cp, ns = control_plane, "uerl-dns"
    objects = deploy_and_wait(cp, *_stack("dns", "pattern=networked", "workers.replicas=3"))
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    endpoints = json.loads(next(iter(config["data"].values())))
    template = endpoints["worker_url_template"]
    for index in (1, 2, 3):
        pod = cp.get_json("pod", "-n", ns, f"dns-ue-{index}")
        service = pod["spec"]["subdomain"]
        dns = f"{pod['spec']['hostname']}.{service}.{ns}.svc.cluster.local"
        assert template.replace("{worker_index}", str(index)) == dns
        assert cp.get_json("service", "-n", ns, service)["spec"]["clusterIP"] == "None"
