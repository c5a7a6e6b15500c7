"""The whole mission on real pods: `pulumi up`, train on the cluster, rescale while it
trains, lose a game, fence the stack, switch to networked games over TLS running a
packaged build from the shared volume, `pulumi destroy`.

One control plane, one real node (node.py: containerd and runc, the kubelet, CNI,
kube-proxy, CoreDNS, kube-router) and the project's images (images/build.py) imported
into it. The real Pulumi CLI, language host and Kubernetes provider run uerl's program;
the KubeRay operator runs from its chart's Deployment. Training is what a user runs:
`ray job submit` through `kubectl port-forward` to the head's dashboard, `uerl train`
reading `/etc/uerl/endpoints.json` and storing the run on the runs claim, `uerl runs list`
and `pull` of it and `uerl export` on this machine; then `uerl submit` from this machine
(its own port-forward through the Kubernetes API), to the job's end and with Ctrl-C;
then `uerl submit --supervise` runs on the claim and in a bucket, each under a seeded
fault schedule with a checker of its invariants beside it (fault_schedule.py). The
tests run in file order and share the `dev` stack: each stage is a module fixture, each
test checks one thing of what it left.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import prometheus_pod
import pytest
from controlplane import NODE_API_ADDRESS, ControlPlane
from fault_schedule import (
    CONTENDER,
    ENDS_THE_ATTEMPT,
    HEAD,
    HEAD_DURING_UPLOAD,
    LEARNER,
    NEW_IMAGE,
    OPERATOR,
    STORE,
    SUPERVISOR,
    WORKER,
    Checker,
    Fault,
    JobState,
    LogView,
    Schedule,
    StoredRun,
    Struck,
    SupervisorLogs,
    Violation,
    make_schedule,
    read_stored,
    seed_from_environment,
    supervisor_end_problems,
    written_checkpoints,
)
from host_speed import guard
from node import Node
from node_images import busybox_image
from object_store import ObjectStore
from pods_stack import (
    CLUSTER,
    NAMESPACE,
    TRAIN_ARGS,
    UERL,
    GameFiles,
    PortForward,
    RayJobs,
    connects,
    exec_in,
    head_pod,
    images_build,
    lines_after,
    pod_ip,
    progress,
    ray_pods,
    ray_token,
    stack_settings,
    write_json,
)
from prometheus_pod import InClusterPrometheus
from pulumi_project import PulumiProject, Result
from pyarrow import fs
from ray_api_calls import gcs_nodes, http_status  # tests/, on the path via its conftest
from run_events import events
from stacks import running_and_ready
from store_changes import bucket_changes, claim_changes

from infra.endpoints import worker_endpoint
from infra.topology import GCS_PORT, JOB_STOP_GRACE_S, METRICS_PORT, quantity_value
from training.ray_auth import token_client
from training.runstore import attempts
from training.runstore.atomic import PARTIAL_PREFIX
from training.runstore.retention import iteration_of, returns_by_iteration

# Every wait below is a hang guard (host_speed.guard), several times the slowest honest run
# (docs/performance.md, "Training on real pods"); the figures are printed, not asserted.
# pytest-timeout's limit per test: the longest stage (the bucket run) took minutes. Scaled
# here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.pods, pytest.mark.timeout(guard(3600))]

# Stored on the stack's runs claim (`topology.runs`, mounted on the head at /uerl/runs):
# `uerl train --run-name` with no path flag, as a user runs it.
RUN_NAME = "first"
# The driver's per-game lines: a runner's game failed, then answered again.
RUNNER_FAULT = re.compile(r"game of env runner \d+ \(.*\) failed")
RUNNER_BACK = re.compile(r"game of env runner \d+ \(.*\) is back")
OUTSIDER_NS = "outsider"
TLS_SECRET = "uerl-game-tls"


@dataclass
class Figures:
    """Measured along the way; printed and written to the work directory at the end."""

    values: dict[str, Any] = field(default_factory=dict)

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = value
        print(f"figure {key}: {value}")


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Figures]:
    out = Figures()
    yield out
    path = tmp_path_factory.mktemp("figures") / "pods-figures.json"
    write_json(path, out.values)
    print(f"figures in {path}:\n{json.dumps(out.values, indent=2)}")


@pytest.fixture(scope="module")
def busybox_ref(node: Node) -> str:
    img = busybox_image()
    node.import_image(img.archive)
    return img.ref


@pytest.fixture(scope="module")
def images(node: Node, figures: Figures, busybox_ref: str) -> dict[str, str]:
    """The Ray, mock game and operator images, imported into the node."""
    ray_ref, mock_ref = images_build.topology_refs()
    refs = {
        "ray": images_build.qualified(ray_ref),
        "mock-ue": images_build.qualified(mock_ref),
        "operator": images_build.qualified(images_build.operator_image_ref()),
        "unreal-game": images_build.qualified(images_build.FAKE_GAME_REF),
        "busybox": busybox_ref,
    }
    start = time.monotonic()
    node.import_images_from_index(
        [refs["ray"], refs["mock-ue"], refs["operator"], refs["unreal-game"]]
    )
    figures["image_import_s"] = round(time.monotonic() - start, 1)
    # The learners' own image (`learners.image`; on a GPU pool the CUDA one): here the
    # Ray image under a tag of its own, so the pods show which group runs which.
    refs["ray-learner"] = f"{refs['ray']}-learner"
    node.ctr("-n", "k8s.io", "images", "tag", "--force", refs["ray"], refs["ray-learner"])
    return refs


@pytest.fixture(scope="module")
def project(
    node_control_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory
) -> PulumiProject:
    return PulumiProject(tmp_path_factory.mktemp("pulumi"), node_control_plane.kubeconfig)


@dataclass
class Up:
    result: Result
    started: float  # time.monotonic() when `pulumi up` began


# The stack's PodMonitor, and its NetworkPolicy admitting the Prometheus of namespace
# `monitoring` (prometheus_pod.py) to the Ray pods' metrics port. Scraped every 5 s, not
# the default 30 s: Ray's processes report every 10 s, and the run is minutes long.
METRICS_SETTINGS = {
    "topology.metrics.pod_monitor": "true",
    "topology.metrics.interval": "5s",
    "topology.metrics.scraper.namespace": prometheus_pod.NAMESPACE,
    **{f'topology.metrics.scraper.labels["{key}"]': value
       for key, value in prometheus_pod.LABELS.items()},
}  # fmt: skip


@pytest.fixture(scope="module")
def pod_monitor_crd(node_control_plane: ControlPlane) -> None:
    """The Prometheus Operator's PodMonitor CRD, as a cluster running the Operator has it
    (no Operator here: prometheus_pod.py makes its scrape config as the Operator would)."""
    prometheus_pod.install_pod_monitor_crd(node_control_plane)


@pytest.fixture(scope="module")
def dev_stack(
    project: PulumiProject, images: dict[str, str], figures: Figures, pod_monitor_crd: None
) -> Up:
    """`pulumi stack init dev`, the machine's overrides, `pulumi up`."""
    settings = stack_settings(images["busybox"]) | METRICS_SETTINGS
    project.new_stack("dev", settings | {"topology.learners.image": images["ray-learner"]})
    started = time.monotonic()
    result = project.up("dev", "--skip-preview", timeout_s=guard(900))
    figures["pulumi_up_s"] = round(result.seconds, 1)
    return Up(result, started)


@pytest.fixture(scope="module")
def dashboard(
    node_control_plane: ControlPlane, dev_stack: Up, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PortForward]:
    with PortForward(node_control_plane, tmp_path_factory.mktemp("forward"), 8265) as forward:
        yield forward


@pytest.fixture(scope="module")
def jobs(dashboard: PortForward) -> RayJobs:
    return RayJobs(dashboard)


# A pod of namespace `monitoring` without the scraper's labels: the NetworkPolicy's outsider.
UNLABELLED_PROBE = "unlabelled"


@pytest.fixture(scope="module")
def prometheus(
    node_control_plane: ControlPlane, images: dict[str, str], dev_stack: Up, figures: Figures
) -> InClusterPrometheus:
    """Prometheus in namespace `monitoring`, scraping what the stack's PodMonitor (read
    back from the API server) selects (prometheus_pod.py), from before the training."""
    server = prometheus_pod.start(
        node_control_plane, NAMESPACE, images["ray"], probe_pod=UNLABELLED_PROBE
    )
    figures["prometheus_apply_to_ready_s"] = round(server.started_s, 1)
    return server


# ---- a. `pulumi up` on real pods ------------------------------------------------------


def test_up_runs_the_operator_from_its_chart_on_the_node(
    node_control_plane: ControlPlane, node: Node, dev_stack: Up, images: dict[str, str]
) -> None:
    pods = node_control_plane.get_json(
        "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=kuberay-operator"
    )["items"]
    assert len(pods) == 1 and running_and_ready(pods[0]), pods
    assert pods[0]["spec"]["nodeName"] == node.name
    status = pods[0]["status"]["containerStatuses"][0]
    assert status["image"] == images["operator"] and status["ready"]


def test_up_returns_with_every_ray_pod_ready_through_its_probes(
    node_control_plane: ControlPlane, dev_stack: Up
) -> None:
    pods = ray_pods(node_control_plane)
    groups = sorted(p["metadata"]["labels"]["ray.io/group"] for p in pods)
    assert groups == ["headgroup", "learners", "workers", "workers"]
    for pod in pods:
        assert running_and_ready(pod), pod["metadata"]["name"]
        ray = pod["spec"]["containers"][0]
        # KubeRay's own probes, met by the running Ray processes.
        assert ray.get("readinessProbe") and ray.get("livenessProbe"), ray["name"]


def test_sidecar_games_started_before_the_ray_container_and_are_ready(
    node_control_plane: ControlPlane, dev_stack: Up
) -> None:
    for pod in ray_pods(node_control_plane, "workers"):
        statuses = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
        game = statuses["ue"]
        assert game["ready"] and game["started"], game
        ray = pod["status"]["containerStatuses"][0]
        assert game["state"]["running"]["startedAt"] <= ray["state"]["running"]["startedAt"]


def test_the_head_mounts_the_endpoints_the_stack_exports(
    node_control_plane: ControlPlane, project: PulumiProject, dev_stack: Up
) -> None:
    cp = node_control_plane
    mounted = exec_in(cp, NAMESPACE, head_pod(cp), "cat", "/etc/uerl/endpoints.json")
    assert json.loads(mounted) == project.outputs("dev")["endpoints"]


def test_the_learner_pod_runs_the_learners_image_and_the_others_rays(
    node_control_plane: ControlPlane, dev_stack: Up, images: dict[str, str]
) -> None:
    ran = {  # as containerd names them (the topology's default is written unqualified)
        p["metadata"]["labels"]["ray.io/group"]: images_build.qualified(
            p["spec"]["containers"][0]["image"]
        )
        for p in ray_pods(node_control_plane)
        if running_and_ready(p)
    }
    assert ran == {
        "headgroup": images["ray"],
        "learners": images["ray-learner"],
        "workers": images["ray"],
    }


def test_every_ray_pod_has_a_memory_backed_dev_shm_of_its_groups_size(
    node_control_plane: ControlPlane, dev_stack: Up
) -> None:
    cp = node_control_plane
    probe = (
        "import os; s = os.statvfs('/dev/shm'); "
        "print([m.split()[2] for m in open('/proc/mounts') if m.split()[1] == '/dev/shm'][-1], "
        "s.f_blocks * s.f_frsize)"
    )
    for pod in ray_pods(cp):
        [shm] = [v for v in pod["spec"]["volumes"] if v["name"] == "uerl-shm"]
        size = quantity_value(shm["emptyDir"]["sizeLimit"])
        container = pod["spec"]["containers"][0]["name"]
        found = cp.kubectl("exec", "-n", NAMESPACE, pod["metadata"]["name"], "-c", container,
                           "--", "python3", "-c", probe).stdout.split()  # fmt: skip
        # tmpfs, as large as the topology says (not the container's 64 MB default).
        assert found == ["tmpfs", str(int(size))], (pod["metadata"]["name"], found, size)


