"""Benchmark: the networked pattern at Y = 10 and 100 games, before and after the StatefulSet.

Before: one Deployment + one Service per game (uerl at a git revision, default dcd10da,
rendered from a temporary worktree). After: this checkout (one StatefulSet + one headless
Service). Each stack is applied server-side to a real control plane (tests/k8s), timed
until every game pod and every Ray pod is Running and Ready, then deleted. Prints object
counts and wall times. `pulumi up` itself cannot run here (see tests/k8s/README.md), so
this times what it would send and what the cluster then does.

    .venv/bin/python tests/k8s/bench_networked_scale.py [--before REV] [--sizes 10 100]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from controlplane import REPO, ControlPlane, FakeNode
from stacks import running_and_ready

BIG_NODE = FakeNode("kwok-node-0", cpu="4000", memory="16000Gi", pods="2000")


def render(source: Path, games: int, namespace: str) -> list[dict[str, Any]]:
    argv = [
        sys.executable, "-m", "training.cli", "render", "--stack", "dev",
        "--set", "topology.pattern=networked",
        "--set", f"topology.workers.replicas={games}",
        "--set", f"topology.namespace={namespace}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(source)}
    out = subprocess.run(argv, cwd=source, env=env, capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def all_pods_up(cp: ControlPlane, namespace: str, expected: int) -> bool:
    pods = cp.get_json("pods", "-n", namespace)["items"]
    return len(pods) == expected and all(running_and_ready(p) for p in pods)


def expected_pods(objects: list[dict[str, Any]]) -> int:
    count = 0
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            count += obj["spec"].get("replicas", 1)
        elif obj["kind"] == "RayCluster":
            count += 1 + sum(g["replicas"] for g in obj["spec"]["workerGroupSpecs"])
    return count


def measure(cp: ControlPlane, label: str, objects: list[dict[str, Any]]) -> tuple[float, float]:
    namespace = next(o for o in objects if o["kind"] == "Namespace")["metadata"]["name"]
    started = time.monotonic()
    cp.apply(objects)
    applied = time.monotonic() - started
    pods = expected_pods(objects)
    cp.wait_until(lambda: all_pods_up(cp, namespace, pods), 900, f"{label}: {pods} pods up", 1.0)
    ready = time.monotonic() - started
    cp.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=600s")
    return applied, ready


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="dcd10da", help="git revision of the 'before'")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="uerl-before-") as tmp:
        before = Path(tmp) / "src"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(before), args.before],
            cwd=REPO, check=True, capture_output=True,
        )  # fmt: skip
        try:
            rows = []
            with ControlPlane(nodes=(BIG_NODE,)) as cp:
                for games in args.sizes:
                    for label, source in (("before", before), ("after", REPO)):
                        objects = render(source, games, f"uerl-bench-{label}-{games}")
                        kinds = len(objects)
                        applied, ready = measure(cp, f"{label} Y={games}", objects)
                        rows.append((games, label, kinds, expected_pods(objects), applied, ready))
                        print(f"Y={games} {label}: {kinds} objects, apply {applied:.1f} s, "
                              f"all pods up {ready:.1f} s", flush=True)  # fmt: skip
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(before)], cwd=REPO, check=False
            )
    print(f"\n{'Y':>4} {'variant':<8} {'objects':>8} {'pods':>5} {'apply':>8} {'all up':>8}")
    for games, label, kinds, pods, applied, ready in rows:
        print(f"{games:>4} {label:<8} {kinds:>8} {pods:>5} {applied:>7.1f}s {ready:>7.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
