"""Real pods on a real node (node.py): the kubelet, containerd and runc run them; the CNI
bridge, kube-proxy, CoreDNS and kube-router connect and fence them. One node per module.
Needs root and the Debian packages of tests/k8s/build/install-node-packages.sh."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import NODE_API_ADDRESS, ControlPlane, pinned_versions
from host_speed import guard
from node import (
    BRIDGE,
    KUBELET_SYSCTLS,
    NODE_POD_CIDR,
    OUR_RULE_COMMENT,
    Node,
    read_sysctls,
)
from node_images import busybox_image, kubectl_image

# pyproject's limit, scaled here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.pods, pytest.mark.timeout(guard(600))]

WEB_NS = "node-web"
WEB_PORT = 8080


@pytest.fixture(scope="module")
def image(node: Node) -> str:
    """The busybox test image, imported into the node."""
    img = busybox_image()
    node.import_image(img.archive)
    return img.ref


@pytest.fixture
def namespace(request: pytest.FixtureRequest, node_control_plane: ControlPlane) -> Iterator[str]:
    """A namespace named for the test, deleted (with its pods) afterwards."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower().removeprefix("test_"))
    name = name[:50].strip("-")
    yield _create_namespace(node_control_plane, name)
    # Not waited for: the next test does not need it gone (the node waits at its end).
    node_control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def web(node_control_plane: ControlPlane, image: str) -> Iterator[str]:
    """Namespace WEB_NS: a one-replica StatefulSet `web` of httpd (each page says its
    pod's name) behind a ClusterIP Service `web` (80) and a headless Service
    `web-headless`, and a `client` pod to connect from."""
    cp = node_control_plane
    ns = _create_namespace(cp, WEB_NS)
    labels = {"app": "web"}
    cp.apply(
        [
            _service("web", ns, labels, port=80),
            {**_service("web-headless", ns, labels, port=WEB_PORT), "spec": {
                "clusterIP": "None", "selector": labels,
                "ports": [{"name": "http", "port": WEB_PORT}]}},
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "web", "namespace": ns},
                "spec": {
                    "replicas": 1,
                    "serviceName": "web-headless",
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": _web_pod("unused", ns, image, labels)["spec"],
                    },
                },
            },
            _pod("client", ns, image, ["sleep", "3600"]),
        ]
    )  # fmt: skip
    _wait_ready(cp, ns, "pod/web-0", "pod/client")
    yield ns
    cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_node_is_ready_at_the_pinned_version(node_control_plane: ControlPlane, node: Node) -> None:
    obj = node_control_plane.get_json("node", node.name)
    ready = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True", ready
    info = obj["status"]["nodeInfo"]
    assert info["kubeletVersion"] == pinned_versions()["kubernetes"]
    containerd = pinned_versions()["containerd"].removeprefix("v")
    assert info["containerRuntimeVersion"] == f"containerd://{containerd}"
    assert obj["spec"]["podCIDR"] == NODE_POD_CIDR
    addresses = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
    assert addresses["InternalIP"] == NODE_API_ADDRESS


def test_kernel_settings_the_kubelet_rewrites_are_put_back(node: Node) -> None:
    """kernel.panic, kernel.panic_on_oops, vm.overcommit_memory: the kubelet sets them
    when it starts; the machine has its own values again while the node runs."""
    assert node.before is not None
    now = read_sysctls()
    assert {k: now[k] for k in KUBELET_SYSCTLS} == {
        k: node.before.sysctls[k] for k in KUBELET_SYSCTLS
    }


def test_pod_runs_and_its_log_is_read(
    node_control_plane: ControlPlane, image: str, namespace: str
) -> None:
    cp = node_control_plane
    start = time.monotonic()
    cp.apply(
        [_pod("hello", namespace, image, ["sh", "-c", "echo hello from $(hostname); sleep 3600"])]
    )
    _wait_ready(cp, namespace, "pod/hello")
    print(f"pod apply to Ready: {time.monotonic() - start:.2f}s")
    pod = cp.get_json("-n", namespace, "pod/hello")
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["podIP"].startswith(NODE_POD_CIDR.rsplit(".", 1)[0] + ".")
    _until(lambda: cp.kubectl("logs", "-n", namespace, "hello").stdout == "hello from hello\n",
           "the pod's log")  # fmt: skip


def test_exec_runs_a_command_in_the_pod(
    node_control_plane: ControlPlane, image: str, namespace: str
) -> None:
    cp = node_control_plane
    cp.apply([_pod("shell", namespace, image, ["sleep", "3600"])])
    _wait_ready(cp, namespace, "pod/shell")
    out = cp.kubectl("exec", "-n", namespace, "shell", "--", "sh", "-c", "hostname; id -u")
    assert out.stdout.split() == ["shell", "0"]
    failed = cp.kubectl("exec", "-n", namespace, "shell", "--", "sh", "-c", "exit 3", check=False)
    assert failed.returncode == 3