# ---- Ray behind the stack's token --------------------------------------------------------


def test_every_ray_container_is_given_the_token_from_the_secret_kuberay_made(
    node_control_plane: ControlPlane, dev_stack: Up, project: PulumiProject
) -> None:
    cp = node_control_plane
    named = project.outputs("dev")["endpoints"]["ray"]["token_secret"]
    secret = cp.get_json("secret", named, "-n", NAMESPACE)
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("RayCluster", CLUSTER)  # deleted with it
    assert len(base64.b64decode(secret["data"]["auth_token"])) >= 32
    for pod in ray_pods(cp):
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": named, "key": "auth_token"
        }  # fmt: skip


def test_the_job_api_refuses_a_caller_without_the_token_and_takes_one_with_it(
    node_control_plane: ControlPlane, dashboard: PortForward
) -> None:
    dashboard.ensure()
    jobs = f"{dashboard.url}/api/jobs/"
    assert http_status(jobs, {}) == 401
    assert http_status(jobs, {"Authorization": "Bearer not-the-token"}) == 403
    assert http_status(jobs, token_client.headers(ray_token(node_control_plane))) == 200


def test_the_gcs_refuses_a_caller_without_the_token_and_takes_one_with_it(
    node_control_plane: ControlPlane, dev_stack: Up, tmp_path: Path
) -> None:
    import grpc

    cp = node_control_plane
    with PortForward(cp, tmp_path, 6379) as gcs:
        with pytest.raises(grpc.RpcError) as refused:
            gcs_nodes(f"127.0.0.1:{gcs.port}")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        nodes = gcs_nodes(f"127.0.0.1:{gcs.port}", ray_token(cp))
    alive = [n for n in nodes if n.state == n.ALIVE]
    assert len(alive) == len(ray_pods(cp))  # the head, the learner, the workers


# ---- g. the restricted Pod Security Standard --------------------------------------------


def test_the_namespace_enforces_restricted_and_every_pod_runs(
    node_control_plane: ControlPlane, dev_stack: Up
) -> None:
    cp = node_control_plane
    labels = cp.get_json("namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = cp.get_json("pods", "-n", NAMESPACE)["items"]
    assert len(pods) == 5  # operator, head, learner, two workers
    assert all(running_and_ready(p) for p in pods)


def test_the_namespace_refuses_a_pod_that_breaks_restricted(
    node_control_plane: ControlPlane, dev_stack: Up, images: dict[str, str]
) -> None:
    """The standard is enforced, not only labelled: a root pod is refused."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "root-pod", "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": images["busybox"],
                                 "securityContext": {"runAsUser": 0}}]},
    }  # fmt: skip
    done = node_control_plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    assert done.returncode != 0
    assert 'violates PodSecurity "restricted' in done.stderr, done.stderr


# ---- b, c. training as a user runs it, rescaled while it trains ----------------------


@dataclass
class SidecarRun:
    """The sidecar job's log at each step of the scenario."""

    logs: dict[str, str] = field(default_factory=dict)
    workers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    runner_node_ips: list[str] = field(default_factory=list)
    status: str = ""
    stop_s: float = 0.0  # `ray job stop` until the job's status is terminal


def _config_up(project: PulumiProject, path: str, value: str) -> Result:
    project.config_set("dev", path, value)
    return project.up("dev", "--skip-preview", timeout_s=guard(900))


def _runner_node_ips(cp: ControlPlane) -> list[str]:
    """The addresses of the Ray nodes the job's live env runners are on (Ray's state API
    on the head)."""
    head = head_pod(cp)
    actors = json.loads(exec_in(
        cp, NAMESPACE, head, "ray", "list", "actors", "--format", "json", "--limit", "1000",
        "--filter", "state=ALIVE",
    ))  # fmt: skip
    nodes = json.loads(exec_in(cp, NAMESPACE, head, "ray", "list", "nodes", "--format", "json"))
    ip_of = {n["node_id"]: n["node_ip"] for n in nodes}
    # uerl's runners: the single-agent one for one-agent games, the multi-agent one else.
    runners = ("UESingleAgentEnvRunner", "UEEnvRunner")
    return sorted(ip_of[a["node_id"]] for a in actors if a["class_name"] in runners)


def _after_last_rescale_runners(log: str, marker: str, want: tuple[int, int]) -> bool:
    return any(p.runners == want for p in progress(lines_after(log, marker)))


def _shrunk_to_one(log: str) -> bool:
    """KubeRay deletes the pods one by one: the runners leave as their pods go (3 -> 2,
    2 -> 1, or 3 -> 1 at once); done once an iteration ran on one healthy runner."""
    last = log.rfind("rescale: ")
    return (
        "rescale: 3 -> " in log
        and "-> 1 env runners" in log[last:].split("\n", 1)[0]
        and (any(p.runners == (1, 1) for p in progress(log[last:])))
    )


SIDECAR_JOB = "uerl-pods-sidecar"


@pytest.fixture(scope="module")
def sidecar_run(
    node_control_plane: ControlPlane,
    project: PulumiProject,
    dev_stack: Up,
    jobs: RayJobs,
    figures: Figures,
    prometheus: InClusterPrometheus,  # scraping the whole run
) -> SidecarRun:
    cp = node_control_plane
    run = SidecarRun()
    jobs.submit(SIDECAR_JOB, ["uerl", "train", "--run-name", RUN_NAME, "--iterations", "1000",
                              *TRAIN_ARGS])  # fmt: skip
    log = jobs.wait_for(
        SIDECAR_JOB, lambda log: bool(progress(log)), "the first iteration", guard(600)
    )
    figures["up_to_first_iteration_s"] = round(time.monotonic() - dev_stack.started, 1)
    log = jobs.wait_for(
        SIDECAR_JOB, lambda log: len(progress(log)) >= 8, "8 iterations on 2 games", guard(600)
    )
    rates = [p.steps_per_s for p in progress(log)[2:8]]
    figures["pods_env_steps_per_s_2_games_median"] = sorted(rates)[len(rates) // 2]
    run.logs["start"] = log

    # c. grow: 2 -> 3 while it trains.
    up = _config_up(project, "topology.workers.replicas", "3")
    figures["pulumi_up_grow_s"] = round(up.seconds, 1)
    grown = time.monotonic()
    run.logs["grow"] = jobs.wait_for(
        SIDECAR_JOB,
        lambda log: _after_last_rescale_runners(log, "rescale: 2 -> 3", (3, 3)),
        "rescale 2 -> 3 and an iteration with 3 runners",
        guard(420),
    )
    figures["grow_to_3_runners_sampling_s"] = round(time.monotonic() - grown, 1)

    # c. shrink: 3 -> 1; KubeRay chooses which worker pods go.
    run.workers["before_shrink"] = ray_pods(cp, "workers")
    _config_up(project, "topology.workers.replicas", "1")
    run.logs["shrink"] = jobs.wait_for(
        SIDECAR_JOB, _shrunk_to_one, "the runners down to 1 and an iteration with it", guard(420)
    )
    cp.wait_until(lambda: len(ray_pods(cp, "workers")) == 1, guard(300), "one worker pod left")
    run.workers["after_shrink"] = ray_pods(cp, "workers")
    run.runner_node_ips = _runner_node_ips(cp)

    stop_asked = time.monotonic()
    stopped = jobs.cli("stop", SIDECAR_JOB, timeout_s=JOB_STOP_GRACE_S + guard(180))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    deadline = time.monotonic() + guard(180)
    while (status := jobs.status(SIDECAR_JOB)) in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, "ray job stop did not end the job"
        time.sleep(2)
    run.status = status
    run.stop_s = time.monotonic() - stop_asked
    figures["ray_job_stop_to_stopped_s"] = round(run.stop_s, 1)
    run.logs["end"] = jobs.logs(SIDECAR_JOB)
    print(f"--- the sidecar job's log ---\n{run.logs['end']}")
    return run


def test_the_job_trains_on_the_mounted_endpoints_and_its_return_improves(
    sidecar_run: SidecarRun,
) -> None:
    log = sidecar_run.logs["end"]
    assert "preflight ok" in log
    rows = [p for p in progress(log) if p.return_mean == p.return_mean]
    first, best = rows[0].return_mean, max(p.return_mean for p in rows)
    assert best >= 1.5 * first, (first, best)


def test_a_grow_while_training_adds_runners_that_sample(sidecar_run: SidecarRun) -> None:
    after = lines_after(sidecar_run.logs["grow"], "rescale: 2 -> 3")
    assert any(p.runners == (3, 3) for p in progress(after))


def test_a_shrink_keeps_the_runner_whose_pod_stayed(sidecar_run: SidecarRun) -> None:
    """KubeRay chose which worker pods to delete; the runner left is on the pod left."""
    before = {p["status"]["podIP"] for p in sidecar_run.workers["before_shrink"]}
    kept = [p["status"]["podIP"] for p in sidecar_run.workers["after_shrink"]]
    assert len(before) == 3 and len(kept) == 1
    assert sidecar_run.runner_node_ips == kept
    log = sidecar_run.logs["shrink"]
    assert "removing the runners of the highest slots" not in log  # no fallback guess


def test_a_shrink_cuts_no_crash_into_the_job(sidecar_run: SidecarRun) -> None:
    log = sidecar_run.logs["shrink"]
    assert "Traceback" not in lines_after(log, "rescale: 2 -> 3")
    done = log[log.rfind("rescale: ") :]
    assert "-> 1 env runners" in done.split("\n", 1)[0]
    assert all(p.runners == (1, 1) for p in progress(done)), done


def test_ray_job_stop_ends_the_job_with_a_final_checkpoint(sidecar_run: SidecarRun) -> None:
    assert sidecar_run.status == "STOPPED"
    assert "SIGTERM: stopping after this iteration" in sidecar_run.logs["end"]


def test_a_stopped_job_ends_on_its_own_before_rays_sigkill(sidecar_run: SidecarRun) -> None:
    # Ray waits for every process of the job, the orphaned driver too: without a reaper
    # as the head pod's PID 1 its zombie held the stop until the SIGKILL, the whole grace.
    # Not a speed goal: Ray's own grace (11.6 s honest, 10x under it); a stop that outlasts
    # it ends in that SIGKILL, whatever the host.
    assert sidecar_run.stop_s < JOB_STOP_GRACE_S, sidecar_run.stop_s


def test_the_stored_run_is_listed_pulled_and_exported_on_this_machine(
    node_control_plane: ControlPlane,
    sidecar_run: SidecarRun,
    submit_endpoints: Path,
    tmp_path: Path,
) -> None:
    # As a user does it: `uerl runs` on the stack's endpoints, through the API (no kubectl).
    kube = ("--endpoints", str(submit_endpoints), "--kubeconfig",
            str(node_control_plane.kubeconfig))  # fmt: skip
    last = progress(sidecar_run.logs["end"])[-1].iteration
    listed = subprocess.run([str(UERL), "runs", "list", *kube],
                            capture_output=True, text=True, timeout=guard(300))  # fmt: skip
    print(listed.stdout, listed.stderr)
    assert listed.returncode == 0, listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith(RUN_NAME))
    assert row[1:3] == [f"checkpoint_{last:06d}", str(last)], listed.stdout
    # Into ./runs/first, the default --to, as the README shows it.
    pulled = subprocess.run([str(UERL), "runs", "pull", "first", *kube, "--latest"],
                            capture_output=True, text=True, timeout=guard(600),
                            cwd=tmp_path)  # fmt: skip
    print(pulled.stderr)
    assert pulled.returncode == 0, pulled.stderr
    run = tmp_path / "runs" / RUN_NAME
    assert (run / "checkpoints" / "latest").read_text() == f"checkpoint_{last:06d}"
    # The run's record came with it: a row per iteration, once each.
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(1, last + 1)), rows
    done = subprocess.run([str(UERL), "export", "--checkpoint", "runs/first/checkpoints"],
                          capture_output=True, text=True, timeout=guard(600),
                          cwd=tmp_path)  # fmt: skip
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    # Every file written was verified, and every output of each agrees with torch.
    written = re.findall(r"^\S+\.onnx  \(policy ", done.stdout, re.M)
    checks = [line for line in done.stdout.splitlines() if line.startswith("  verified on")]
    assert written and len(checks) == len(written), done.stdout
    counts = [int(n) for line in checks for n in re.findall(r"(\d+) mismatch\(es\)", line)]
    assert counts and set(counts) == {0}, done.stdout


