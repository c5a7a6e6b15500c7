"""A uerl stack on real pods, reached the way a user reaches it.

The tier's real node (node.py) runs what `pulumi up` creates: the KubeRay operator from
its chart, the Ray head, learners and workers from the project's Ray image, and the games.
This module holds what the real-pod scenarios share:

- `stack_settings`: the dev stack's overrides for this 2-core machine (small CPU
  requests, the chart from third_party/, the operator image's real tag, the images the
  tier built: nothing is pulled). Each is a `pulumi config set --path` a user could type.
- `PortForward`: `kubectl port-forward` to the head's dashboard, restarted when the head
  pod it was tied to is gone.
- `RayJobs`: `ray job submit` through it, the job's status and log, with the token from
  the Secret KubeRay made for the cluster (`ray_token`).
- `GameFiles`: a web server in the cluster serving a fake packaged UE build (a zip whose
  launcher runs the mock game), for the `unreal` simulator and its loader Job.
- `connects`: whether one pod reaches an address (NetworkPolicy checks).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane import KUBERAY_CHART_DIR, ControlPlane, ControlPlaneError, free_ports, tail
from host_speed import guard
from lifecycle import StartStop
from run_events import event_lines  # tests/, on the path via its conftest
from stacks import running_and_ready

sys.path.insert(0, str(Path(__file__).resolve().parent / "images"))
import build as images_build  # tests/k8s/images/build.py
import fake_build  # tests/k8s/images/fake_build.py

RAY = Path(sys.executable).with_name("ray")
UERL = Path(sys.executable).with_name("uerl")
NAMESPACE = "uerl"  # the dev stack's
CLUSTER = "uerl"
# A hang guard for one `ray job` command (Ray's CLI imports Ray first: seconds when loaded).
RAY_CLI_TIMEOUT_S = guard(180)
# What the real-pod scenarios and bench_pods.py train with: small batches, so an
# iteration takes seconds on 2 cores shared with the whole cluster.
TRAIN_ARGS = ["--train-batch-size", "1000", "--minibatch-size", "250", "--checkpoint-every", "5"]


# The 1.7.0 chart's feature gates (values.yaml `featureGates`) that the v1.6.2 operator
# binary knows (ray-operator/pkg/features/features.go): it exits on an unknown one.
OPERATOR_FEATURE_GATES = {
    "RayClusterStatusConditions": True,
    "RayJobDeletionPolicy": True,
    "RayMultiHostIndexing": True,
    "RayServiceIncrementalUpgrade": True,
    "RayCronJob": False,
}


def stack_settings(busybox_ref: str) -> dict[str, str]:
    """`pulumi config set --path` overrides of the dev stack for this machine's node.

    CPU requests sized so a head, a learner, 3 workers with their games and the operator
    fit 2 cores (1.75); Ray rounds each container's CPUs up, so every worker still
    advertises one CPU and env runners ask for `workers.cpus`. The node runs with CFS
    quotas off (node.py): these sizes schedule, they do not throttle."""
    return {
        "topology.ray.head.cpus": "0.4",
        # The job's driver (RLlib's algorithm, torch) runs on the head beside the GCS
        # and the dashboard: the dev stack's 2Gi is tight for both.
        "topology.ray.head.memory": "3Gi",
        "topology.learners.cpus": "0.25",
        "topology.workers.cpus": "0.2",
        "topology.simulator.cpus": "0.1",
        "topology.simulator.memory": "512Mi",
        # The images are imported into the node: nothing is pulled.
        "topology.image_pull_timeout_s": "0",
        # The game's forwarder (networked, loopback games) and the loader: images the
        # tier has (the defaults are public images no registry serves here).
        "topology.simulator.forwarder_image": images_build.topology_refs()[1],
        "topology.executables.loader_image": busybox_ref,
        # The chart the repository carries (no Helm repository here), running the operator
        # image the tier built, tagged with the binary's own version.
        "topology.operator.chart_path": str(KUBERAY_CHART_DIR),
        "topology.operator.values.image.tag": images_build.kuberay_version(),
    } | {
        f"topology.operator.values.featureGates[{i}].{key}": value
        for i, (name, enabled) in enumerate(OPERATOR_FEATURE_GATES.items())
        for key, value in (("name", name), ("enabled", str(enabled).lower()))
    }


def ray_pods(cp: ControlPlane, group: str | None = None) -> list[dict[str, Any]]:
    selector = f"ray.io/cluster={CLUSTER}" + (f",ray.io/group={group}" if group else "")
    pods = cp.get_json("pods", "-n", NAMESPACE, "-l", selector)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def head_pod(cp: ControlPlane) -> str:
    pods = [p for p in ray_pods(cp, "headgroup") if running_and_ready(p)]
    if not pods:
        raise ControlPlaneError("no Ray head pod is Running and Ready")
    return str(pods[0]["metadata"]["name"])


def ray_token(cp: ControlPlane) -> str:
    """The token the stack's Ray asks for, from the Secret KubeRay made for the cluster
    (the endpoints' `ray.token_secret`), as `uerl submit` reads it."""
    secret = cp.get_json("secret", CLUSTER, "-n", NAMESPACE)
    return base64.b64decode(secret["data"]["auth_token"]).decode()


def exec_in(cp: ControlPlane, ns: str, pod: str, *argv: str, **kwargs: Any) -> str:
    return cp.kubectl("exec", "-n", ns, pod, "--", *argv, **kwargs).stdout


class PortForward(StartStop):
    """`kubectl port-forward -n NS pod/HEAD LOCAL:REMOTE` on 127.0.0.1, as a user runs it.

    A port-forward is tied to one pod and, when that pod is replaced (a new Ray image, a
    pattern switch), stays up forwarding to nothing: `ensure()` starts it again whenever
    the head pod is another one than it was started for, or the process exited."""

    def __init__(self, cp: ControlPlane, log_dir: Path, remote_port: int) -> None:
        self.cp = cp
        self.remote_port = remote_port
        self.port = free_ports(1)[0]
        self.log = log_dir / f"port-forward-head-{remote_port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pod = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.stop()
        self.pod = head_pod(self.cp)
        mark = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.cp.bin["kubectl"]), f"--kubeconfig={self.cp.kubeconfig}",
                 "port-forward", "-n", NAMESPACE, f"pod/{self.pod}",
                 f"{self.port}:{self.remote_port}", "--address", "127.0.0.1"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        # A hang guard: kubectl prints the line about a second after it starts.
        deadline = time.monotonic() + guard(90)
        while "Forwarding from" not in self.log.read_bytes()[mark:].decode(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ControlPlaneError(f"kubectl port-forward did not start:\n{tail(self.log)}")
            time.sleep(0.2)

    def ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None or head_pod(self.cp) != self.pod:
            self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # our own child, by pid
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class RayJobs:
    """The Ray Jobs API of the head, through a port-forward to its dashboard."""

    forward: PortForward

    def cli(
        self, *args: str, timeout_s: float = RAY_CLI_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        self.forward.ensure()
        # `--address` first: after a `--`, everything is the entrypoint's.
        return subprocess.run(
            [str(RAY), "job", args[0], "--address", self.forward.url, *args[1:]],
            capture_output=True, text=True, timeout=timeout_s,
            # Ray's CLI sends RAY_AUTH_TOKEN when told the cluster asks for one.
            env={"PATH": str(RAY.parent), "RAY_ADDRESS": "", "HOME": "/tmp",
                 "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token(self.forward.cp)},
        )  # fmt: skip

    def submit(self, submission_id: str, entrypoint: list[str]) -> None:
        """`ray job submit --no-wait -- ENTRYPOINT`: uerl is in the image, so no
        working directory is uploaded."""
        done = self.cli("submit", "--submission-id", submission_id, "--no-wait", "--", *entrypoint)
        if done.returncode != 0:
            raise ControlPlaneError(f"ray job submit failed:\n{done.stdout}{done.stderr}")

    def _client(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        from training.ray_auth.token_client import headers

        self.forward.ensure()
        return JobSubmissionClient(self.forward.url, headers=headers(ray_token(self.forward.cp)))

    def status(self, submission_id: str) -> str:
        return str(self._client().get_job_status(submission_id).value)

    def logs(self, submission_id: str) -> str:
        return str(self._client().get_job_logs(submission_id))

    def wait_for(
        self,
        submission_id: str,
        check: Callable[[str], bool],
        what: str,
        timeout_s: float,
    ) -> str:
        """Poll the job's log until `check(log)`; fail at once if the job ended."""
        deadline = time.monotonic() + timeout_s
        while True:
            logs, status = "", "RUNNING"
            with contextlib.suppress(Exception):  # a port-forward being replaced
                logs = self.logs(submission_id)
                status = self.status(submission_id)
            if logs and check(logs):
                return logs
            if status not in ("PENDING", "RUNNING"):
                raise AssertionError(f"job {status} before {what}:\n{logs[-6000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s:.0f}s waiting for {what}; the job's log:\n"
                    f"{self.logs(submission_id)[-6000:]}"
                )
            time.sleep(2)


@dataclass(frozen=True)
class Progress:
    iteration: int
    env_steps: int
    steps_per_s: float
    return_mean: float
    runners: tuple[int, int] | None
    line: str


def progress(log: str) -> list[Progress]:
    """The job's iterations, in order, from its `iteration` events (tests/run_events.py)."""
    out = []
    for line, event in event_lines(log, "iteration"):
        runners = event.get("runners")
        ret, rate = event.get("return_mean"), event.get("steps_per_s")
        out.append(
            Progress(
                int(event["iteration"]), int(event["env_steps"]),
                float("nan") if rate is None else float(rate),
                float("nan") if ret is None else float(ret),
                (int(runners[0]), int(runners[1])) if runners else None, line,
            )
        )  # fmt: skip
    return out


def lines_after(log: str, marker: str) -> str:
    """The log after the first line containing `marker` ("" if none)."""
    index = log.find(marker)
    return "" if index < 0 else log[index:].split("\n", 1)[-1]


def connects(cp: ControlPlane, ns: str, pod: str, host: str, port: int) -> bool:
    """Whether `pod` (an image with Python) opens a TCP connection to host:port in 3 s."""
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout=3).close()\n"
        "except OSError:\n"
        "    sys.exit(7)\n"
    )
    done = cp.kubectl("exec", "-n", ns, pod, "--", "python3", "-c", probe, check=False)
    if done.returncode not in (0, 7):
        raise ControlPlaneError(f"connection probe in {ns}/{pod} failed:\n{done.stderr}")
    return done.returncode == 0


def pod_ip(cp: ControlPlane, ns: str, pod: str) -> str:
    return str(cp.get_json("pod", "-n", ns, pod)["status"]["podIP"])


# ---- a packaged "game" served inside the cluster --------------------------------------

GAME_ZIP = "FakeGame-Linux.zip"
FILES_NS = "uerl-files"


def fake_build_zip() -> bytes:
    """The build as a zip made on Windows would be: no execute bits at all (the loader
    restores them for the launcher and whatever is under Binaries/Linux)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in fake_build.FILES.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.create_system = 0  # MS-DOS: no Unix mode
            zf.writestr(info, text)
    return buf.getvalue()


@dataclass
class GameFiles:
    """Namespace FILES_NS: a Python web server (the mock game's image) serving the fake
    build from a ConfigMap, behind Service `files`."""

    cp: ControlPlane
    image: str
    url: str = field(init=False, default="")

    def deploy(self) -> str:
        cp = self.cp
        cp.kubectl("create", "namespace", FILES_NS)
        data = fake_build_zip()
        labels = {"app": "files"}
        cp.apply([
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "build", "namespace": FILES_NS},
             "binaryData": {GAME_ZIP: base64.b64encode(data).decode()}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "files", "namespace": FILES_NS},
             "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8000}]}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "files", "namespace": FILES_NS, "labels": labels},
             "spec": {
                 "containers": [{
                     "name": "http", "image": self.image, "imagePullPolicy": "Never",
                     "command": ["python3", "-m", "http.server", "8000", "-d", "/srv"],
                     "volumeMounts": [{"name": "build", "mountPath": "/srv"}],
                     "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1},
                 }],
                 "volumes": [{"name": "build", "configMap": {"name": "build"}}],
                 "terminationGracePeriodSeconds": 1,
             }},
        ])  # fmt: skip
        cp.kubectl("wait", "-n", FILES_NS, "--for=condition=Ready",
                   f"--timeout={guard(180):.0f}s", "pod/files")  # fmt: skip
        self.url = f"http://files.{FILES_NS}.svc.cluster.local/{GAME_ZIP}"
        return self.url


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
