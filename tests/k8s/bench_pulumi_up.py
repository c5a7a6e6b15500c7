"""Benchmark: `pulumi up` wall time on the tier, sidecar and networked, at Y workers.

For each pattern and Y: `pulumi up` of a new stack (returns once the RayCluster is
ready, so all Y+2 Ray pods and, networked, the Y+1 games are Running and Ready), a
rescale Y -> Y+1, a no-change `pulumi preview`, then `pulumi destroy`. The stacks
run the mock game with small pods on one big KWOK node; KubeRay's CRDs and operator
are there already (`operator.install: false`), so the figures are uerl's own objects.

Then where a no-change preview of the dev stack (with the operator chart) spends its
time: the CLI alone, the program alone (python, no engine), and previews with and
without the chart, and with Pulumi's automatic log (off in the harness otherwise).

    cd tests/k8s
    ../../.venv/bin/python bench_pulumi_up.py [--sizes 10 100 500] [--skip-breakdown]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controlplane import KUBERAY_CHART_DIR, REPO, ControlPlane, FakeNode
from pulumi_project import PulumiProject

BIG_NODE = FakeNode("kwok-node-0", cpu="10000", memory="40000Gi", pods="3000")
SMALL_PODS = {
    "topology.simulator.kind": "mock",
    "topology.simulator.cpus": "0.1",
    "topology.simulator.memory": "64Mi",
    "topology.workers.cpus": "0.1",
    "topology.workers.memory": "64Mi",
    "topology.learners.cpus": "0.1",
    "topology.learners.memory": "64Mi",
    "topology.ray.head.memory": "64Mi",
    "topology.image_pull_timeout_s": "0",
    "topology.ray.start_timeout_s": "1800",
}


Row = tuple[str, int, float, float, float]  # pattern, Y, up, rescale, preview (s)


def scale_rows(project: PulumiProject, sizes: list[int]) -> list[Row]:
    rows = []
    for pattern in ("sidecar", "networked"):
        for y in sizes:
            stack = f"{pattern}-{y}"
            settings = SMALL_PODS | {
                "topology.name": f"b{y}{pattern[0]}",
                "topology.namespace": f"bench-{stack}",
                "topology.operator.install": "false",
                "topology.pattern": pattern,
                "topology.workers.replicas": str(y),
            }
            project.new_stack(stack, settings)
            create = project.up(stack, timeout_s=3600).seconds
            project.config_set(stack, "topology.workers.replicas", str(y + 1))
            rescale = project.up(stack, timeout_s=3600).seconds
            preview = project.run("preview", "--expect-no-changes", stack=stack).seconds
            print(
                f"{pattern:<9} Y={y:<4} up {create:7.1f}s  rescale {rescale:6.1f}s  "
                f"no-change preview {preview:5.1f}s",
                flush=True,
            )
            rows.append((pattern, y, create, rescale, preview))
            project.run("destroy", "--yes", stack=stack, timeout_s=3600)
            project.run("stack", "rm", "--yes", stack=stack)
    return rows


def preview_breakdown(project: PulumiProject, cp: ControlPlane) -> list[tuple[str, float]]:
    """Where a no-change preview of the dev stack goes."""
    out = []
    start = time.monotonic()
    project.run("version")
    out.append(("pulumi version (CLI start)", time.monotonic() - start))

    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import pulumi, pulumi_kubernetes, infra.manifests"],
        cwd=REPO, check=True,
    )  # fmt: skip
    out.append(("python: import pulumi, pulumi_kubernetes, infra", time.monotonic() - start))

    project.new_stack("dev", {"topology.operator.chart_path": str(KUBERAY_CHART_DIR)})

    def operator_once_crds() -> None:
        cp.start_kuberay_operator_once_crds()

    project.up("dev", during=operator_once_crds)
    for _ in range(2):  # the second is warm (page cache, Python bytecode)
        with_chart = project.run("preview", "--expect-no-changes", stack="dev").seconds
    out.append(("no-change preview, dev stack (operator chart)", with_chart))
    # The same with Pulumi's automatic log on, as a user's PULUMI_HOME has it.
    logs = Path(project.env["PULUMI_HOME"]) / "logs"
    logs.unlink()
    logged = project.run("preview", "--expect-no-changes", stack="dev").seconds
    out.append(("the same, with Pulumi's automatic log ($PULUMI_HOME/logs)", logged))
    shutil.rmtree(logs)
    logs.write_text("off\n")
    project.run("destroy", "--yes", stack="dev")
    project.new_stack("nochart", {"topology.operator.install": "false", "topology.name": "nc"})
    # Needs the CRDs the dev stack's destroy removed: a preview does not create them.
    cp.kubectl("apply", "--server-side", "-f", str(KUBERAY_CHART_DIR / "crds"))
    project.up("nochart")
    for _ in range(2):
        without = project.run("preview", "--expect-no-changes", stack="nochart").seconds
    out.append(("no-change preview, same stack without the chart", without))
    project.run("destroy", "--yes", stack="nochart")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=[10, 100, 500], help="none: the breakdown only"
    )
    parser.add_argument("--skip-breakdown", action="store_true")
    args = parser.parse_args()
    rows: list[Row] = []
    breakdown: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="uerl-bench-pulumi-") as tmp:
        if not args.skip_breakdown:
            with ControlPlane(kuberay_crds=False) as cp:
                project = PulumiProject(Path(tmp) / "breakdown", cp.kubeconfig)
                breakdown = preview_breakdown(project, cp)
        if args.sizes:
            with ControlPlane(nodes=(BIG_NODE,)) as cp:
                project = PulumiProject(Path(tmp) / "scale", cp.kubeconfig)
                rows = scale_rows(project, args.sizes)

    print("\n| pattern | Y | `pulumi up` (new stack) | rescale Y -> Y+1 | no-change preview |")
    print("|---|---|---|---|---|")
    for pattern, y, create, rescale, preview in rows:
        print(f"| {pattern} | {y} | {create:.1f} s | {rescale:.1f} s | {preview:.1f} s |")
    if breakdown:
        print("\n| step | seconds |\n|---|---|")
        for what, seconds in breakdown:
            print(f"| {what} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