# ---- Prometheus scraping the run through the PodMonitor and the NetworkPolicy --------

PROMETHEUS_JOB = f"{NAMESPACE}/{CLUSTER}-ray"  # the Operator's job label: <ns>/<PodMonitor>


def test_prometheus_scrapes_every_ray_pod_up_through_the_pod_monitor(
    node_control_plane: ControlPlane, prometheus: InClusterPrometheus, sidecar_run: SidecarRun
) -> None:
    cp = node_control_plane
    seen: dict[str, dict[str, Any]] = {}

    def every_pod_up() -> bool:
        pods = {p["metadata"]["name"]: p for p in ray_pods(cp)}
        targets = {t["labels"]["pod"]: t for t in prometheus.targets()}
        seen.update(pods=pods, targets=targets)
        return set(targets) == set(pods) and all(t["health"] == "up" for t in targets.values())

    # A target new since the last scrape shows "unknown" until scraped (every 5 s).
    cp.wait_until(every_pod_up, guard(60), "every Ray pod an up target of the PodMonitor")
    pods, targets = seen["pods"], seen["targets"]
    groups = Counter(p["metadata"]["labels"]["ray.io/group"] for p in pods.values())
    assert set(groups) == {"headgroup", "learners", "workers"}, groups
    for name, target in targets.items():
        assert target["labels"]["job"] == PROMETHEUS_JOB, target
        assert target["labels"]["endpoint"] == "metrics", target
        ip = pods[name]["status"]["podIP"]
        assert target["scrapeUrl"] == f"http://{ip}:{METRICS_PORT}/metrics", target
    # What Prometheus scraped of them is Ray's own metrics agent's.
    up = prometheus.query(f'up{{job="{PROMETHEUS_JOB}"}}')
    assert {r["metric"]["pod"] for r in up if r["value"][1] == "1"} == set(pods), up


def test_each_env_runner_s_env_steps_are_a_series_labelled_with_its_game(
    project: PulumiProject, prometheus: InClusterPrometheus, sidecar_run: SidecarRun
) -> None:
    selector = f'job="{PROMETHEUS_JOB}", run="{RUN_NAME}"'
    by_runner = prometheus.query(
        f"max by (runner, game) (max_over_time(ray_uerl_env_steps_total{{{selector}}}[1h]))"
    )
    by_pod = prometheus.query(
        f"count by (pod) (count_over_time(ray_uerl_env_steps_total{{{selector}}}[1h]))"
    )
    print(f"ray_uerl_env_steps_total by runner: {by_runner}\nby pod: {by_pod}")
    runners = Counter(r["metric"]["runner"] for r in by_runner)
    # The run grew to 3 runners: each of them a series, each with one game.
    assert len(runners) >= 3 and set(runners.values()) == {1}, by_runner
    assert all(float(r["value"][1]) > 0 for r in by_runner), by_runner
    endpoints = project.outputs("dev")["endpoints"]
    games = {
        worker_endpoint(endpoints["worker_url_template"], endpoints["port"],
                        endpoints["port_offset_mode"], slot)
        for slot in range(1, max(map(int, runners)) + 1)
    }  # fmt: skip
    assert {r["metric"]["game"] for r in by_runner} <= games, (by_runner, games)
    # Scraped from the worker pods the runners ran on (each Ray node serves its own).
    workers = {
        p["metadata"]["name"]
        for key in ("before_shrink", "after_shrink")
        for p in sidecar_run.workers[key]
    }
    assert {r["metric"]["pod"] for r in by_pod} <= workers, (by_pod, workers)


def test_the_drivers_last_iteration_in_prometheus_is_the_runs_last_in_metrics_csv(
    node_control_plane: ControlPlane, prometheus: InClusterPrometheus, sidecar_run: SidecarRun
) -> None:
    rows = (_claim_dir(node_control_plane) / RUN_NAME / "metrics.csv").read_text().splitlines()
    last = int(rows[-1].split(",")[0])
    selector = f'job="{PROMETHEUS_JOB}", run="{RUN_NAME}"'
    iteration = f"ray_uerl_training_iteration{{{selector}}}"
    scraped = prometheus.query(f"max(last_over_time({iteration}[1h]))")
    print(f"ray_uerl_training_iteration: {scraped}; metrics.csv's last iteration: {last}")
    assert scraped and float(scraped[0]["value"][1]) == last, (scraped, last)
    # Scraped from the head, where the job's driver runs.
    heads = prometheus.query(f"count by (pod) (count_over_time({iteration}[1h]))")
    assert {r["metric"]["pod"] for r in heads} <= {
        p["metadata"]["name"] for p in ray_pods(node_control_plane, "headgroup")
    }, heads


DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "dashboards" / "uerl-training.json"
DASHBOARD_VALUES = {"stack": CLUSTER, "run": RUN_NAME, "window": "1m"}
GRAFANA_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def test_every_dashboard_query_returns_data_of_the_run(
    prometheus: InClusterPrometheus, sidecar_run: SidecarRun
) -> None:
    """Each panel's PromQL of the repository's Grafana dashboard, its variables filled in
    as Grafana would for this stack and run, over the run (a graph's range query)."""
    board = json.loads(DASHBOARD.read_text())
    panels = [
        inner for panel in board["panels"]
        for inner in ([panel] if panel.get("type") != "row" else panel.get("panels", []))
    ]  # fmt: skip

    def filled(expr: str) -> str:
        return GRAFANA_VARIABLE.sub(lambda m: DASHBOARD_VALUES[m.group(1) or m.group(2)], expr)

    empty: list[str] = []
    checked = 0
    for panel in panels:
        for target in panel.get("targets", []):
            expr = filled(target["expr"])
            series = prometheus.query_range(expr, prometheus.ready_at, time.time())
            points = [v for s in series for _, v in s["values"] if v not in ("NaN", "+Inf")]
            print(f"dashboard {panel['title']!r} {target['refId']}: {len(points)} point(s)")
            checked += 1
            if not points:
                empty.append(f"{panel['title']!r} {target['refId']}: {expr}")
    assert checked and not empty, "no data:\n" + "\n".join(empty)


def test_only_the_scraper_reaches_the_metrics_port_and_nothing_else(
    node_control_plane: ControlPlane, prometheus: InClusterPrometheus, figures: Figures
) -> None:
    """The stack's `<name>-ray-metrics` NetworkPolicy, enforced by kube-router: a pod of
    namespace `monitoring` without the scraper's labels times out; Prometheus' own pod
    connects, to the metrics port only."""
    cp = node_control_plane
    head = pod_ip(cp, NAMESPACE, head_pod(cp))
    worker = pod_ip(cp, NAMESPACE, ray_pods(cp, "workers")[0]["metadata"]["name"])
    monitoring = prometheus_pod.NAMESPACE
    for address in (head, worker):
        assert connects(cp, monitoring, prometheus_pod.NAME, address, METRICS_PORT), address
        assert not connects(cp, monitoring, UNLABELLED_PROBE, address, METRICS_PORT), address
    assert not connects(cp, monitoring, prometheus_pod.NAME, head, GCS_PORT)
    figures["prometheus_cpu_s_after_sidecar_run"] = round(prometheus.cpu_seconds(), 1)
    # Its last test: the rest of the module runs without a scrape of every Ray pod each 5 s.
    cp.kubectl("delete", "namespace", monitoring, "--wait=false")


# ---- `uerl submit`: the same training from this machine, through the Kubernetes API -----

SUBMIT_JOB = "uerl-pods-submit"
SUBMIT_STOP_JOB = "uerl-pods-submit-stop"
# Runs on the runs claim, named (`--run-name`): the head mounts it at /uerl/runs.
SUBMIT_RUN = "submit"
SUBMIT_STOP_RUN = "submit-stop"


