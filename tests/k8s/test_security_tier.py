"""Least privilege on the real API server: its built-in PodSecurity admission enforces
`restricted` in the namespace uerl creates, every pod of both patterns (KubeRay's
injected init containers included) is admitted and runs, a privileged pod is refused,
and the NetworkPolicies the server accepted, evaluated against the live pods' labels,
let a game be reached by its own stack's Ray pods only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane
from network_policy_eval import Peer, ingress_allowed  # tests/, on the path via its conftest
from stacks import deploy_and_wait, running_and_ready

from infra.manifests import pod_security

pytestmark = pytest.mark.k8s

NS = "uerl-sec"


@pytest.fixture(autouse=True)
def _remove_namespace(control_plane: ControlPlane) -> Iterator[None]:
    yield
    control_plane.kubectl(
        "delete", "namespace", NS, "--wait=true", "--timeout=120s", "--ignore-not-found"
    )


def _stack(name: str, *sets: str, create_namespace: bool = True) -> list[str]:
    args = ["--stack", "dev", "--set", f"topology.name={name}", "--set", f"topology.namespace={NS}"]
    if not create_namespace:
        args += ["--set", "topology.create_namespace=false"]
    for item in sets:
        args += ["--set", f"topology.{item}"]
    return args


def _pods(cp: ControlPlane) -> list[dict[str, Any]]:
    return cp.get_json("pods", "-n", NS)["items"]


@pytest.mark.parametrize("pattern", ["sidecar", "networked"])
def test_every_pod_is_admitted_under_restricted_and_runs(
    control_plane: ControlPlane, pattern: str
) -> None:
    cp = control_plane
    # With mutual TLS to the games: their Secret's volumes must pass `restricted` too.
    tls = ("simulator.tls.secret=game-tls", "simulator.tls.mutual=true")
    deploy_and_wait(cp, *_stack("sec", f"pattern={pattern}", *tls))
    labels = cp.get_json("namespace", NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = _pods(cp)
    assert pods and all(running_and_ready(p) for p in pods)
    # What the server stored, with KubeRay's own init container in the worker pods.
    assert {p["metadata"]["name"]: pod_security.violations(p["spec"]) for p in pods} == {
        p["metadata"]["name"]: [] for p in pods
    }
    injected = {
        c["name"] for p in pods for c in p["spec"].get("initContainers", []) if c["name"] != "ue"
    }
    assert injected, "KubeRay injected no init container: nothing of its was checked"
    # Every pod but the learners' dials or serves a game, so mounts the games' Secret.
    secrets = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: sorted(
            v["secret"]["secretName"] for v in p["spec"].get("volumes", []) if "secret" in v
        )
        for p in pods
    }
    expected = {"ray-head": ["game-tls"], "ray-learner": []}
    if pattern == "sidecar":  # the game serves, its env runner dials: one volume each
        expected["ray-env-runner"] = ["game-tls", "game-tls"]
    else:
        expected |= {"ray-env-runner": ["game-tls"], "simulator": ["game-tls"]}
    assert secrets == expected
    # The head's ports (GCS, client, dashboard) stay inside the cluster.
    head_service = cp.get_json("service", "sec-head-svc", "-n", NS)
    assert head_service["spec"]["type"] == "ClusterIP"


def test_a_privileged_pod_in_that_namespace_is_refused(control_plane: ControlPlane) -> None:
    cp = control_plane
    deploy_and_wait(cp, *_stack("sec"))
    privileged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": NS},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "securityContext": {"privileged": True}}
            ]
        },
    }
    result = cp.kubectl(
        "apply", "--server-side", "--field-manager=uerl-tests", "-f", "-",
        input=json.dumps(privileged), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted' in result.stderr, result.stderr


def test_a_game_is_reached_by_its_own_stacks_ray_pods_only(control_plane: ControlPlane) -> None:
    cp = control_plane
    deploy_and_wait(cp, *_stack("a", "pattern=networked", "simulator.kind=mock"))
    deploy_and_wait(
        cp, *_stack("b", "pattern=networked", "simulator.kind=mock", create_namespace=False)
    )
    policies = cp.get_json("networkpolicies", "-n", NS)["items"]
    assert {p["metadata"]["name"] for p in policies} == {"a-ray", "a-ue", "b-ray", "b-ue"}
    pods = _pods(cp)
    games = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "ue"]
    assert len(games) == 6  # two stacks x (2 workers + discovery)
    for game in games:
        stack = game["metadata"]["labels"]["app.kubernetes.io/instance"]
        allowed = {
            p["metadata"]["name"]
            for p in pods
            if ingress_allowed(
                policies,
                namespace=NS,
                pod_labels=game["metadata"]["labels"],
                peer=Peer(NS, p["metadata"]["labels"]),
                port=50051,
            )
        }
        own_ray = {
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["labels"].get("ray.io/cluster") == stack
        }
        assert allowed == own_ray, game["metadata"]["name"]
