"""Not a test: figures of the real node (node.py) on this machine. Starts a control
plane and a node, then prints how long each took to come up, how long single pods and
a 10-replica Deployment take from apply to Ready, and the pieces' resident memory.

    cd tests/k8s && sudo ../../.venv/bin/python bench_node.py [--pods 5] [--replicas 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from controlplane import NODE_API_ADDRESS, ControlPlane
from node import Node, _rss_mib
from node_images import busybox_image


def _pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"]}],
            "terminationGracePeriodSeconds": 1,
        },
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=5, help="single pods, one after another")
    parser.add_argument("--replicas", type=int, default=10, help="the Deployment's replicas")
    args = parser.parse_args()

    t0 = time.monotonic()
    with ControlPlane(api_address=NODE_API_ADDRESS, nodes=(), kuberay_operator=False) as cp:
        cp_up = time.monotonic() - t0
        with Node(cp) as node:
            both_up = time.monotonic() - t0
            image = busybox_image()
            t = time.monotonic()
            node.import_image(image.archive)
            imported = time.monotonic() - t
            cp.kubectl("create", "namespace", "bench")
            cp.wait_until(
                lambda: cp.kubectl("get", "-n", "bench", "sa/default", check=False).returncode == 0,
                30,
                "serviceaccount default",
            )
            single = []
            for i in range(args.pods):
                t = time.monotonic()
                cp.apply([_pod(f"p{i}", image.ref)])
                cp.kubectl("wait", "-n", "bench", "--for=condition=Ready", f"pod/p{i}",
                           "--timeout=120s")  # fmt: skip
                single.append(time.monotonic() - t)
            pod = _pod("x", image.ref)
            deployment = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "many", "namespace": "bench"},
                "spec": {
                    "replicas": args.replicas,
                    "selector": {"matchLabels": {"app": "many"}},
                    "template": {"metadata": {"labels": {"app": "many"}}, "spec": pod["spec"]},
                },
            }
            t = time.monotonic()
            cp.apply([deployment])
            cp.kubectl("rollout", "status", "-n", "bench", "deployment/many", "--timeout=300s")
            many = time.monotonic() - t
            rss = node.rss_mib()
            rss.update({p.name: _rss_mib(p.popen.pid) for p in cp.processes})
            t = time.monotonic()
        node_down = time.monotonic() - t

    print(f"control plane up        {cp_up:6.1f} s")
    steps = ", ".join(f"{what} {t:.1f}s" for what, t in node.timings.items())
    print(f"+ node up               {both_up - cp_up:6.1f} s  ({steps})")
    print(f"control plane + node    {both_up:6.1f} s")
    print(f"busybox image import    {imported:6.2f} s")
    print(f"pod apply -> Ready      median {statistics.median(single):.2f} s, "
          f"min {min(single):.2f}, max {max(single):.2f} ({len(single)} pods)")  # fmt: skip
    print(f"{args.replicas}-replica Deployment  {many:6.1f} s apply -> rolled out")
    print(f"node teardown           {node_down:6.1f} s  (leftovers: {node.leftovers or 'none'})")
    print("resident memory (MiB), with", int(rss.pop("shim count")), "pod shims running:")
    for name, mib in sorted(rss.items(), key=lambda kv: -kv[1]):
        print(f"  {name:26s} {mib:7.1f}")


if __name__ == "__main__":
    main()