@pytest.fixture(scope="module")
def submit_endpoints(
    project: PulumiProject, dev_stack: Up, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """`pulumi stack output endpoints --json > endpoints.json`, as a user writes it."""
    path = tmp_path_factory.mktemp("submit") / "endpoints.json"
    write_json(path, project.outputs("dev")["endpoints"])
    return path


def _uerl_submit(
    cp: ControlPlane, endpoints: Path, submission_id: str, run_name: str, *train: str
) -> list[str]:
    """`uerl submit` with its own port-forward (no kubectl), the admin kubeconfig."""
    return [str(UERL), "submit", "--endpoints", str(endpoints), "--kubeconfig",
            str(cp.kubeconfig), "--submission-id", submission_id, "--", "train",
            "--run-name", run_name, *train, *TRAIN_ARGS]  # fmt: skip


def _stop_if_running(jobs: RayJobs, submission_id: str) -> None:
    """After a failed test: the job must not hold the games for the tests after it."""
    with contextlib.suppress(Exception):
        if jobs.status(submission_id) in ("PENDING", "RUNNING"):
            jobs.cli("stop", submission_id, timeout_s=JOB_STOP_GRACE_S + guard(180))


def test_uerl_submit_trains_on_the_cluster_and_exits_0(
    node_control_plane: ControlPlane,
    sidecar_run: SidecarRun,  # its job stopped: the games are free
    submit_endpoints: Path,
    jobs: RayJobs,
) -> None:
    argv = _uerl_submit(node_control_plane, submit_endpoints, SUBMIT_JOB, SUBMIT_RUN,
                        "--iterations", "2")  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=guard(900))
    finally:
        _stop_if_running(jobs, SUBMIT_JOB)
    print(f"--- uerl submit ---\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    rows = progress(done.stdout)  # the job's log, streamed to this machine
    assert rows and rows[-1].iteration == 2, done.stdout[-6000:]


def test_ctrl_c_on_uerl_submit_stops_the_job_with_a_final_checkpoint(
    node_control_plane: ControlPlane,
    sidecar_run: SidecarRun,  # its job stopped: the games are free
    submit_endpoints: Path,
    jobs: RayJobs,
    figures: Figures,
) -> None:
    argv = _uerl_submit(node_control_plane, submit_endpoints, SUBMIT_STOP_JOB,
                        SUBMIT_STOP_RUN, "--iterations", "1000")  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []
    trained = threading.Event()

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if progress(line):
                trained.set()

    def read_err() -> None:
        assert proc.stderr is not None
        err.extend(proc.stderr)

    readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    for reader in readers:
        reader.start()
    try:
        waited = guard(600)
        deadline = time.monotonic() + waited
        while not trained.wait(2):
            assert proc.poll() is None, "".join(out)[-6000:] + "".join(err)
            assert time.monotonic() < deadline, (
                f"no iteration in {waited:.0f} s:\n" + "".join(out)[-6000:]
            )
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        interrupted = time.monotonic()
        # uerl submit waits for the job's end: Ray's grace after SIGTERM, and a minute more.
        code = proc.wait(timeout=JOB_STOP_GRACE_S + guard(180))
        ended_s = time.monotonic() - interrupted
    finally:
        if proc.poll() is None:
            proc.kill()  # our own child, by its handle
            proc.wait()
        _stop_if_running(jobs, SUBMIT_STOP_JOB)
    for reader in readers:
        reader.join(timeout=10)
    print(f"--- uerl submit, Ctrl-C ---\n{''.join(out)[-6000:]}\n{''.join(err)[-3000:]}")
    figures["uerl submit: Ctrl-C -> exit, s"] = round(ended_s, 1)
    assert code == 130, "".join(err)
    assert jobs.status(SUBMIT_STOP_JOB) == "STOPPED"
    # The driver exited: no SIGKILL from Ray. Ray's grace, not a speed goal (27 s honest);
    # a stop that outlasts it ends in that SIGKILL, whatever the host.
    assert ended_s < JOB_STOP_GRACE_S, ended_s
    log = jobs.logs(SUBMIT_STOP_JOB)
    assert "checkpoint" in log
    # The driver's line for the final checkpoint it wrote after Ray's SIGTERM.
    assert f"checkpoint: /uerl/runs/{SUBMIT_STOP_RUN}/checkpoints/checkpoint_" in log, log[-6000:]


# ---- runs that outlive their pods: `uerl submit --supervise` under a fault schedule ------
#
# One supervised run on the claim and one in a bucket, each while a seeded schedule
# (fault_schedule.py) strikes: on the claim the head force-deleted, the supervisor's own
# pod and a worker pod; in the bucket the store stopped 30 s, the operator's pod, the
# learner pod, `pulumi up` with a new image and the head force-deleted while a
# checkpoint's upload hangs. A checker beside each run holds it to its invariants the
# whole time. The seed and each fault's time are printed and in the figures: with
# UERL_FAULT_SEED=<seed> a failed schedule runs again in the same order.

SUPERVISED_RUN = "supervised"
# Room for its three faults: the first after 4-5 iterations (the return has moved by
# then), each next 1-2 iterations after the one before is over; the run trains on while
# a replaced supervisor starts and follows (up to 6 iterations here) and while a deleted
# worker pod drains, is replaced and samples twice (up to 12: its raylet samples on
# through its grace period), and some after the last fault. 24 was too few for worker,
# then head (a CI run: the worker's fault over at iteration 22 of 24); and a second
# writer refused (an iteration or two: its `uerl train` starts, watches the lease renewed).
SUPERVISED_ITERATIONS = 36
CLAIM_FAULTS = (HEAD, SUPERVISOR, WORKER, CONTENDER)
CHECKPOINT_EVERY = 2  # both supervised runs' --checkpoint-every
CHECK_EVERY_S = 3.0  # the checker's rounds
# The store's outage: killed, then started again on its data this long after.
STORE_DOWN_S = 20.0
# The store stopped until the next checkpoint is written (a checkpoint interval, about 7 s
# here) and seen in the supervisor's log; back before the new head's restore gives up on
# it (the run storage waits 60 s for a store).
# A fault's length is a fixed figure, never scaled with the hang guards (the run storage's
# own wait, STORE_WAIT_S, is not scaled either).
UPLOAD_PAUSE_S = 40.0
JOB_API_TIMEOUT_S = guard(20)  # one request of the checker to the head's job API
# The longest the checker may go without reading the store outside an outage.
READ_GAP_LIMIT_S = guard(90)
# Checks over the runs' whole life: a checker that read too little proved nothing.
CHECKER_ROUNDS_AT_LEAST = 10
# A dead writer's save cut short (a writer id no process has), as a head lost mid-save
# leaves one: on the claim the next attempt must remove it when it takes the run; in
# the head's staging of a bucket run the mirror must never upload it.
LEFTOVER = f"checkpoints/{PARTIAL_PREFIX}0badc0de-checkpoint_000001"


@dataclass
class FaultRun:
    """A supervised run through its fault schedule, as it went."""

    job: str
    schedule: Schedule
    struck: list[Struck]
    over_s: dict[int, float]  # each fault (its index) -> until the run was over it, s
    violations: list[Violation]
    counts: dict[str, int]  # the checker's rounds, by what they read
    log: str  # every pod's log of the supervisor's Job, oldest pod first
    end_problems: list[str]  # supervisor_end_problems at its end
    evidence: dict[str, str]  # what the faults left to check
    pulled: Path = Path()  # `uerl runs pull` of it
    run_dir: Path | None = None  # on the claim, as this machine reads its volume

    def hit(self, kind: str) -> Struck:
        [found] = [hit for hit in self.struck if hit.kind == kind]
        return found


@dataclass
class _Faults:
    """One supervised run under its schedule: what the faults act on, how it is watched."""

    cp: ControlPlane
    label: str  # in printed lines and figures
    run: str
    job: str
    schedule: Schedule
    logs: SupervisorLogs
    checker: Checker
    figures: Figures
    run_dir: Path | None = None  # the claim's run, on this machine
    store: ObjectStore | None = None
    bucket_root: str = ""  # the bucket's run: <bucket>/<prefix>/<run>
    project: PulumiProject | None = None
    node: Node | None = None
    images: dict[str, str] = field(default_factory=dict)
    deleted_supervisors: set[str] = field(default_factory=set)  # their uids
    evidence: dict[str, str] = field(default_factory=dict)
    over_s: dict[int, float] = field(default_factory=dict)
    pauses: list[threading.Thread] = field(default_factory=list)  # the store's, in flight
    # The store's own word of each change of the run's `latest` (store_changes.py), given
    # to the checker for a round each.
    changes: Callable[[Callable[[], None]], contextlib.AbstractContextManager[None]] | None = None


@pytest.fixture(scope="module")
def fault_seed(figures: Figures) -> int:
    """The seed of the module's schedules: UERL_FAULT_SEED's, else a new one, printed."""
    seed = seed_from_environment()
    figures["fault schedule seed"] = seed
    return seed


def _submit_supervised(kube: tuple[str, ...], run: str, iterations: int) -> str:
    """`uerl submit --supervise`, as a user runs it; the supervisor Job's name."""
    made = subprocess.run(
        [str(UERL), "submit", *kube, "--supervise", "--", "train", "--run-name", run,
         "--iterations", str(iterations), *TRAIN_ARGS,
         "--checkpoint-every", str(CHECKPOINT_EVERY)],
        capture_output=True, text=True, timeout=guard(300),
    )  # fmt: skip
    print(made.stdout, made.stderr)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _checkpoint_figures(figures: Figures, run: str, log: str) -> None:
    """What storing cost the run: each checkpoint's size and time to write, against the
    time of an iteration (the `iteration` events' `time_s`)."""
    written = events(log, "checkpoint_written")
    took = sorted(float(event["time_s"]) for event in events(log, "iteration"))

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    if written and took:
        figures[f"{run}: checkpoint MiB"] = max(float(e["mib"]) for e in written)
        figures[f"{run}: checkpoint s, median"] = median([float(e["seconds"]) for e in written])
        figures[f"{run}: of it storing s, median"] = median(
            [float(e["storing_s"]) for e in written]
        )
        figures[f"{run}: iteration s, median"] = median(took)
    uploaded = [e for e in events(log, "checkpoint_stored") if "upload_s" in e]
    if uploaded:
        figures[f"{run}: upload to the bucket s, median"] = median(
            [float(e["upload_s"]) for e in uploaded]
        )


def _supervisor_pods(cp: ControlPlane, job: str) -> list[dict[str, Any]]:
    pods = cp.get_json("pods", "-n", NAMESPACE, "-l", f"job-name={job}")["items"]
    return sorted(pods, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))


def _pod_log(cp: ControlPlane, pod: str) -> str | None:
    done = cp.kubectl("logs", "-n", NAMESPACE, pod, check=False, timeout_s=guard(120))
    return done.stdout if done.returncode == 0 else None


def _operator_pods(cp: ControlPlane) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/name=kuberay-operator"
    pods = cp.get_json("pods", "-n", NAMESPACE, "-l", selector)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _head_images(cp: ControlPlane) -> set[str]:
    return {
        c["image"] for p in ray_pods(cp) for c in p["spec"]["containers"] if c["name"] == "ray-head"
    }


def _job_ended(cp: ControlPlane, job: str) -> bool:
    """The Job's own end (Complete or Failed), not a count: a pod the schedule deleted
    is counted failed while the Job goes on."""
    status = cp.get_json("job", job, "-n", NAMESPACE).get("status", {})
    return any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True"
        for c in status.get("conditions") or []
    )


def _claim_dir(cp: ControlPlane) -> Path:
    """The runs claim's volume on this machine: the tier binds the claim to one of its
    hostPath PersistentVolumes (controlplane.py), read here directly, head or no head."""
    claim = cp.get_json("pvc", f"{CLUSTER}-runs", "-n", NAMESPACE)
    volume = cp.get_json("pv", claim["spec"]["volumeName"])
    return Path(volume["spec"]["hostPath"]["path"])


def _force_delete(cp: ControlPlane, pod: str) -> None:
    """As a node lost takes it: no grace, the object gone at once."""
    cp.kubectl("delete", "pod", "-n", NAMESPACE, pod, "--grace-period=0", "--force", "--wait=false")


def _plant_leftover(run_dir: Path) -> Path:
    """LEFTOVER in the claim's run, owned as the run's files are (its writer must be able
    to remove it)."""
    leftover = run_dir / LEFTOVER
    owner = leftover.parent.stat()
    leftover.mkdir()
    part = leftover / "module_state.pkl"
    part.write_bytes(b"cut short")
    for path in (leftover, part):
        os.chown(path, owner.st_uid, owner.st_gid)
    return leftover


def _plant_in_staging(cp: ControlPlane, run: str) -> str:
    """LEFTOVER in the head's staging of a bucket run (its /tmp, where the driver writes
    before the mirror uploads); the exec's exit status and output."""
    staged = f"/tmp/uerl-runs/{run}"
    script = (
        f"test -f {staged}/metrics.csv && mkdir -p {staged}/{LEFTOVER} && "
        f"echo cut-short > {staged}/{LEFTOVER}/module_state.pkl"
    )
    done = cp.kubectl("exec", "-n", NAMESPACE, head_pod(cp), "-c", "ray-head", "--",
                      "sh", "-c", script, check=False, timeout_s=guard(120))  # fmt: skip
    return f"exit {done.returncode}: {done.stdout}{done.stderr}".strip()


def _watch(
    cp: ControlPlane,
    label: str,
    run: str,
    job: str,
    schedule: Schedule,
    figures: Figures,
    forward: PortForward,
    *,
    keep: int | None,
    read_store: Callable[[], StoredRun],
    claim: bool,
) -> _Faults:
    """The run's supervisor log and its checker: the stored run as `read_store` reads it,
    the head's jobs through `forward` (its own port-forward, started again for each new
    head), the supervisor Job's pods' logs."""
    logs = SupervisorLogs(
        lambda: [p["metadata"]["name"] for p in _supervisor_pods(cp, job)],
        lambda pod: _pod_log(cp, pod),
    )
    headers = token_client.headers(ray_token(cp))  # the cluster's: it outlives its heads

    def read_jobs() -> list[JobState]:
        forward.ensure()  # no head: ControlPlaneError, a round without the job API
        request = urllib.request.Request(f"{forward.url}/api/jobs/", headers=headers)
        with urllib.request.urlopen(request, timeout=JOB_API_TIMEOUT_S) as answer:
            listed = json.load(answer)
        return [JobState(str(j.get("submission_id") or ""), str(j.get("status")),
                         j.get("metadata") or {}) for j in listed]  # fmt: skip

    checker = Checker(
        run,
        keep=keep,
        checkpoint_every=CHECKPOINT_EVERY,
        read_store=read_store,
        read_jobs=read_jobs,
        head_ready=lambda: any(running_and_ready(p) for p in ray_pods(cp, "headgroup")),
        logs=logs.refresh,
        interval_s=CHECK_EVERY_S,
        # A round storing what waited through an outage, then deleting the oldest.
        settle_s=guard(45),
        # A new head Ready before its dashboard answers, a port-forward started again.
        unanswered_limit_s=guard(180),
        partials_allowed=claim,
        # In a bucket a checkpoint is stored once uploaded beside the training: a head
        # lost while one is on its way loses that one too (one interval more).
        redo_bound=CHECKPOINT_EVERY if claim else 2 * CHECKPOINT_EVERY,
        # Two rounds with a hung job-API request each (JOB_API_TIMEOUT_S), and room.
        gap_limit_s=READ_GAP_LIMIT_S,
    )
    return _Faults(cp, label, run, job, schedule, logs, checker, figures)


