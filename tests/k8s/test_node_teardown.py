"""A real node leaves nothing behind (node.py): after its context exits, whether its
body returned or raised, no shim or container process, no mount under its directory,
no bridge or veth, no kube-proxy/kube-router/CNI iptables chain or ipset, no cgroup,
and every sysctl as before. One control plane of the test's own, and on it two nodes one
after the other, each with pods, a Service and a NetworkPolicy in place so that every
piece has something to undo: the first one's body returns, the second one's raises. The
machine's state is compared once around the plane and both nodes (the plane's `lo`
address included); each node's own comparison around itself is its `leftovers`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from controlplane import NODE_API_ADDRESS, ControlPlane
from host_speed import guard
from node import (
    BRIDGE,
    CGROUP_FS,
    CGROUP_ROOT,
    CHAIN_PREFIXES,
    HostState,
    Node,
    mounts_under,
    shim_pids,
)
from node_images import busybox_image

# pyproject's limit, scaled here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.pods, pytest.mark.timeout(guard(600))]


class BodyFailed(RuntimeError):
    pass


def test_nothing_is_left_after_a_node_exits_normally_or_when_its_body_raises() -> None:
    before = HostState.capture()
    with ControlPlane(api_address=NODE_API_ADDRESS, nodes=(), kuberay_operator=False) as cp:
        # Node A: its body returns.
        with Node(cp) as node:
            in_use = _exercise(cp, node, "teardown-a")
        _assert_nothing_left(node, in_use)
        # Node B, on the same plane: its body raises.
        node = Node(cp)
        with pytest.raises(BodyFailed), node:
            in_use = _exercise(cp, node, "teardown-b")
            raise BodyFailed
        _assert_nothing_left(node, in_use)
        shutil.rmtree(node.workdir)  # kept, as after any failure in a node's body
    assert before.differences(HostState.capture()) == []


def _exercise(cp: ControlPlane, node: Node, ns: str) -> dict[str, object]:
    """Pods behind a Service and a NetworkPolicy in namespace `ns` (one of the node's
    own: the objects of a node before it stay in the API), one connection through it;
    returns what is in use on the machine while they run."""
    image = busybox_image()
    node.import_image(image.archive)
    cp.kubectl("create", "namespace", ns)
    cp.wait_until(lambda: cp.kubectl("get", "-n", ns, "sa/default", check=False).returncode == 0,
                  guard(120), "serviceaccount default")  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": ns, "labels": {"app": "web"}},
        "spec": {
            "containers": [{
                "name": "main", "image": image.ref, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo ok > /index.html; exec httpd -f -p 8080 -h /"],
            }],
            "terminationGracePeriodSeconds": 1,
        },
    }  # fmt: skip
    client = {**pod, "metadata": {"name": "client", "namespace": ns, "labels": {"role": "c"}}}
    client["spec"] = {**pod["spec"], "containers": [
        {**pod["spec"]["containers"][0], "command": ["sleep", "3600"]}]}  # fmt: skip
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "c"}}}]}],
        },
    }
    cp.apply([pod, client, service, policy])
    # Hang guards: pods Ready in seconds; the Service's and the policy's rules (kube-proxy,
    # kube-router) in seconds more; a fetch that got nothing in 10 s is tried again.
    cp.kubectl("wait", "-n", ns, "--for=condition=Ready", f"--timeout={guard(180):.0f}s",
               "pod/web", "pod/client")  # fmt: skip
    cp.wait_until(
        lambda: cp.kubectl("exec", "-n", ns, "client", "--", "timeout", "10", "wget", "-qO-",
                           "http://web/", check=False).stdout == "ok\n",
        guard(180), "client -> web through the Service",
    )  # fmt: skip
    state = HostState.capture()
    in_use = {
        "shims": shim_pids(node.bin["containerd-shim-runc-v2"], str(node.containerd_socket)),
        "mounts": mounts_under(node.workdir),
        "bridge": BRIDGE in state.links,
        "veths": _veths_on_bridge(),
        "chains": _our_chains(state),
        "ipsets": state.ipsets,
        "workdir": node.workdir,
    }
    # Something to undo of each kind, or the checks below would prove nothing.
    assert all(in_use.values()), in_use
    return in_use


def _assert_nothing_left(node: Node, in_use: dict[str, object]) -> None:
    assert node.leftovers == []
    assert shim_pids(node.bin["containerd-shim-runc-v2"], str(node.containerd_socket)) == []
    workdir = in_use["workdir"]
    assert isinstance(workdir, Path)
    assert mounts_under(workdir) == []
    assert not Path("/sys/class/net", BRIDGE).exists()
    veths = in_use["veths"]
    assert isinstance(veths, list)
    assert not [v for v in veths if Path("/sys/class/net", v).exists()]
    state = HostState.capture()
    assert _our_chains(state) == set()
    assert not list(CGROUP_FS.glob(f"*/{CGROUP_ROOT}"))


def _our_chains(state: HostState) -> set[str]:
    return {c for c in state.chains if c.split()[2].startswith(CHAIN_PREFIXES)}


def _veths_on_bridge() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show", "master", BRIDGE],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]
