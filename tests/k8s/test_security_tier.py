"""Least privilege on the real API server: its built-in PodSecurity admission enforces
`restricted` in the namespace uerl creates, every pod of both patterns (KubeRay's
injected init containers included) is admitted and runs, and the NetworkPolicies the
server accepted, evaluated against the live pods' labels, let a game be reached by its
own stack's Ray pods only. What `restricted` refuses (a privileged pod among them: case
"privileged") is checked case by case against uerl's own check, in a namespace with the
label uerl's namespace is shown to carry; on real pods, test_pods_e2e.py's
`test_the_namespace_refuses_a_pod_that_breaks_restricted` has a pod refused in uerl's own
namespace."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane
from host_speed import guard
from infra_fixtures import OWN_CLUSTER  # tests/, on the path via its conftest
from network_policy_eval import Peer, ingress_allowed  # tests/, on the path via its conftest
from stacks import deploy_and_wait, render, running_and_ready

from infra.manifests import pod_security

# pyproject's limit, scaled here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(guard(600))]

_NAMESPACES = itertools.count(1)


@pytest.fixture
def ns(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace of the test's own: it is deleted after the test without waiting for
    the namespace controller (about 10 s), as the next test uses another."""
    name = f"uerl-sec-{next(_NAMESPACES)}"
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def _stack(ns: str, name: str, *sets: str, create_namespace: bool = True) -> list[str]:
    args = ["--stack", "dev", "--set", f"topology.name={name}", "--set", f"topology.namespace={ns}"]
    if not create_namespace:
        args += ["--set", "topology.create_namespace=false"]
    for item in sets:
        args += ["--set", f"topology.{item}"]
    return args


def _pods(cp: ControlPlane, ns: str) -> list[dict[str, Any]]:
    return cp.get_json("pods", "-n", ns)["items"]


@pytest.mark.parametrize("pattern", ["sidecar", "networked"])
def test_every_pod_is_admitted_under_restricted_and_runs(
    control_plane: ControlPlane, ns: str, pattern: str
) -> None:
    cp = control_plane
    # With mutual TLS to the games: their Secret's volumes must pass `restricted` too.
    tls = ("simulator.tls.secret=game-tls", "simulator.tls.mutual=true")
    deploy_and_wait(cp, *_stack(ns, "sec", f"pattern={pattern}", *tls))
    labels = cp.get_json("namespace", ns)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = _pods(cp, ns)
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
    head_service = cp.get_json("service", "sec-head-svc", "-n", ns)
    assert head_service["spec"]["type"] == "ClusterIP"


def test_a_game_is_reached_by_its_own_stacks_ray_pods_only(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    deploy_and_wait(cp, *_stack(ns, "a", "pattern=networked", "simulator.kind=mock"))
    deploy_and_wait(
        cp, *_stack(ns, "b", "pattern=networked", "simulator.kind=mock", create_namespace=False)
    )
    policies = cp.get_json("networkpolicies", "-n", ns)["items"]
    assert {p["metadata"]["name"] for p in policies} == {
        "a-ray", "a-ue", "a-ray-head-supervisor", "b-ray", "b-ue", "b-ray-head-supervisor",
    }  # fmt: skip
    pods = _pods(cp, ns)
    games = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "ue"]
    assert len(games) == 6  # two stacks x (2 workers + discovery)
    for game in games:
        stack = game["metadata"]["labels"]["app.kubernetes.io/instance"]
        allowed = {
            p["metadata"]["name"]
            for p in pods
            if ingress_allowed(
                policies,
                namespace=ns,
                pod_labels=game["metadata"]["labels"],
                peer=Peer(ns, p["metadata"]["labels"]),
                port=50051,
            )
        }
        own_ray = {
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["labels"].get("ray.io/cluster") == stack
        }
        assert allowed == own_ray, game["metadata"]["name"]


# -- a team's own cluster: every pod field, admitted by the API server ------------------