def _through(f: _Faults, iterations: int, started: Callable[[], None] | None = None) -> FaultRun:
    """The run through its schedule to its end, the checker beside it from its submission
    on; `started`, called once the first iteration shows."""
    changes = f.changes(f.checker.store_changed) if f.changes else contextlib.nullcontext()
    f.checker.start()
    try:
        with changes:
            f.cp.wait_until(lambda: bool(f.logs.refresh().pairs), guard(900),
                            f"the first iteration of run {f.run}", interval_s=2)  # fmt: skip
            if started is not None:
                started()
            struck = _run_schedule(f, iterations)
            f.cp.wait_until(lambda: _job_ended(f.cp, f.job), guard(1200),
                            f"the supervisor Job {f.job} to end", interval_s=3)  # fmt: skip
        violations = f.checker.stop(guard(180))  # with a last round: the end state
    finally:
        f.checker.stop(guard(180), final=False)
        for pause in f.pauses:  # the store goes on by itself after its pause
            pause.join(UPLOAD_PAUSE_S + guard(60))
        view = f.logs.refresh()  # also when a fault or a wait failed: what it did
        print(f"--- supervisor {f.job} ---\n{view.text[-8000:]}")
    for violation in violations:
        print(f"{f.label}: invariant broken: {violation}")
    status = f.cp.get_json("job", f.job, "-n", NAMESPACE).get("status", {})
    end = supervisor_end_problems(status, _supervisor_pods(f.cp, f.job), f.deleted_supervisors)
    counts = dict(f.checker.counts)
    f.figures[f"{f.label}: invariant checks"] = counts | {
        "most checkpoints stored": f.checker.most_checkpoints,
        "longest gap between store reads, s": round(f.checker.longest_gap_s, 1),
    }
    return FaultRun(f.job, f.schedule, struck, f.over_s, violations, counts, view.text, end,
                    f.evidence, run_dir=f.run_dir)  # fmt: skip


def _run_schedule(f: _Faults, iterations: int) -> list[Struck]:
    """Each fault once the run has shown its iterations since the one before was over;
    then until the run is over it."""
    print(f"{f.label}: {f.schedule.describe()}", flush=True)
    f.figures[f"{f.label}: fault schedule"] = f.schedule.describe()
    struck: list[Struck] = []
    mark = f.logs.refresh()
    for index, fault in enumerate(f.schedule.faults, 1):

        def due(seen: frozenset[tuple[int, int]] = mark.pairs, fault: Fault = fault) -> bool:
            view = f.logs.refresh()
            if view.last_iteration >= iterations or _job_ended(f.cp, f.job):
                raise AssertionError(
                    f"{f.label}: the run ended before fault {fault.kind} struck: give it more "
                    f"iterations. {f.schedule.describe()}\n{view.text[-6000:]}"
                )
            return len(view.pairs - seen) >= fault.after

        f.cp.wait_until(due, guard(900), f"{fault.after} iteration(s) before fault {index} "
                        f"({fault.kind})", interval_s=1)  # fmt: skip
        time.sleep(fault.delay_s)  # the seed's moment within the iteration
        before = f.logs.refresh()
        hit = _strike(f, index, fault)
        f.checker.wake()  # a round right after the fault has acted, not at the next interval
        struck.append(hit)
        print(f"{f.label}: fault {hit.describe()}", flush=True)
        f.cp.wait_until(lambda hit=hit, before=before: _over(f, hit, before), guard(900),
                        f"the run going on after fault {index} ({fault.kind})",
                        interval_s=2)  # fmt: skip
        f.over_s[index] = round(f.checker.elapsed() - hit.at_s, 1)
        f.figures[f"{f.label}: fault {index}"] = {
            "kind": hit.kind, "at_s": hit.at_s, "after_iteration": hit.lost_after,
            "attempt": hit.attempt, "over_s": f.over_s[index],
        }  # fmt: skip
        mark = f.logs.refresh()
    return struck


def _strike(f: _Faults, index: int, fault: Fault) -> Struck:
    """`fault`, done. Its record is read right before it acts (the attempt and the last
    iteration the log shows, the newest checkpoint stored) and given to the checker
    first: the attempt it ends is accounted for by it."""
    cp = f.cp

    def struck(what: str, *, store_down: bool = False, stored_before: int | None = None) -> Struck:
        now = f.logs.refresh()
        if stored_before is None:
            stored_before = f.checker.stored_iteration()
        hit = Struck(index, fault.kind, round(f.checker.elapsed(), 1), now.attempt,
                     now.last_iteration, stored_before, store_down, what)  # fmt: skip
        f.checker.struck(hit)
        return hit

    if fault.kind == HEAD:
        head = head_pod(cp)
        if f.run_dir is not None:
            f.evidence["leftover"] = str(_plant_leftover(f.run_dir))
        hit = struck(head)
        _force_delete(cp, head)
        return hit
    if fault.kind == HEAD_DURING_UPLOAD:
        return _head_during_upload(f, struck)
    if fault.kind == SUPERVISOR:
        [pod] = [p["metadata"] for p in _supervisor_pods(cp, f.job) if running_and_ready(p)]
        hit = struck(pod["name"])
        f.deleted_supervisors.add(pod["uid"])
        cp.kubectl("delete", "pod", "-n", NAMESPACE, pod["name"], "--wait=false")
        return hit
    if fault.kind in (LEARNER, WORKER, OPERATOR):
        pods = (
            _operator_pods(cp)
            if fault.kind == OPERATOR
            else ray_pods(cp, "learners" if fault.kind == LEARNER else "workers")
        )
        pod = min((p["metadata"] for p in pods), key=lambda meta: meta["name"])
        f.evidence[fault.kind] = pod["uid"]
        hit = struck(pod["name"])
        cp.kubectl("delete", "pod", "-n", NAMESPACE, pod["name"], "--wait=false")
        return hit
    if fault.kind == STORE:
        assert f.store is not None
        hit = struck(f"the store killed, started again {STORE_DOWN_S:.0f} s later")
        before = f.logs.view()
        f.evidence[STORE] = before.last_line  # the mirror's lines about it come after this
        started = time.monotonic()
        with f.checker.store_outage():  # the checker's reads fail meanwhile
            f.store.kill_and_restart(STORE_DOWN_S)
        shown = f.logs.refresh().pairs - before.pairs
        f.figures[f"{f.label}: store killed -> answering again, s"] = round(
            time.monotonic() - started, 1
        )
        f.figures[f"{f.label}: iterations while the store was down"] = len(shown)
        return hit
    if fault.kind == CONTENDER:
        # The same run on the same head, as a person might start it by mistake: its lease
        # is held and renewed, so it is refused before it writes anything.
        head = head_pod(cp)
        hit = struck(head)
        done = cp.kubectl("exec", "-n", NAMESPACE, head, "-c", "ray-head", "--", "uerl", "train",
                          "--run-name", f.run, "--resume", "auto", "--iterations", "1",
                          check=False, timeout_s=guard(300))  # fmt: skip
        f.evidence[CONTENDER] = f"exit {done.returncode}: {done.stdout}{done.stderr}".strip()
        return hit
    if fault.kind == NEW_IMAGE:
        assert f.node is not None and f.project is not None
        # KubeRay recreates every Ray pod (upgradeStrategy Recreate), the head with them.
        # The same image under a new tag.
        new_image = f"{f.images['ray']}-next"
        f.node.ctr("-n", "k8s.io", "images", "tag", "--force", f.images["ray"], new_image)
        hit = struck(new_image)
        _config_up(f.project, "topology.ray.image", new_image)
        return hit
    raise AssertionError(f"no way to strike {fault.kind}")


def _head_during_upload(f: _Faults, struck: Callable[..., Struck]) -> Struck:
    """The store stopped right after a checkpoint is stored (`latest` uploaded, the round's
    deletions done), so that the next checkpoint's upload hangs on it; the head force-
    deleted once the driver says it wrote that one. Its record: the hanging checkpoint
    and the stored one, which the next attempt must resume from."""
    assert f.store is not None
    cp, s3 = f.cp, f.store.filesystem()

    def read() -> StoredRun | None:
        with contextlib.suppress(OSError):
            return read_stored(s3, f.bucket_root)
        return None

    first = read()
    stored: list[StoredRun] = []
    # Checkpoints stored in part before (a head lost mid-round leaves them): not this
    # round's, which must end with its uploads and deletions done.
    cut = {n for n, whole in (first or StoredRun()).checkpoints().items() if not whole}

    def a_round_ended() -> bool:
        now = read()
        if now is None or now.latest is None or (first is not None and now.latest == first.latest):
            return False
        stored.append(now)
        return all(whole or name in cut for name, whole in now.checkpoints().items())

    cp.wait_until(a_round_ended, guard(600), "a new checkpoint stored in the bucket",
                  interval_s=0.25)  # fmt: skip
    kept = stored[-1].latest
    kept_at = iteration_of(kept or "")
    assert kept is not None and kept_at is not None, kept
    hanging: list[str] = []

    def pause_then_read() -> None:
        """The store stopped, then read at once when it is back (before the next attempt,
        which waits for a new head, can write): what it held of the two checkpoints."""
        with f.checker.store_outage():
            f.store.pause(UPLOAD_PAUSE_S)
        held = None
        for _ in range(20):
            if (held := read()) is not None:
                break
            time.sleep(0.5)
        if held is not None and hanging:
            whole, cut = held.checkpoints(), hanging[0]
            f.evidence["held after the hang"] = (
                f"latest={held.latest} {kept}={whole.get(kept)} {cut}={whole.get(cut)}"
            )

    pause = threading.Thread(target=pause_then_read, daemon=True)
    pause.start()
    f.pauses.append(pause)
    # Written from now on (an earlier attempt may have said so of a later checkpoint it
    # never stored).
    said = Counter(written_checkpoints(f.logs.refresh().text))

    def next_written() -> bool:
        new = Counter(written_checkpoints(f.logs.refresh().text)) - said
        hanging[:] = sorted(name for name in new if (iteration_of(name) or 0) > kept_at)
        return bool(hanging)

    # Its upload hangs from its first request on: the head is deleted while the store
    # is still stopped.
    cp.wait_until(next_written, UPLOAD_PAUSE_S * 0.75,
                  f"a checkpoint after {kept} written while the store is stopped",
                  interval_s=0.5)  # fmt: skip
    head = head_pod(cp)
    hit = struck(head, store_down=True, stored_before=kept_at)
    _force_delete(cp, head)
    f.evidence[HEAD_DURING_UPLOAD] = f"{hanging[0]} {kept}"
    return hit