def test_native_sidecar_starts_before_the_main_container(
    node_control_plane: ControlPlane, image: str, namespace: str
) -> None:
    """An init container with restartPolicy Always (as the sidecar games are) is up,
    its startup probe passed, before the main container starts; and it keeps running."""
    cp = node_control_plane
    pod = _pod("sidecar", namespace, image,
               ["sh", "-c", "cat /shared/sidecar-up && exec sleep 3600"])  # fmt: skip
    shared = {"name": "shared", "mountPath": "/shared"}
    pod["spec"]["volumes"] = [{"name": "shared", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [shared]
    pod["spec"]["initContainers"] = [
        {
            "name": "game",
            "image": image,
            "imagePullPolicy": "Never",
            "restartPolicy": "Always",
            # Up only after a while: the main container must wait for the probe.
            "command": ["sh", "-c", "sleep 2; echo up > /shared/sidecar-up; exec sleep 3600"],
            "startupProbe": {
                "exec": {"command": ["test", "-f", "/shared/sidecar-up"]},
                "periodSeconds": 1,
                "failureThreshold": 30,
            },
            "volumeMounts": [shared],
        }
    ]
    cp.apply([pod])
    _wait_ready(cp, namespace, "pod/sidecar")
    status = cp.get_json("-n", namespace, "pod/sidecar")["status"]
    (game,) = status["initContainerStatuses"]
    (main,) = status["containerStatuses"]
    assert game["started"] and "running" in game["state"], game
    assert "running" in main["state"] and main["restartCount"] == 0, main
    assert _started(game) <= _started(main)
    assert cp.kubectl("logs", "-n", namespace, "sidecar", "-c", "main").stdout == "up\n"


def test_pod_reaches_a_cluster_ip_service(node_control_plane: ControlPlane, web: str) -> None:
    cluster_ip = node_control_plane.get_json("-n", web, "service/web")["spec"]["clusterIP"]
    assert _fetch(node_control_plane, web, f"http://{cluster_ip}/") == "web-0"


def test_pod_reaches_a_cluster_ip_service_by_name(
    node_control_plane: ControlPlane, web: str
) -> None:
    for name in ("web", f"web.{web}", f"web.{web}.svc.cluster.local"):
        assert _fetch(node_control_plane, web, f"http://{name}/") == "web-0", name


def test_pod_reaches_a_headless_services_pod_by_name(
    node_control_plane: ControlPlane, web: str
) -> None:
    """`hostname.subdomain.ns.svc.cluster.local`, as the networked games are reached."""
    url = f"http://web-0.web-headless.{web}.svc.cluster.local:{WEB_PORT}/"
    assert _fetch(node_control_plane, web, url) == "web-0"


def test_pod_reaches_the_api_server_through_its_service(
    node_control_plane: ControlPlane, node: Node, web: str
) -> None:
    """kubernetes.default.svc (the API server on the node's address, through kube-proxy)
    with the pod's service account token, its certificate verified with the pod's CA."""
    cp = node_control_plane
    img = kubectl_image()
    node.import_image(img.archive)
    cp.apply([_pod("kubectl", web, img.ref, ["sleep", "3600"])])
    _wait_ready(cp, web, "pod/kubectl")
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    out = _exec(cp, web, "kubectl",
                "kubectl get --raw /api --server https://kubernetes.default.svc.cluster.local "
                f"--token $(cat {sa}/token) --certificate-authority {sa}/ca.crt")  # fmt: skip
    assert json.loads(out)["kind"] == "APIVersions"


def test_nothing_forwarded_leaves_the_machine(node: Node) -> None:
    """The rules that keep pod traffic on this machine come first in mangle FORWARD
    (before any filter-table ACCEPT): whatever the bridge would forward to another
    interface, or receive from one, is dropped. (Checked as rules: a test never sends
    a packet off the machine.)"""
    argv = ["iptables", "-w", "-t", "mangle", "-S", "FORWARD"]
    rules = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    assert set(rules[1:3]) == {
        f'-A FORWARD -i {BRIDGE} ! -o {BRIDGE} -m comment --comment "{OUR_RULE_COMMENT}" -j DROP',
        f'-A FORWARD ! -i {BRIDGE} -o {BRIDGE} -m comment --comment "{OUR_RULE_COMMENT}" -j DROP',
    }, rules
    masquerade = subprocess.run(["iptables", "-w", "-t", "nat", "-S"],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert f"-s {NODE_POD_CIDR}" not in masquerade  # no CNI masquerade of the pods


def test_network_policy_admits_only_the_allowed_pods(
    node_control_plane: ControlPlane, image: str, namespace: str
) -> None:
    """kube-router enforces an ingress NetworkPolicy: a pod outside the allowed set
    times out, an allowed one still connects."""
    cp = node_control_plane
    cp.apply(
        [
            _web_pod("server", namespace, image, {"app": "server"}),
            _pod("allowed", namespace, image, ["sleep", "3600"], {"role": "allowed"}),
            _pod("denied", namespace, image, ["sleep", "3600"], {"role": "other"}),
        ]
    )
    _wait_ready(cp, namespace, "pod/server", "pod/allowed", "pod/denied")
    ip = cp.get_json("-n", namespace, "pod/server")["status"]["podIP"]
    url = f"http://{ip}:{WEB_PORT}/"
    assert _fetch(cp, namespace, url, pod="denied") == "server"  # open before the policy
    cp.apply(
        [
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "server-ingress", "namespace": namespace},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "server"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "allowed"}}}]}],
                },
            }
        ]
    )
    # kube-router's sync of the policy: seconds, more when loaded.
    _until(lambda: _fetch(cp, namespace, url, pod="denied", within_s=3) is None,
           "the NetworkPolicy to deny `denied`", timeout_s=guard(180))  # fmt: skip
    assert _fetch(cp, namespace, url, pod="allowed") == "server"
    assert _fetch(cp, namespace, url, pod="denied", within_s=3) is None


