"""Deploying `uerl render` output onto the real control plane and watching it come up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from controlplane import REPO, ControlPlane
from host_speed import guard

UERL = Path(sys.executable).parent / "uerl"
WORKLOADS = ("Deployment", "StatefulSet")


def render(*args: str) -> tuple[str, list[dict[str, Any]]]:
    """`uerl render ARGS`: its YAML text and its objects."""
    out = subprocess.run(
        [str(UERL), "render", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return out, [doc for doc in yaml.safe_load_all(out) if doc]


def running_and_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )


def deploy_and_wait(cp: ControlPlane, *render_args: str) -> list[dict[str, Any]]:
    """Apply a rendered stack (server-side, as Pulumi does) and wait until the
    operator has made the RayCluster's pods, all Running and Ready under KWOK,
    and every Deployment/StatefulSet has rolled out. Returns the objects."""
    text, objects = render(*render_args)
    cp.kubectl("apply", "--server-side", "--field-manager=uerl-tests", "-f", "-", input=text)
    cluster = next(o for o in objects if o["kind"] == "RayCluster")
    name, namespace = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    groups = {"headgroup": 1} | {
        g["groupName"]: g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]
    }

    def ray_pods() -> list[dict[str, Any]]:
        selector = f"ray.io/cluster={name}"
        return cp.get_json("pods", "-n", namespace, "-l", selector)["items"]

    def all_up() -> bool:
        up: dict[str, int] = {}
        for pod in ray_pods():
            if running_and_ready(pod):
                group = pod["metadata"]["labels"]["ray.io/group"]
                up[group] = up.get(group, 0) + 1
        return up == groups

    # Hang guards, not speed goals: the operator's reconcile and KWOK take seconds idle,
    # several times that on a loaded 2-core host.
    cp.wait_until(
        all_up, guard(300), f"RayCluster {namespace}/{name}: pods {groups} Running and Ready"
    )
    assert {pod["spec"]["nodeName"] for pod in ray_pods()} == {"kwok-node-0"}

    def cluster_ready() -> bool:
        return (
            cp.get_json("raycluster", "-n", namespace, name).get("status", {}).get("state")
            == "ready"
        )

    cp.wait_until(cluster_ready, guard(180), f"RayCluster {namespace}/{name} status.state 'ready'")

    service = cp.get_json("service", "-n", namespace, f"{name}-head-svc")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert (ports["gcs-server"], ports["client"], ports["dashboard"]) == (6379, 10001, 8265)

    for obj in objects:
        if obj["kind"] in WORKLOADS:
            cp.kubectl(
                "rollout", "status", "-n", namespace, f"--timeout={guard(240):.0f}s",
                f"{obj['kind'].lower()}/{obj['metadata']['name']}",
            )  # fmt: skip
    return objects


def chart_runs_operator(cp: ControlPlane, namespace: str, release: str) -> Callable[[], None]:
    """A step for a `pulumi` command's `during`: the operator process lives while the
    chart's Deployment does (the chart's pod is simulated and reconciles nothing): started
    once the Deployment and the CRDs exist, stopped once the Deployment is gone."""

    def step() -> None:
        deployed = cp.kubectl(
            "get", "deployment", "-n", namespace, release, check=False
        ).returncode == 0  # fmt: skip
        if deployed:
            cp.start_kuberay_operator_once_crds()
        else:
            cp.stop_kuberay_operator()

    return step