def _over(f: _Faults, hit: Struck, before: LogView) -> bool:
    """The run is over `hit`: an iteration shown since (by the next attempt when it ended
    one; by the supervisor's new pod when it deleted the old), and what the fault leaves
    done is done."""
    cp, view = f.cp, f.logs.refresh()
    new = view.pairs - before.pairs
    if hit.kind in ENDS_THE_ATTEMPT:
        shown = any(attempt > hit.attempt for attempt, _ in new)
    elif hit.kind == SUPERVISOR:
        others = [pairs for pod, pairs in view.pod_pairs.items() if pod != hit.what]
        shown = any(pairs - before.pairs for pairs in others)
    else:
        shown = bool(new)
    if not shown:
        return False
    if hit.kind == STORE:  # the mirror's own word that it stores again
        return "run storage: storing again after " in lines_after(view.text, f.evidence[STORE])
    if hit.kind == OPERATOR:  # back, to make the next head a fault may ask for
        return any(
            running_and_ready(p) and p["metadata"]["uid"] != f.evidence[OPERATOR]
            for p in _operator_pods(cp)
        )
    if hit.kind == NEW_IMAGE:
        f.evidence["head images"] = " ".join(sorted(_head_images(cp)))
        return f.evidence["head images"] == hit.what
    if hit.kind == HEAD_DURING_UPLOAD:  # the store back: the next fault may stop it again
        return not any(pause.is_alive() for pause in f.pauses)
    if hit.kind == WORKER:
        return _worker_replaced_and_sampling(f, view)
    return True


def _worker_replaced_and_sampling(f: _Faults, view: LogView) -> bool:
    """The deleted worker pod (sidecar: its game with it) replaced by a new one, Running
    and Ready, and 2 iterations since with its runner healthy, on the new pod's Ray node."""
    pods = ray_pods(f.cp, "workers")
    new = [p for p in pods if p["metadata"]["uid"] != f.evidence[WORKER] and running_and_ready(p)]
    if len(pods) != 1 or not new:
        return False
    # The iterations the newest supervisor pod's log shows after the first round that
    # saw the new pod Ready (that log only grows; a pod replaced meanwhile starts again).
    pod, log = view.pods[-1] if view.pods else ("", "")
    seen = f"{pod} {len(progress(log))}"
    at, mark = f.evidence.setdefault("worker pod ready at", seen).split()
    if at != pod:
        f.evidence["worker pod ready at"] = seen
        return False
    if sum(1 for p in progress(log)[int(mark) :] if p.runners == (1, 1)) < 2:
        return False
    f.evidence["worker pod after"] = f"{new[0]['metadata']['uid']} {new[0]['status']['podIP']}"
    f.evidence["runner node ips after worker"] = " ".join(_runner_node_ips(f.cp))
    return True


def _assert_held_its_invariants(run: FaultRun) -> None:
    struck = "\n".join(hit.describe() for hit in run.struck)
    assert [hit.kind for hit in run.struck] == [fault.kind for fault in run.schedule.faults]
    # Read all along: a checker that read little proved little.
    assert run.counts.get("store read", 0) >= CHECKER_ROUNDS_AT_LEAST, run.counts
    assert run.counts.get("job API answered", 0) >= CHECKER_ROUNDS_AT_LEAST, run.counts
    # Checked at each change of `latest` the store reported, not only every few seconds.
    assert run.counts.get("latest changes seen", 0) >= CHECKER_ROUNDS_AT_LEAST, run.counts
    assert run.violations == [], (
        "\n".join(map(str, run.violations)) + f"\n{run.schedule.describe()}\n{struck}"
    )