def _pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template the stack renders, by where it is: the RayCluster's groups, the
    games' StatefulSet, the loader's Job."""
    found: dict[str, dict[str, Any]] = {}
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "RayCluster":
            found["ray-head"] = spec["headGroupSpec"]["template"]
            for group in spec["workerGroupSpecs"]:
                found[f"ray-{group['groupName']}"] = group["template"]
        elif obj["kind"] in ("StatefulSet", "Job"):
            found[f"{obj['kind']}/{obj['metadata']['name']}"] = spec["template"]
    return found


def test_every_own_cluster_field_is_admitted_under_restricted(
    control_plane: ControlPlane, ns: str
) -> None:
    """The own-cluster variant (every group placed, named, pulling with secrets, GPUs of
    other vendors, no CPU limits, the user's token Secret): the server takes each object
    (dry run), and a pod of each template passes its admission (PodSecurity `restricted`,
    the service account and priority class existing, requests and limits valid)."""
    cp = control_plane
    sets = [item.removeprefix("topology.") for item in OWN_CLUSTER]
    _, objects = render(*_stack(ns, "own", *sets))
    kinds = {o["kind"] for o in objects}
    assert {"RayCluster", "StatefulSet", "Job", "ServiceAccount", "Namespace"} <= kinds
    cluster = next(o for o in objects if o["kind"] == "RayCluster")
    assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": "team-ray-token"}
    # What must exist before a pod is admitted: the namespace (restricted), the accounts
    # the stack creates, and the PriorityClass (the cluster's, not the stack's).
    made_first = [o for o in objects if o["kind"] in ("Namespace", "ServiceAccount")]
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "uerl-high"}, "value": 1000}  # fmt: skip
    apply = ("apply", "--server-side", "--field-manager=uerl-tests", "-f", "-")
    cp.kubectl(*apply, input=json.dumps({"apiVersion": "v1", "kind": "List",
                                          "items": [priority, *made_first]}))  # fmt: skip
    try:
        rest = [o for o in objects if o not in made_first]
        listed = {"apiVersion": "v1", "kind": "List", "items": rest}
        cp.kubectl(*apply, "--dry-run=server", input=json.dumps(listed))
        templates = _pod_templates(objects)
        assert set(templates) == {"ray-head", "ray-learners", "ray-workers",
                                  "StatefulSet/own-ue", "Job/own-ue-loader"}  # fmt: skip
        for where, template in templates.items():
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"admit-{len(where)}", "namespace": ns,
                                "labels": template["metadata"].get("labels", {})},
                   "spec": template["spec"]}  # fmt: skip
            done = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                              input=json.dumps(pod), check=False)  # fmt: skip
            assert done.returncode == 0, f"{where}: {done.stderr}"
            admitted = json.loads(done.stdout)["spec"]
            assert admitted["priorityClassName"] == "uerl-high", where
            assert admitted["serviceAccountName"] == "uerl-runner", where
            assert pod_security.violations(admitted) == [], where
    finally:
        cp.kubectl("delete", "priorityclass", "uerl-high", "--ignore-not-found")


# -- uerl's own check of `restricted` against the API server's PodSecurity admission ----

PSA_NS = "uerl-psa"


def _restricted_pod(**spec_changes: Any) -> dict[str, Any]:
    spec = pod_security.restrict(
        {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "securityContext": pod_security.container_context(1000),
                }
            ]
        }
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "case"}, "spec": spec}


def _with(change: Any) -> dict[str, Any]:
    pod = _restricted_pod()
    change(
        pod["spec"], pod["spec"]["containers"][0], pod["spec"]["containers"][0]["securityContext"]
    )
    return pod


def _volume(kind: str, source: dict[str, Any]) -> Any:
    def change(spec: dict[str, Any], *_: Any) -> None:
        spec["volumes"].append({"name": "v", kind: source})

    return change


# One change each to a pod `restrict` made: what the standard allows and what it refuses.
PSA_CASES: dict[str, Any] = {
    "as restricted": lambda *_: None,
    "privileged": lambda s, c, x: (  # the API refuses it with allowPrivilegeEscalation false
        x.update(privileged=True),
        x.pop("allowPrivilegeEscalation"),
    ),
    "privilege escalation": lambda s, c, x: x.update(allowPrivilegeEscalation=True),
    "capability added": lambda s, c, x: x.update(
        capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    ),
    "NET_BIND_SERVICE added": lambda s, c, x: x.update(
        capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    ),
    "capabilities not dropped": lambda s, c, x: x.pop("capabilities"),
    "root user": lambda s, c, x: x.update(runAsUser=0),
    "non-root not required": lambda s, c, x: (
        x.pop("runAsNonRoot"),
        s["securityContext"].pop("runAsNonRoot"),
    ),
    "seccomp unconfined": lambda s, c, x: x.update(seccompProfile={"type": "Unconfined"}),
    "host network": lambda s, c, x: s.update(hostNetwork=True),
    "host port": lambda s, c, x: c.update(ports=[{"containerPort": 80, "hostPort": 8080}]),
    "unmasked proc": lambda s, c, x: (  # allowed by the API only in a user namespace
        s.update(hostUsers=False),
        x.update(procMount="Unmasked"),
    ),
    "unsafe sysctl": lambda s, c, x: s["securityContext"].update(
        sysctls=[{"name": "kernel.msgmax", "value": "65536"}]
    ),
    "safe sysctl": lambda s, c, x: s["securityContext"].update(
        sysctls=[{"name": "net.ipv4.tcp_syncookies", "value": "1"}]
    ),
    "custom SELinux type": lambda s, c, x: x.update(seLinuxOptions={"type": "spc_t"}),
    "AppArmor unconfined": lambda s, c, x: x.update(appArmorProfile={"type": "Unconfined"}),
    "hostPath volume": _volume("hostPath", {"path": "/etc"}),
    "nfs volume": _volume("nfs", {"server": "nfs.example", "path": "/"}),
    "iscsi volume": _volume(
        "iscsi",
        {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0},
    ),
    "configMap volume": _volume("configMap", {"name": "cm"}),
    "secret volume": _volume("secret", {"secretName": "s"}),
    "projected volume": _volume("projected", {"sources": [{"configMap": {"name": "cm"}}]}),
    "downwardAPI volume": _volume(
        "downwardAPI", {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}
    ),
    "claim volume": _volume("persistentVolumeClaim", {"claimName": "c"}),
    "csi volume": _volume("csi", {"driver": "example.csi"}),
    "ephemeral volume": _volume(
        "ephemeral",
        {
            "volumeClaimTemplate": {
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                }
            }
        },
    ),
}


@pytest.fixture(scope="module")
def psa_namespace(control_plane: ControlPlane) -> Iterator[str]:
    cp = control_plane
    cp.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": PSA_NS,
                    "labels": {pod_security.NAMESPACE_ENFORCE_LABEL: "restricted"},
                },
            }
        ]
    )
    yield PSA_NS
    cp.kubectl("delete", "namespace", PSA_NS, "--wait=false", "--ignore-not-found")


@pytest.mark.parametrize("case", list(PSA_CASES))
def test_uerls_restricted_check_agrees_with_the_api_servers_admission(
    control_plane: ControlPlane, psa_namespace: str, case: str
) -> None:
    pod = _with(PSA_CASES[case])
    pod["metadata"]["namespace"] = psa_namespace
    result = control_plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    admitted = result.returncode == 0
    if not admitted:  # refused by PodSecurity, not for another reason
        assert 'violates PodSecurity "restricted' in result.stderr, result.stderr
    ours = pod_security.violations(pod["spec"])
    assert admitted == (ours == []), f"server: {result.stderr.strip() or 'admitted'}; uerl: {ours}"
