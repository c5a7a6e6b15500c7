"""Not a test: training on real pods against `uerl local` on the same machine, in one run.

Starts a control plane and a real node, imports the images, `pulumi up`s the dev stack
(sidecar, 2 workers, 1 learner, sized as test_pods_e2e.py sizes it), submits
`uerl train` as a Ray job through a port-forward and reads its progress lines; then
takes everything down and runs `uerl local` with the same training arguments. Prints:
the wall time from the start of `pulumi up` to the first training iteration, each
side's median env-steps/s (iterations 3 on: the whole iteration's rate, as the progress
line shows it) and their ratio, and the memory of the node's pieces, the control plane's
and each pod's (cgroup usage) while the job trains.

    cd tests/k8s && ../../.venv/bin/python bench_pods.py [--iterations 12] [--cfs-quota]
                                                         [--no-cpu-limits] [--skip-local]

Needs root, build.sh's binaries, install-node-packages.sh and `make images-local`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from controlplane import NODE_API_ADDRESS, REPO, ControlPlane
from node import CGROUP_FS, CGROUP_ROOT, Node, _rss_mib
from node_images import busybox_image
from pods_stack import (
    NAMESPACE,
    TRAIN_ARGS,
    UERL,
    PortForward,
    RayJobs,
    images_build,
    progress,
)
from pods_stack import stack_settings as settings_for
from pulumi_project import PulumiProject


def pod_memory_mib(cp: ControlPlane) -> dict[str, float]:
    """Each pod's memory cgroup usage (the kubelet's cgroupfs layout under CGROUP_ROOT)."""
    names = {
        p["metadata"]["uid"]: p["metadata"]["name"] for p in cp.get_json("pods", "-A")["items"]
    }
    out = {}
    root = CGROUP_FS / "memory" / CGROUP_ROOT / "kubepods"
    for usage in root.glob("**/pod*/memory.usage_in_bytes"):
        uid = usage.parent.name.removeprefix("pod").replace("_", "-")
        out[names.get(uid, uid)] = int(usage.read_text()) / 2**20
    return out


def median_rate(log: str) -> float:
    rates = [p.steps_per_s for p in progress(log)[2:]]
    return statistics.median(rates) if rates else float("nan")


def on_pods(iterations: int, *, cfs_quota: bool, cpu_limits: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    with (
        ControlPlane(api_address=NODE_API_ADDRESS, nodes=(), kuberay_operator=False) as cp,
        Node(cp, cpu_cfs_quota=cfs_quota) as node,
    ):
        busybox = busybox_image()
        node.import_image(busybox.archive)
        ray_ref, mock_ref = images_build.topology_refs()
        start = time.monotonic()
        node.import_images_from_index(
            [images_build.qualified(ref)
             for ref in (ray_ref, mock_ref, images_build.operator_image_ref())]
        )  # fmt: skip
        out["image import s"] = time.monotonic() - start
        work = Path(tempfile.mkdtemp(prefix="uerl-bench-pods-"))
        project = PulumiProject(work, cp.kubeconfig)
        settings = settings_for(busybox.ref)
        if not cpu_limits:  # requests only: a container may use the node's idle CPU
            for group in ("ray.head", "learners", "workers", "simulator"):
                settings[f"topology.{group}.cpu_limits"] = "false"
        project.new_stack("dev", settings)
        started = time.monotonic()
        up = project.up("dev", "--skip-preview", timeout_s=900)
        out["pulumi up s"] = up.seconds
        with PortForward(cp, work, 8265) as forward:
            jobs = RayJobs(forward)
            job = "bench"
            jobs.submit(job, ["uerl", "train", "--run-dir", "/home/ray/runs/bench",
                              "--iterations", str(iterations), *TRAIN_ARGS])  # fmt: skip
            jobs.wait_for(job, lambda log: bool(progress(log)), "the first iteration", 900)
            out["pulumi up -> first iteration s"] = time.monotonic() - started
            jobs.wait_for(
                job, lambda log: len(progress(log)) >= iterations // 2, "half the run", 900
            )
            rss = node.rss_mib()
            rss.update({p.name: _rss_mib(p.popen.pid) for p in cp.processes})
            out["rss MiB"] = rss
            out["pod memory MiB"] = pod_memory_mib(cp)
            log = jobs.wait_for(
                job, lambda log: len(progress(log)) >= iterations, "the last iteration", 1800
            )
            out["pods env-steps/s"] = median_rate(log)
        project.run("destroy", "--yes", "--skip-preview", stack="dev", timeout_s=900)
        cp.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", timeout_s=300)
    return out


def on_local(iterations: int) -> float:
    done = subprocess.run(
        [str(UERL), "local", "--iterations", str(iterations), *TRAIN_ARGS,
         "--run-dir", tempfile.mkdtemp(prefix="uerl-bench-local-")],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"uerl local failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return median_rate(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument(
        "--cfs-quota",
        action="store_true",
        help="the node enforces CPU limits with CFS quotas (a production kubelet's default)",
    )
    parser.add_argument(
        "--no-cpu-limits",
        action="store_true",
        help="the stack asks for CPU requests only (`cpu_limits: false` on every group)",
    )
    parser.add_argument("--skip-local", action="store_true", help="no `uerl local` run")
    args = parser.parse_args()
    pods = on_pods(args.iterations, cfs_quota=args.cfs_quota, cpu_limits=not args.no_cpu_limits)
    rate = float(pods["pods env-steps/s"])  # type: ignore[arg-type]
    print(f"node CFS quotas                  {'on' if args.cfs_quota else 'off'}")
    print(f"CPU limits                       {'requests only' if args.no_cpu_limits else 'on'}")
    print(f"image import                     {pods['image import s']:7.1f} s")
    print(f"pulumi up (dev stack)            {pods['pulumi up s']:7.1f} s")
    print(f"pulumi up -> first iteration     {pods['pulumi up -> first iteration s']:7.1f} s")
    print(f"env-steps/s, real pods (median)  {rate:7.0f}")
    if not args.skip_local:
        local = on_local(args.iterations)
        print(f"env-steps/s, uerl local (median) {local:7.0f}")
        print(f"real pods / uerl local           {rate / local:7.2f}x")
    rss = dict(pods["rss MiB"])  # type: ignore[call-overload]
    shims = int(rss.pop("shim count"))
    print(f"resident memory while training (MiB; {shims} pod shims):")
    for name, mib in sorted(rss.items(), key=lambda kv: -kv[1]):
        print(f"  {name:34s} {mib:7.1f}")
    print("pod memory (cgroup usage, MiB):")
    for name, mib in sorted(pods["pod memory MiB"].items(), key=lambda kv: -kv[1]):  # type: ignore[union-attr]
        print(f"  {name:34s} {mib:7.1f}")


if __name__ == "__main__":
    main()