@pytest.fixture(scope="module")
def supervised_run(
    node_control_plane: ControlPlane,
    sidecar_run: SidecarRun,  # its job stopped: the games are free
    submit_endpoints: Path,
    figures: Figures,
    fault_seed: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> FaultRun:
    """A supervised training on the claim under its schedule (its head, the supervisor's
    pod, a worker pod), to its end, then pulled."""
    cp = node_control_plane
    kube = ("--endpoints", str(submit_endpoints), "--kubeconfig", str(cp.kubeconfig))
    schedule = make_schedule(fault_seed, CLAIM_FAULTS, first=(4, 5), gap=(1, 2),
                             salt=SUPERVISED_RUN)  # fmt: skip
    keep = json.loads(submit_endpoints.read_text())["runs"]["keep_checkpoints"]
    run_dir = _claim_dir(cp) / SUPERVISED_RUN
    local = fs.LocalFileSystem()
    job = _submit_supervised(kube, SUPERVISED_RUN, SUPERVISED_ITERATIONS)
    with PortForward(cp, tmp_path_factory.mktemp("supervised-jobs"), 8265) as forward:
        f = _watch(cp, "supervised (claim)", SUPERVISED_RUN, job, schedule, figures, forward,
                   keep=keep, read_store=lambda: read_stored(local, str(run_dir)),
                   claim=True)  # fmt: skip
        f.run_dir = run_dir
        f.changes = lambda on_change: claim_changes(run_dir, on_change)
        run = _through(f, SUPERVISED_ITERATIONS)
    _checkpoint_figures(figures, "supervised (claim)", run.log)
    figures["supervised: head deleted -> next iteration, s"] = run.over_s[run.hit(HEAD).index]
    pulled = tmp_path_factory.mktemp("supervised")
    got = subprocess.run([str(UERL), "runs", "pull", SUPERVISED_RUN, *kube, "--to", str(pulled)],
                         capture_output=True, text=True, timeout=guard(600))  # fmt: skip
    assert got.returncode == 0, got.stderr
    run.pulled = pulled / SUPERVISED_RUN
    return run


def test_a_supervised_run_ends_succeeded_through_its_fault_schedule(
    supervised_run: FaultRun,
) -> None:
    run = supervised_run
    # The Job's end, and no supervisor failed and run again: one pod Succeeded, and the
    # only failed one is the pod the schedule deleted.
    assert run.end_problems == [], "\n".join(run.end_problems) + "\n" + run.log[-6000:]
    assert progress(run.log)[-1].iteration == SUPERVISED_ITERATIONS, run.log[-6000:]
    said = "attempt 2 of run supervised: submitting job uerl-supervised-2 (the Ray head was lost"
    assert said in run.log, run.log[-6000:]


def test_the_claim_run_held_its_invariants_the_whole_time(supervised_run: FaultRun) -> None:
    _assert_held_its_invariants(supervised_run)


def test_the_resumed_run_stored_every_iteration_once_and_lost_at_most_a_checkpoint_interval(
    supervised_run: FaultRun,
) -> None:
    run = supervised_run
    rows = (run.pulled / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(1, SUPERVISED_ITERATIONS + 1))
    # One fault ended an attempt (the head): two attempts; the second waited for the new
    # head's workers (--wait-for-nodes).
    first, second = attempts.read(run.pulled)
    assert (first["attempt"], first["resumed_from"]) == (1, None)
    assert second["attempt"] == 2 and second["reason"].startswith("the Ray head was lost")
    # At most one checkpoint interval of the first attempt's work is done again: against
    # the last iteration it showed right before its head was deleted (the driver may be
    # an iteration past what the log showed, and have stored it).
    lost_after = run.hit(HEAD).lost_after
    assert lost_after - second["iteration"] <= CHECKPOINT_EVERY, (lost_after, second)


def test_the_resumed_run_keeps_improving_from_where_its_head_was_lost(
    supervised_run: FaultRun,
) -> None:
    """Against the return where the run resumed, not its first: a run started over from
    scratch falls back to its first returns (and could still beat those)."""
    returns = returns_by_iteration(supervised_run.pulled)
    resumed = attempts.read(supervised_run.pulled)[1]["iteration"]
    first = returns[min(returns)]
    before = returns[max(i for i in returns if i <= resumed)]
    after = [returns[i] for i in sorted(returns) if i > resumed]
    assert len(after) >= 2, returns
    assert max(after[:2]) >= (first + before) / 2, (first, before, after)  # not back at the start
    assert max(after) >= before, (before, after)  # and on from there


def test_the_next_attempt_removes_a_dead_writers_leftover_from_the_claim(
    supervised_run: FaultRun,
) -> None:
    run = supervised_run
    assert run.run_dir is not None
    planted = Path(run.evidence["leftover"])  # there when the head was deleted
    assert planted.parent == run.run_dir / "checkpoints", planted
    left = sorted(p.relative_to(run.run_dir).as_posix() for p in run.run_dir.rglob("*")
                  if p.name.startswith(PARTIAL_PREFIX))  # fmt: skip
    assert left == [], left


def test_a_deleted_worker_pod_is_replaced_and_its_runner_samples_on_the_new_one(
    supervised_run: FaultRun,
) -> None:
    """The claim schedule's WORKER fault, on the stack shrunk to one worker: the
    schedule waited for the new pod and two healthy iterations after it was Ready."""
    gone = supervised_run.evidence[WORKER]
    uid, ip = supervised_run.evidence["worker pod after"].split()
    assert uid != gone
    assert supervised_run.evidence["runner node ips after worker"] == ip


def test_a_second_writer_of_the_claim_run_is_refused_naming_the_holder(
    supervised_run: FaultRun,
) -> None:
    said = supervised_run.evidence[CONTENDER]
    # Refused by the lease (exit 1: free once the writer ends), not by anything before it;
    # that it wrote nothing is the checker's: one holder per generation, the attempts
    # consecutive, every iteration once.
    assert said.startswith("exit 1: ") and "the run is being written by writer " in said, said
    assert "Traceback" not in said, said


def test_a_deleted_supervisor_pod_is_replaced_by_one_following_the_running_attempt(
    supervised_run: FaultRun,
) -> None:
    hit = supervised_run.hit(SUPERVISOR)
    job = f"uerl-{SUPERVISED_RUN}-{hit.attempt}"
    followed = {"event": "attempt", "attempt": hit.attempt, "job": job, "following": True}
    assert followed in events(supervised_run.log, "attempt"), supervised_run.log[-6000:]


# ---- the same in a bucket: the store killed, the operator, the head, a learner, a new
# ---- image, the head lost while an upload hangs

BUCKET = "runs"
BUCKET_RUN = "bucket"
# Room for its six faults (about 62 iterations at 3 s each, more on a faster host):
# iterations go on while the store is down and until the mirror stores again (about
# 35 s), and while `pulumi up` runs before the pods go.
BUCKET_ITERATIONS = 78
# HEAD: a head lost with the store up, whatever the mirror is doing then (an upload on
# its way is lost with it: the checker's bound on iterations redone is two intervals).
BUCKET_FAULTS = (STORE, OPERATOR, HEAD, LEARNER, NEW_IMAGE, HEAD_DURING_UPLOAD)
RUN_KEYS = "run-keys"


@dataclass
class BucketRun:
    run: FaultRun
    stored: list[str]  # the bucket's keys of the run, at its end
    refused: dict[str, str]  # uerl train's refusals at start, by what was wrong
    planted: str  # LEFTOVER put in the head's staging: the exec's exit status and output


def _ready_head_with(cp: ControlPlane, variable: str) -> bool:
    """A Running and Ready head pod whose Ray container has `variable` in its env."""
    return any(
        running_and_ready(pod)
        and any(e["name"] == variable for e in pod["spec"]["containers"][0].get("env", []))
        for pod in ray_pods(cp, "headgroup")
    )


@pytest.fixture(scope="module")
def object_store() -> Iterator[ObjectStore]:
    """SeaweedFS beside the node, as a team's store beside its cluster: on the address
    the pods reach this machine on."""
    with ObjectStore(buckets=[BUCKET], address=NODE_API_ADDRESS) as store:
        yield store


@pytest.fixture(scope="module")
def bucket_run(
    node_control_plane: ControlPlane,
    node: Node,
    images: dict[str, str],
    project: PulumiProject,
    supervised_run: FaultRun,  # the claim's scenarios first: the claim goes with this
    object_store: ObjectStore,
    figures: Figures,
    fault_seed: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> BucketRun:
    cp, store = node_control_plane, object_store
    keys = store.environment()
    cp.kubectl("create", "secret", "generic", RUN_KEYS, "-n", NAMESPACE,
               *(f"--from-literal={k}={v}" for k, v in keys.items()))  # fmt: skip
    for path, value in (("topology.runs.s3.bucket", BUCKET),
                        ("topology.runs.s3.endpoint", store.endpoint),
                        ("topology.runs.s3.credentials_secret", RUN_KEYS)):  # fmt: skip
        project.config_set("dev", path, value)
    _config_up(project, "topology.runs.store", "s3")
    # KubeRay recreates the Ray pods for the new template after `pulumi up` returns: the
    # head that has the store's keys.
    cp.wait_until(
        lambda: _ready_head_with(cp, "AWS_ACCESS_KEY_ID"), guard(600), "a head with the keys"
    )
    work = tmp_path_factory.mktemp("bucket")
    endpoints = work / "endpoints.json"
    write_json(endpoints, project.outputs("dev")["endpoints"])
    kube = ("--endpoints", str(endpoints), "--kubeconfig", str(cp.kubeconfig))
    # f. A wrong bucket and wrong keys, refused at start by `uerl train` on the head.
    wrong_bucket = json.loads(endpoints.read_text())
    wrong_bucket["runs"]["uri"] = "s3://no-such-runs/uerl-runs"
    attempts_at_start = {
        "bucket": (["sh", "-c", "cat > /tmp/wrong-bucket.json && uerl train --endpoints "
                    "/tmp/wrong-bucket.json --run-name refused --iterations 1"],
                   json.dumps(wrong_bucket)),
        "keys": (["env", "AWS_SECRET_ACCESS_KEY=wrong", "uerl", "train", "--run-name",
                  "refused", "--iterations", "1"], None),
    }  # fmt: skip
    refused = {}
    for what, (command, given) in attempts_at_start.items():
        done = cp.kubectl("exec", "-i", "-n", NAMESPACE, head_pod(cp), "-c", "ray-head", "--",
                          *command, input=given, check=False, timeout_s=guard(300))  # fmt: skip
        refused[what] = f"exit {done.returncode}: {done.stderr.strip()}"
    schedule = make_schedule(fault_seed, BUCKET_FAULTS, first=(2, 3), gap=(1, 2), salt=BUCKET_RUN)
    keep = json.loads(endpoints.read_text())["runs"]["keep_checkpoints"]
    root = f"{BUCKET}/uerl-runs/{BUCKET_RUN}"
    s3 = store.filesystem()
    job = _submit_supervised(kube, BUCKET_RUN, BUCKET_ITERATIONS)
    planted: list[str] = []

    def plant() -> None:  # once the run has written to its staging
        planted.append(_plant_in_staging(cp, BUCKET_RUN))

    with PortForward(cp, tmp_path_factory.mktemp("bucket-jobs"), 8265) as forward:
        f = _watch(cp, "bucket", BUCKET_RUN, job, schedule, figures, forward, keep=keep,
                   read_store=lambda: read_stored(s3, root), claim=False)  # fmt: skip
        f.store, f.bucket_root, f.project, f.node, f.images = store, root, project, node, images
        f.changes = lambda on_change: bucket_changes(store, root, on_change)
        run = _through(f, BUCKET_ITERATIONS, plant)
    _checkpoint_figures(figures, "bucket", run.log)
    figures["bucket: pulumi up (new image) -> next iteration, s"] = run.over_s[
        run.hit(NEW_IMAGE).index
    ]
    got = subprocess.run([str(UERL), "runs", "pull", BUCKET_RUN, *kube, "--to", str(work)],
                         capture_output=True, text=True, timeout=guard(600),
                         env={**os.environ, **keys})  # fmt: skip
    assert got.returncode == 0, got.stderr
    run.pulled = work / BUCKET_RUN
    infos = store.filesystem().get_file_info(fs.FileSelector(root, recursive=True))
    stored = sorted(i.path[len(root) + 1 :] for i in infos if i.type == fs.FileType.File)
    return BucketRun(run, stored, refused, planted[0] if planted else "not planted")


def test_a_bucket_run_ends_succeeded_through_its_fault_schedule(bucket_run: BucketRun) -> None:
    run = bucket_run.run
    assert run.end_problems == [], "\n".join(run.end_problems) + "\n" + run.log[-6000:]
    assert progress(run.log)[-1].iteration == BUCKET_ITERATIONS, run.log[-6000:]
    reasons = [a["reason"] for a in attempts.read(run.pulled)]
    ending = [hit for hit in run.struck if hit.kind in ENDS_THE_ATTEMPT]
    # One attempt more for each fault that ended one, and none else (an attempt the
    # cluster was not ready for would add one: --wait-for-nodes). A learner lost fails
    # the job; a deleted head loses it with the head; the new image's pods do either,
    # whichever KubeRay's Recreate deletes first (seen both ways: the learner's pod first
    # fails the job before the head goes).
    assert len(reasons) == 1 + len(ending), (reasons, run.schedule.describe())
    for attempt, (hit, reason) in enumerate(zip(ending, reasons[1:], strict=True), 2):
        failed, lost = f"job uerl-{BUCKET_RUN}-{attempt - 1} FAILED", "the Ray head was lost"
        # A head replaced gracefully stops its job first (its preStop hook).
        stopped = f"job uerl-{BUCKET_RUN}-{attempt - 1} was stopped by its Ray head's own stop"
        said = {LEARNER: (failed,), NEW_IMAGE: (lost, failed, stopped)}.get(hit.kind, (lost,))
        assert reason.startswith(said), (hit.describe(), reason)
    assert run.evidence["head images"] == run.hit(NEW_IMAGE).what


def test_the_bucket_run_held_its_invariants_the_whole_time(bucket_run: BucketRun) -> None:
    _assert_held_its_invariants(bucket_run.run)


def test_the_bucket_holds_every_iteration_once_and_only_whole_checkpoints(
    bucket_run: BucketRun,
) -> None:
    rows = (bucket_run.run.pulled / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(1, BUCKET_ITERATIONS + 1))
    stored = bucket_run.stored
    names = {k.split("/")[1] for k in stored if k.startswith("checkpoints/checkpoint_")}
    assert names
    for name in names:
        assert f"checkpoints/{name}/uerl.json" in stored, name
    # A write in progress sat in the head's staging (planted, as a dead writer leaves
    # one): the mirror never uploaded it.
    assert bucket_run.planted.startswith("exit 0"), bucket_run.planted
    assert not [k for k in stored if PARTIAL_PREFIX in k], stored


def test_a_head_lost_while_an_upload_hangs_resumes_from_the_checkpoint_stored_whole(
    bucket_run: BucketRun,
) -> None:
    run = bucket_run.run
    hit = run.hit(HEAD_DURING_UPLOAD)
    hanging, kept = run.evidence[HEAD_DURING_UPLOAD].split()
    assert (iteration_of(hanging) or 0) > (iteration_of(kept) or 0)
    # The bucket read as soon as it was back, before a new head could write: `latest`
    # still named the checkpoint stored before the hang, whole, and the one whose upload
    # hung was not whole there (absent: None, or in part: False).
    held = run.evidence.get("held after the hang", "unread")
    assert held in (f"latest={kept} {kept}=True {hanging}=None",
                    f"latest={kept} {kept}=True {hanging}=False"), held  # fmt: skip
    ending = [h for h in run.struck if h.kind in ENDS_THE_ATTEMPT]
    after = attempts.read(run.pulled)[ending.index(hit) + 1]
    # The checkpoint whose upload hung never was whole in the bucket: the next attempt
    # took the one stored before it, as `latest` named it.
    assert (after["resumed_from"], after["iteration"]) == (kept, hit.stored_before), after


def test_the_store_killed_and_started_again_is_said_by_the_mirror_while_training_goes_on(
    bucket_run: BucketRun,
) -> None:
    run = bucket_run.run
    after = lines_after(run.log, run.evidence[STORE])
    stopped = after.find(f"run storage: cannot store in s3://{BUCKET}/uerl-runs/{BUCKET_RUN} (")
    assert stopped >= 0, after[:6000]
    back = after.find("run storage: storing again after ", stopped)
    assert back > stopped, after[:6000]
    # Iterations between the two: training went on while nothing could be stored.
    assert progress(after[stopped:back]), after[stopped:back]


def test_a_wrong_bucket_and_wrong_keys_are_refused_at_start_naming_the_field(
    bucket_run: BucketRun,
) -> None:
    bucket, keys = bucket_run.refused["bucket"], bucket_run.refused["keys"]
    assert bucket.startswith("exit 2: ") and "runs.s3.bucket: bucket 'no-such-runs'" in bucket
    assert keys.startswith("exit 2: ") and "runs.s3.credentials_secret:" in keys
    assert "Traceback" not in bucket + keys


# ---- e. NetworkPolicies --------------------------------------------------------------


@pytest.fixture(scope="module")
def outsider(node_control_plane: ControlPlane, images: dict[str, str], dev_stack: Up) -> str:
    """A pod outside the stack (its own namespace), with Python to probe from."""
    cp = node_control_plane
    cp.kubectl("create", "namespace", OUTSIDER_NS)
    cp.apply([{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "outsider", "namespace": OUTSIDER_NS},
        "spec": {"containers": [{"name": "main", "image": images["ray"],
                                 "imagePullPolicy": "Never", "command": ["sleep", "infinity"]}],
                 "terminationGracePeriodSeconds": 1},
    }])  # fmt: skip
    cp.kubectl("wait", "-n", OUTSIDER_NS, "--for=condition=Ready",
               f"--timeout={guard(180):.0f}s", "pod/outsider")  # fmt: skip
    return "outsider"


@pytest.mark.parametrize("port", [6379, 8265, 10001])
def test_a_pod_outside_the_stack_cannot_reach_the_heads_port(
    node_control_plane: ControlPlane, outsider: str, port: int
) -> None:
    cp = node_control_plane
    head = head_pod(cp)
    address = pod_ip(cp, NAMESPACE, head)
    worker = ray_pods(cp, "workers")[0]["metadata"]["name"]
    assert connects(cp, NAMESPACE, worker, address, port)  # the stack's own pods do
    assert not connects(cp, OUTSIDER_NS, outsider, address, port)


# ---- f, e, d. networked games over TLS, running a packaged build from the volume ------

NETWORKED_JOB = "uerl-pods-networked"
NETWORKED_RUN_DIR = "/home/ray/runs/networked"
GAME = f"{CLUSTER}-ue-1"  # the one game (discovery reuses it: `simulator.discovery worker1`)
GAME_HOST = f"{GAME}.{CLUSTER}-ue.{NAMESPACE}.svc.cluster.local"


@dataclass
class Networked:
    up: Result
    tls_dir: Path
    loader_log: str


@pytest.fixture(scope="module")
def networked(
    node_control_plane: ControlPlane,
    project: PulumiProject,
    images: dict[str, str],
    sidecar_run: SidecarRun,
    tmp_path_factory: pytest.TempPathFactory,
    figures: Figures,
) -> Networked:
    """The dev stack switched to networked games (one, behind its forwarder), TLS with
    client certificates, and `simulator.kind unreal`: the fake packaged build, served in
    the cluster, unpacked into the ReadWriteMany volume by the loader Job."""
    cp = node_control_plane
    # The volume the claim binds (controlplane.py's `uerl-test-rwx`, a hostPath on this
    # node), open to the loader's user as an NFS export for games would be.
    rwx = cp.workdir / "rwx-volume"
    rwx.mkdir(exist_ok=True)
    rwx.chmod(0o777)
    url = GameFiles(cp, images["mock-ue"]).deploy()

    tls_dir = tmp_path_factory.mktemp("tls")
    made = subprocess.run(
        [str(UERL), "tls-secret", "--stack", "dev", "--set", "topology.pattern=networked",
         "--out", str(tls_dir)],
        cwd=project.dir, capture_output=True, text=True, timeout=guard(300),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    cp.kubectl(
        "create",
        "secret",
        "generic",
        TLS_SECRET,
        "-n",
        NAMESPACE,
        *(f"--from-file={tls_dir / name}" for name in ("ca.crt", "tls.crt", "tls.key")),
    )

    for path, value in {
        "topology.pattern": "networked",
        "topology.simulator.discovery": "worker1",
        "topology.simulator.kind": "unreal",
        "topology.simulator.image": images_build.topology_refs()[1],
        "topology.simulator.tls.secret": TLS_SECRET,
        "topology.simulator.tls.mutual": "true",
        "topology.executables.source_url": url,
        "topology.executables.size": "1Gi",
    }.items():
        project.config_set("dev", path, value, plaintext=path.endswith(".secret"))
    old = {p["metadata"]["uid"] for p in ray_pods(cp)}
    up = project.up("dev", "--skip-preview", timeout_s=guard(900))
    figures["pulumi_up_switch_to_networked_s"] = round(up.seconds, 1)

    # A pod-template change: `up` returns once the RayCluster is updated, its conditions
    # still those of the old pods; KubeRay's Recreate then replaces every Ray pod.
    def recreated() -> bool:
        pods = ray_pods(cp)
        groups = sorted(p["metadata"]["labels"]["ray.io/group"] for p in pods)
        return groups == ["headgroup", "learners", "workers"] and all(
            p["metadata"]["uid"] not in old and running_and_ready(p) for p in pods
        )

    # About 40 s honest; a Recreate took over 180 s at load 8 (test_pulumi_up.py).
    cp.wait_until(recreated, guard(600), "the Ray pods recreated, Running and Ready")
    loader = cp.kubectl("logs", "-n", NAMESPACE, f"job/{CLUSTER}-ue-loader").stdout
    return Networked(up, tls_dir, loader)


def test_the_loader_job_unpacks_the_build_served_in_the_cluster(networked: Networked) -> None:
    assert "unpacked http://files." in networked.loader_log, networked.loader_log


def test_the_game_runs_the_build_from_the_volume_as_a_non_root_user(
    node_control_plane: ControlPlane, networked: Networked
) -> None:
    cp = node_control_plane
    log = cp.kubectl("logs", "-n", NAMESPACE, GAME, "-c", "ue").stdout
    assert (
        "FakeGame from /opt/ue/FakeGame/Binaries/Linux/FakeGame-Linux-Shipping as uid 1000" in log
    ), log
    listing = cp.kubectl(
        "exec", "-n", NAMESPACE, GAME, "-c", "ue", "--", "ls", "-ln", "/opt/ue/Game.sh",
        "/opt/ue/FakeGame/Binaries/Linux/FakeGame-Linux-Shipping",
    ).stdout  # fmt: skip
    # The zip had no execute bits (made on Windows): the loader gave them back.
    assert all(line.startswith("-rwxr-xr-x") for line in listing.splitlines()), listing


@dataclass
class NetworkedRun:
    logs: dict[str, str] = field(default_factory=dict)
    game_uids: tuple[str, str] = ("", "")


@pytest.fixture(scope="module")
def networked_run(
    node_control_plane: ControlPlane, networked: Networked, jobs: RayJobs
) -> NetworkedRun:
    """A job on the networked games; the game's pod deleted while it trains."""
    cp = node_control_plane
    run = NetworkedRun()
    jobs.submit(NETWORKED_JOB, ["uerl", "train", "--run-dir", NETWORKED_RUN_DIR,
                                "--iterations", "1000", *TRAIN_ARGS])  # fmt: skip
    run.logs["start"] = jobs.wait_for(
        NETWORKED_JOB, lambda log: len(progress(log)) >= 3, "3 iterations", guard(900)
    )
    before = cp.get_json("pod", "-n", NAMESPACE, GAME)["metadata"]["uid"]
    cp.kubectl("delete", "pod", "-n", NAMESPACE, GAME, "--wait=false")

    def back(log: str) -> bool:
        # The fault seen by the runner (its game failed), then the runner back on the new
        # pod (the old one is gone), then healthy iterations after that: not iterations
        # from before the pod died.
        after_fault = log[m.end() :] if (m := RUNNER_FAULT.search(log)) else ""
        after_back = after_fault[m.end() :] if (m := RUNNER_BACK.search(after_fault)) else ""
        return sum(1 for p in progress(after_back) if p.runners == (1, 1)) >= 2

    run.logs["game_deleted"] = jobs.wait_for(
        NETWORKED_JOB, back, "iterations with the runner back on the new game pod", guard(600)
    )
    after = cp.get_json("pod", "-n", NAMESPACE, GAME)["metadata"]["uid"]
    run.game_uids = (before, after)
    stopped = jobs.cli("stop", NETWORKED_JOB, timeout_s=JOB_STOP_GRACE_S + guard(180))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    run.logs["end"] = jobs.logs(NETWORKED_JOB)
    print(f"--- the networked job's log ---\n{run.logs['end']}")
    return run


def test_the_networked_job_trains_over_tls(networked_run: NetworkedRun) -> None:
    log = networked_run.logs["start"]
    assert "preflight ok" in log
    assert progress(log)[-1].runners == (1, 1)


def test_a_deleted_game_pod_comes_back_and_its_runner_rejoins(
    networked_run: NetworkedRun,
) -> None:
    before, after = networked_run.game_uids
    assert before != after  # the StatefulSet made a new pod under the same name
    later = lines_after(
        networked_run.logs["game_deleted"], progress(networked_run.logs["start"])[-1].line
    )
    fault = RUNNER_FAULT.search(later)
    assert fault is not None, later  # the runner saw its game go
    rest = later[fault.end() :]
    rejoined = RUNNER_BACK.search(rest)
    assert rejoined is not None, later  # and come back
    assert sum(1 for p in progress(rest[rejoined.end() :]) if p.runners == (1, 1)) >= 2, later


# The probes after the job (a game serves one client at a time; the job holds it while
# it trains): TLS only with a client certificate, and no way in from outside the stack.


def test_a_networked_game_answers_only_over_tls_with_a_client_certificate(
    node_control_plane: ControlPlane, networked_run: NetworkedRun
) -> None:
    cp = node_control_plane
    head = head_pod(cp)
    endpoint = f"{GAME_HOST}:50051"
    certs = "/etc/uerl-game-tls"

    def discover(*tls: str, timeout_s: int = 10) -> subprocess.CompletedProcess[str]:
        argv = ["uerl", "discover", endpoint, "--timeout", str(timeout_s), *tls]
        limit = timeout_s + guard(180)
        return cp.kubectl("exec", "-n", NAMESPACE, head, "--", *argv, check=False, timeout_s=limit)

    # The game may still be closing the stopped job's session: room to answer.
    mutual = discover("--tls-ca", f"{certs}/ca.crt", "--tls-cert", f"{certs}/tls.crt",
                      "--tls-key", f"{certs}/tls.key", timeout_s=round(guard(90)))  # fmt: skip
    assert mutual.returncode == 0 and "agent" in mutual.stdout, mutual.stdout + mutual.stderr
    # The refusals docs/security.md promises, each one line naming the game.
    plaintext = discover()
    assert plaintext.returncode != 0
    assert "(it serves TLS and this client connects without: give it the game's CA)" in (
        plaintext.stdout + plaintext.stderr
    ), plaintext.stdout + plaintext.stderr
    ca_only = discover("--tls-ca", f"{certs}/ca.crt")
    assert ca_only.returncode != 0
    assert (
        "it requires a client certificate (mutual TLS), and none was given"
        in ca_only.stdout + ca_only.stderr
    ), ca_only.stdout + ca_only.stderr


def test_a_pod_outside_the_stack_cannot_reach_a_game(
    node_control_plane: ControlPlane, networked_run: NetworkedRun, outsider: str
) -> None:
    cp = node_control_plane
    address = pod_ip(cp, NAMESPACE, GAME)
    worker = ray_pods(cp, "workers")[0]["metadata"]["name"]
    assert connects(cp, NAMESPACE, worker, address, 50051)
    assert not connects(cp, OUTSIDER_NS, outsider, address, 50051)


# ---- h. `pulumi destroy` ------------------------------------------------------------


def test_destroy_leaves_no_pod_container_or_sandbox_of_the_stack(
    node_control_plane: ControlPlane,
    node: Node,
    project: PulumiProject,
    networked_run: NetworkedRun,
) -> None:
    cp = node_control_plane
    cp.kubectl("delete", "namespace", OUTSIDER_NS, "uerl-files", prometheus_pod.NAMESPACE,
               "--wait=true", "--ignore-not-found", timeout_s=guard(300))  # fmt: skip
    project.run("destroy", "--yes", "--skip-preview", stack="dev", timeout_s=guard(900))
    cp.wait_until(
        lambda: cp.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0,
        guard(300), f"namespace {NAMESPACE} gone",
    )  # fmt: skip
    assert cp.get_json("pods", "-A")["items"] == []

    def node_empty() -> bool:
        tasks = node.ctr("-n", "k8s.io", "tasks", "list", "-q").split()
        containers = node.ctr("-n", "k8s.io", "containers", "list", "-q").split()
        return not tasks and not containers

    cp.wait_until(node_empty, guard(180), "no container or sandbox left in containerd")


# ---- i. a game as an image (docker/unreal-game.Dockerfile) -----------------------------

GAME_IMAGE_NS = "uerl-game-image"


def test_the_game_image_runs_its_build_as_a_pod_passing_its_grpc_probe(
    node_control_plane: ControlPlane, images: dict[str, str], dev_stack: Up
) -> None:
    """The image build.py bakes around the fake packaged build, as a networked game pod
    of a stack with `executables.in_image` (no volume) and `simulator.probe: grpc`: the
    pod the manifests build, in a namespace enforcing `restricted`, on the node the stack
    left (after its destroy)."""
    from infra import manifests
    from infra.topology import Topology

    cp = node_control_plane
    topology = Topology.parse({
        "name": "img", "namespace": GAME_IMAGE_NS, "pattern": "networked",
        "simulator": {"kind": "unreal", "image": images["unreal-game"], "probe": "grpc",
                      "forwarder_image": images["mock-ue"], "cpus": 0.2, "memory": "512Mi"},
        "executables": {"in_image": True},
    })  # fmt: skip
    objects = manifests.build(topology).objects()
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    [games] = [o for o in objects if o["kind"] == "StatefulSet"]
    template = games["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "game", "namespace": GAME_IMAGE_NS,
                        "labels": template["metadata"]["labels"]},
           "spec": template["spec"]}  # fmt: skip
    cp.apply([namespace, pod])
    try:
        cp.kubectl("wait", "-n", GAME_IMAGE_NS, "--for=condition=Ready",
                   f"--timeout={guard(240):.0f}s", "pod/game", timeout_s=guard(300))  # fmt: skip
        ran = cp.get_json("pod", "-n", GAME_IMAGE_NS, "game")
        [game] = [c for c in ran["spec"]["containers"] if c["name"] == "ue"]
        assert game["readinessProbe"]["exec"]["command"][0] == "schola-probe"
        assert not ran["spec"].get("volumes", []) or all(
            "persistentVolumeClaim" not in v for v in ran["spec"]["volumes"]
        )
        log = cp.kubectl("logs", "-n", GAME_IMAGE_NS, "game", "-c", "ue").stdout
        ran_from = "/opt/ue/FakeGame/Binaries/Linux/FakeGame-Linux-Shipping"
        assert f"FakeGame from {ran_from} as uid 1000" in log, log

        def probe(target: str) -> subprocess.CompletedProcess[str]:
            return cp.kubectl("exec", "-n", GAME_IMAGE_NS, "game", "-c", "ue", "--",
                              "schola-probe", target, "10", check=False)  # fmt: skip

        # The game, behind its forwarder; 10 s: an answer, not a speed (a refusal is at once).
        assert probe("127.0.0.1:50052").returncode == 0
        refused = probe("127.0.0.1:1")
        assert refused.returncode == 1 and "UNAVAILABLE" in refused.stderr, refused.stderr
    finally:
        cp.kubectl("delete", "namespace", GAME_IMAGE_NS, "--wait=true", timeout_s=guard(300))