# ---- helpers ---------------------------------------------------------------------------


def _create_namespace(cp: ControlPlane, name: str) -> str:
    cp.kubectl("create", "namespace", name)
    # Pods are refused until the service account controller made `default`.
    _until(lambda: cp.kubectl("get", "-n", name, "serviceaccount/default", check=False)
           .returncode == 0, f"serviceaccount {name}/default")  # fmt: skip
    return name


def _pod(
    name: str,
    ns: str,
    image: str,
    command: list[str],
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}
            ],
            "terminationGracePeriodSeconds": 1,
            "enableServiceLinks": False,
        },
    }


def _web_pod(name: str, ns: str, image: str, labels: dict[str, str]) -> dict[str, Any]:
    """httpd on WEB_PORT serving one page: the pod's name."""
    serve = f"mkdir -p /www && hostname > /www/index.html && exec httpd -f -p {WEB_PORT} -h /www"
    pod = _pod(name, ns, image, ["sh", "-c", serve], labels)
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": WEB_PORT},
        "periodSeconds": 1,
    }
    return pod


def _service(name: str, ns: str, selector: dict[str, str], port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": selector, "ports": [{"name": "http", "port": port,
                                                  "targetPort": WEB_PORT}]},
    }  # fmt: skip


def _wait_ready(cp: ControlPlane, ns: str, *objects: str) -> None:
    # A controller's pod (the StatefulSet's web-0) exists only once the controller made it,
    # and `--for=condition` fails at once on a missing object: under load it was missing.
    # A hang guard: a pod was Ready 1.3 s after its apply, a 10-replica rollout 7.7 s, loaded.
    within = f"--timeout={guard(180):.0f}s"
    cp.kubectl("wait", "-n", ns, "--for=create", within, *objects)
    cp.kubectl("wait", "-n", ns, "--for=condition=Ready", within, *objects)


def _exec(cp: ControlPlane, ns: str, pod: str, script: str) -> str:
    return cp.kubectl("exec", "-n", ns, pod, "--", "sh", "-c", script).stdout


def _fetch(
    cp: ControlPlane, ns: str, url: str, pod: str = "client", within_s: float | None = None
) -> str | None:
    """The page at `url` fetched from inside `pod`. A fetch that must succeed (no
    `within_s`) has a hang guard's time and fails the test otherwise; one expected to be
    refused returns None when nothing came `within_s` (a slow host only makes a refusal
    surer). `timeout`, not wget's -T: Debian's static busybox 1.35 wget segfaults with -T."""
    seconds = round(within_s if within_s is not None else guard(30))
    out = cp.kubectl("exec", "-n", ns, pod, "--", "timeout", str(seconds), "wget", "-q", "-O-",
                     url, check=within_s is None)  # fmt: skip
    return out.stdout.strip() if out.returncode == 0 else None


def _started(status: dict[str, Any]) -> str:
    return str(status["state"]["running"]["startedAt"])


def _until(check: Any, what: str, timeout_s: float = guard(120)) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.5)
