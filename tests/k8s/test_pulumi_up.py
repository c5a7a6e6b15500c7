"""`pulumi up` for real: the Pulumi CLI, its Python language host and the Kubernetes
provider run uerl's program (infra/, Pulumi.yaml, the dev stack's config) against the
tier's kube-apiserver and the real KubeRay operator, pods simulated by KWOK.

Each test checks the live cluster and Pulumi's own view (its outputs, its state, what
its preview would do). The tests share one control plane and run in file order: the
`dev` stack is created by the first and destroyed by the last but one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import KUBERAY_CHART_DIR, KUBERAY_CRD_NAMES, KUBERAY_CRDS_DIR, ControlPlane
from host_speed import guard
from pulumi_project import PulumiProject
from stacks import chart_runs_operator, running_and_ready

from infra.topology import RUNS_MOUNT_PATH, RaySpec

# Each scenario runs several real `pulumi` commands of one to two minutes each here, and
# waits for KubeRay's Recreate (over 180 s at load 8): room for two of each, loaded, beside
# one hung wait (each inner wait stays below this). Scaled here: tests/conftest.py scales
# the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(guard(2700))]

UERL = Path(sys.executable).parent / "uerl"
NAMESPACE = "uerl"  # the dev stack's (topology defaults)
CLUSTER = "uerl"
OPERATOR_RELEASE = "kuberay-operator"
STACK_SELECTOR = f"app.kubernetes.io/instance in ({CLUSTER},{OPERATOR_RELEASE})"
DEV_CLAIM = f"{CLUSTER}-runs"  # the dev stack's runs claim, which destroy keeps


@pytest.fixture(scope="module")
def project(
    bare_control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PulumiProject]:
    yield PulumiProject(tmp_path_factory.mktemp("pulumi"), bare_control_plane.kubeconfig)


def operator_follows_chart(cp: ControlPlane) -> Callable[[], None]:
    return chart_runs_operator(cp, NAMESPACE, OPERATOR_RELEASE)


def up(project: PulumiProject, cp: ControlPlane, stack: str = "dev", **kwargs: Any) -> Any:
    """`pulumi up --yes --skip-preview` (the first scenario runs the preview too)."""
    return project.up(stack, "--skip-preview", during=operator_follows_chart(cp), **kwargs)


def ray_pods(cp: ControlPlane, name: str = CLUSTER, ns: str = NAMESPACE) -> list[dict[str, Any]]:
    return cp.get_json("pods", "-n", ns, "-l", f"ray.io/cluster={name}")["items"]


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def groups_ready(pods: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in pods:
        if running_and_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
            group = pod["metadata"]["labels"]["ray.io/group"]
            out[group] = out.get(group, 0) + 1
    return out


def recreated_as(cp: ControlPlane, check: Callable[[list[dict[str, Any]]], bool]) -> None:
    """After a pod-template change `up` returns once the RayCluster is updated and
    ready; KubeRay's Recreate then replaces the pods. Wait (bounded) until the Ray
    pods pass `check`, every group back to its size, all Running and Ready."""
    sizes = {"headgroup": 1, "learners": 1}

    def done() -> bool:
        pods = [p for p in ray_pods(cp) if not p["metadata"].get("deletionTimestamp")]
        want = sizes | {"workers": raycluster(cp)["spec"]["workerGroupSpecs"][1]["replicas"]}
        return bool(pods) and check(pods) and groups_ready(pods) == want

    # A hang guard: at load ~8 a Recreate took over 180 s.
    cp.wait_until(done, guard(720), "the Ray pods recreated, every one Running and Ready")


def raycluster(cp: ControlPlane, name: str = CLUSTER, ns: str = NAMESPACE) -> dict[str, Any]:
    return dict(cp.get_json("raycluster", "-n", ns, name))


def spec_identity(obj: dict[str, Any]) -> tuple[str, int, Any]:
    """What only a spec change moves: uid, generation and the spec itself (not status)."""
    return obj["metadata"]["uid"], obj["metadata"]["generation"], obj["spec"]


def configmap_endpoints(cp: ControlPlane, name: str = CLUSTER, ns: str = NAMESPACE) -> Any:
    data = cp.get_json("configmap", "-n", ns, f"{name}-endpoints")["data"]
    return json.loads(data["endpoints.json"])


def rendered(project: PulumiProject, stack: str = "dev") -> list[dict[str, Any]]:
    """`uerl render --stack STACK` in the project directory: the same config Pulumi reads."""
    out = subprocess.run(
        [str(UERL), "render", "--stack", stack],
        cwd=project.dir, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def changed_steps(preview: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The preview's steps that are not `same`, keyed by resource name."""
    return {
        step["urn"].rsplit("::", 1)[1]: step
        for step in preview.get("steps", [])
        if step["op"] != "same"
    }


def stack_objects(cp: ControlPlane, selector: str = STACK_SELECTOR) -> list[str]:
    """Every object of the dev stack and its operator release (or of `selector`), of
    every listable kind."""
    kinds = cp.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    out = cp.kubectl(
        "get", ",".join(kinds), "-A", "-l", selector, "-o", "name", "--ignore-not-found"
    ).stdout  # fmt: skip
    return sorted(line for line in out.splitlines() if line)


# ---- 1. a new stack ---------------------------------------------------------------


def test_up_creates_the_stack_and_returns_once_the_raycluster_is_ready(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    assert not cp.crds_established()  # the chart brings them
    project.new_stack("dev", {"topology.operator.chart_path": str(KUBERAY_CHART_DIR)})

    result = project.up("dev", during=operator_follows_chart(cp))  # with its preview

    # `up` waited: the RayCluster is ready the moment it returns, every Ray pod up.
    assert raycluster(cp)["status"]["state"] == "ready", result.output
    assert groups_ready(ray_pods(cp)) == {"headgroup": 1, "learners": 1, "workers": 2}
    assert cp.crds_established()
    types = {r["type"] for r in project.resources("dev")}
    # The CRDs are one resource that diffs a digest (infra/components/crds_component.py).
    assert "pulumi-python:dynamic/uerl:KubeRayCRDs" in types
    assert "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition" not in types
    assert "kubernetes:ray.io/v1:RayCluster" in types
    managers = {
        m["manager"]
        for m in cp.get_json("crd", "rayclusters.ray.io", "--show-managed-fields")["metadata"][
            "managedFields"
        ]
    }
    assert managers == {"uerl", "kube-apiserver"}, managers
    print(f"pulumi up of the dev stack: {result.seconds:.1f}s")


def test_the_endpoints_output_is_the_heads_configmap_and_what_uerl_render_prints(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    output = project.outputs("dev")["endpoints"]
    assert output == configmap_endpoints(bare_control_plane)
    configmap = next(o for o in rendered(project) if o["kind"] == "ConfigMap")
    assert output == json.loads(configmap["data"]["endpoints.json"])
    assert output["num_env_runners"] == 2 and output["pattern"] == "sidecar"


def test_preview_and_refresh_find_no_changes_right_after_up(project: PulumiProject) -> None:
    preview = project.run("preview", "--expect-no-changes", stack="dev")
    refresh = project.run("refresh", "--yes", "--expect-no-changes", stack="dev")
    print(f"no-change preview {preview.seconds:.1f}s, refresh {refresh.seconds:.1f}s")


# ---- 2. rescale ----------------------------------------------------------------------


def test_a_rescale_updates_only_the_worker_count_and_keeps_the_pods(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    before = uids(ray_pods(cp))
    project.config_set("dev", "topology.workers.replicas", "3")

    steps = changed_steps(project.preview_json("dev"))
    assert {name: step["op"] for name, step in steps.items()} == {
        CLUSTER: "update",
        f"{CLUSTER}-endpoints": "update",
    }
    cluster_diff = set(steps[CLUSTER].get("detailedDiff") or {})
    workers = "spec.workerGroupSpecs[1]."  # [0] is the learners
    assert cluster_diff, steps[CLUSTER]
    assert all(k.startswith(workers) and k.lower().endswith("replicas") for k in cluster_diff)
    endpoints_diff = set(steps[f"{CLUSTER}-endpoints"].get("detailedDiff") or {})
    assert endpoints_diff <= {"data", 'data["endpoints.json"]'}, endpoints_diff

    up(project, cp)
    after = ray_pods(cp)
    assert before < uids(after)  # every pod kept, one added
    assert groups_ready(after) == {"headgroup": 1, "learners": 1, "workers": 3}
    assert project.outputs("dev")["endpoints"]["num_env_runners"] == 3
    assert configmap_endpoints(cp)["num_env_runners"] == 3


# ---- 3. pattern switch -----------------------------------------------------------------


def test_switching_to_networked_and_back_recreates_the_pods_and_the_games(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    sidecar_pods = uids(ray_pods(cp))
    game_set = f"{CLUSTER}-ue"

    project.config_set("dev", "topology.pattern", "networked")
    up(project, cp)
    recreated_as(cp, lambda pods: not uids(pods) & sidecar_pods)
    networked = ray_pods(cp)
    statefulset = cp.get_json("statefulset", "-n", NAMESPACE, game_set)
    games = project.outputs("dev")["endpoints"]["num_env_runners"] + 1  # + discovery
    assert statefulset["status"].get("readyReplicas") == statefulset["spec"]["replicas"] == games
    assert cp.get_json("service", "-n", NAMESPACE, game_set)["spec"]["clusterIP"] == "None"
    endpoints = project.outputs("dev")["endpoints"]
    assert endpoints == configmap_endpoints(cp)
    assert endpoints["pattern"] == "networked"
    assert endpoints["worker_url_template"].startswith(f"{game_set}-{{worker_index}}.{game_set}.")

    project.config_set("dev", "topology.pattern", "sidecar")
    up(project, cp)
    recreated_as(cp, lambda pods: not uids(pods) & uids(networked))
    for kind in ("statefulset", "service"):
        gone = cp.kubectl("get", kind, "-n", NAMESPACE, game_set, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert (
        cp.get_json("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={game_set}")["items"]
        == []
    )
    assert project.outputs("dev")["endpoints"]["pattern"] == "sidecar"
    assert configmap_endpoints(cp)["worker_url_template"] == "localhost"


# ---- 4. a new Ray image -----------------------------------------------------------------


def test_a_new_ray_image_recreates_every_ray_pod(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    before = ray_pods(cp)
    project.config_set("dev", "topology.ray.image", "uerl/ray:next")
    up(project, cp)
    recreated_as(
        cp,
        lambda pods: (
            not uids(pods) & uids(before)
            and {p["spec"]["containers"][0]["image"] for p in pods} == {"uerl/ray:next"}
        ),
    )


# ---- 7. two stacks in one namespace ---------------------------------------------------------


def test_two_stacks_share_a_namespace_and_destroying_one_leaves_the_other(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane

    def dev_state() -> dict[str, Any]:
        """Every object of the dev stack by what only a spec change moves (the
        operator keeps writing status, so resourceVersion is no measure)."""
        kinds = "raycluster,configmap,pods,services"
        items = cp.get_json(kinds, "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={CLUSTER}")
        return {
            f"{o['kind']}/{o['metadata']['name']}": (
                o["metadata"]["uid"], o["metadata"].get("generation"), o.get("spec"), o.get("data")
            )
            for o in items["items"]
        }  # fmt: skip

    before = dev_state()
    assert any(key.startswith("RayCluster/") for key in before), before
    project.new_stack(
        "second",
        {
            "topology.name": "second",
            "topology.namespace": NAMESPACE,
            "topology.create_namespace": "false",  # the dev stack's
            "topology.operator.install": "false",  # the dev stack's operator serves both
            "topology.simulator.kind": "mock",
            "topology.workers.replicas": "1",
        },
    )
    up(project, cp, "second")
    assert groups_ready(ray_pods(cp, "second")) == {"headgroup": 1, "learners": 1, "workers": 1}
    assert project.outputs("second")["endpoints"]["cluster_name"] == "second"
    assert configmap_endpoints(cp, "second") == project.outputs("second")["endpoints"]

    project.run("destroy", "--yes", stack="second", during=operator_follows_chart(cp))
    names = [o["metadata"]["name"] for o in cp.get_json("raycluster", "-n", NAMESPACE)["items"]]
    assert names == [CLUSTER]
    cp.wait_until(
        lambda: not cp.get_json("pods", "-n", NAMESPACE, "-l", "ray.io/cluster=second")["items"],
        guard(180),
        "the second stack's pods to be gone",
    )
    leftover = cp.get_json("all", "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=second")
    assert leftover["items"] == []
    assert dev_state() == before  # not one object of the dev stack touched
    assert project.resources("second") == []
    project.run("stack", "rm", "--yes", stack="second")
    project.run("preview", "--expect-no-changes", stack="dev")


# ---- 8. bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "topology.workers.replicas",
            "-1",
            "topology.workers.replicas: Input should be greater than or equal to 0",
        ),
        (
            "topology.workers.replicas",
            "many",
            "topology.workers.replicas: Input should be a valid integer",
        ),
        (
            "topology.workers.replica",
            "3",
            "topology.workers.replica: unknown key (did you mean replicas?)",
        ),
    ],
)
def test_bad_config_fails_preview_with_one_line_naming_the_field_and_changes_nothing(
    project: PulumiProject, bare_control_plane: ControlPlane, path: str, value: str, message: str
) -> None:
    cp = bare_control_plane
    # The operator keeps writing status (and so resourceVersion); generation moves only
    # when someone changes the spec, which is what a failed preview/up must not do.
    before = spec_identity(raycluster(cp))
    stack_file = project.dir / "Pulumi.dev.yaml"
    original = stack_file.read_text()
    project.config_set("dev", path, value)
    try:
        result = project.run("preview", stack="dev", check=False)
        assert result.returncode != 0
        assert message in result.output
        assert "Traceback" not in result.output and "pydantic" not in result.output
        up_result = project.run("up", "--yes", stack="dev", check=False)
        assert up_result.returncode != 0 and message in up_result.output
    finally:
        stack_file.write_text(original)
    assert spec_identity(raycluster(cp)) == before
    project.run("preview", "--expect-no-changes", stack="dev")


# ---- 9. a head that can never be ready ------------------------------------------------------


def test_up_fails_within_the_timeout_naming_the_raycluster_whose_head_never_gets_ready(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    project.new_stack(
        "stuck",
        {
            "topology.name": "stuck",
            "topology.namespace": "uerl-stuck",
            "topology.operator.install": "false",  # the dev stack's operator
            "topology.simulator.kind": "mock",
            "topology.pattern": "networked",
            "topology.ray.head.cpus": "1000",  # no node has that
            "topology.image_pull_timeout_s": "0",
            "topology.ray.start_timeout_s": "20",
        },
    )
    start = time.monotonic()
    result = up(project, cp, "stuck", check=False)
    elapsed = time.monotonic() - start
    print(f"figure pulumi up of a head never ready -> failed, s: {elapsed:.0f}")
    assert result.returncode != 0, result.output
    assert "kubernetes:ray.io/v1:RayCluster" in result.output, result.output
    # The provider's await names the resource by URN, ending in its type and name.
    assert "ray.io/v1:RayCluster::stuck" in result.output, result.output
    assert "timed out waiting for the condition" in result.output, result.output
    # Its own 20 s, not the default's 300 s (plus the image pull allowance): the rest of
    # the `up` (one to two minutes loaded) is a matter of the host's speed, not asserted.
    assert elapsed < RaySpec.model_fields["start_timeout_s"].default, f"{elapsed:.0f}s"
    head = cp.get_json("pods", "-n", "uerl-stuck", "-l", "ray.io/node-type=head")["items"]
    assert head and head[0]["status"]["phase"] == "Pending"
    project.run("destroy", "--yes", stack="stuck", during=operator_follows_chart(cp))
    project.run("stack", "rm", "--yes", stack="stuck")
    # What the destroy kept (the runs claim, in its namespace): gone for good.
    cp.kubectl("delete", "namespace", "uerl-stuck", "--wait=true", timeout_s=guard(180))


# ---- 10. destroy keeps the runs claim ------------------------------------------------------

KEEP = "keep"  # the stack and its topology.name
KEEP_NS = "uerl-keep"
KEEP_CLAIM = f"{KEEP}-runs"
KEEP_SELECTOR = f"app.kubernetes.io/instance={KEEP}"
KEEP_CLASS = "uerl-test-delete"  # no other volume or claim has it: the claim binds KEEP_PV
KEEP_PV = "uerl-test-keep"
CLAIM_TYPE = "kubernetes:core/v1:PersistentVolumeClaim"
OLD_RUN = "old-run"
OLD_CHECKPOINT = "checkpoint_000003"
# kube-controller-manager always has the in-tree hostPath deleter (the flag
# --enable-hostpath-provisioner only turns on provisioning): for a released volume with
# reclaim policy Delete it removes the directory if its path matches this (unanchored,
# pkg/volume/hostpath, v1.36), then deletes the PV; any other path: the PV goes Failed.
HOSTPATH_DELETER_PATHS = re.compile("/tmp/.+")


def keep_volume_dir(cp: ControlPlane) -> Path:
    return cp.workdir / "keep-volume"


def create_delete_volume(cp: ControlPlane) -> Path:
    """A volume as a cloud's default storage class leaves one: reclaim policy Delete. A
    hostPath on this machine (the control plane's work directory, under /tmp unless
    TMPDIR says otherwise), in a storage class of its own, not the default."""
    path = keep_volume_dir(cp)
    path.mkdir()
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": KEEP_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": KEEP_PV},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": KEEP_CLASS,
            "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": str(path)},
        },
    }
    cp.apply([storage_class, volume])
    return path


def store_old_run(root: Path) -> None:
    """What a stored run leaves on the claim: its metrics and a checkpoint `latest` names."""
    checkpoints = root / OLD_RUN / "checkpoints"
    (checkpoints / OLD_CHECKPOINT).mkdir(parents=True)
    meta = {"iteration": 3, "env_steps_total": 1200}
    (checkpoints / OLD_CHECKPOINT / "uerl.json").write_text(json.dumps(meta))
    (checkpoints / "latest").write_text(f"{OLD_CHECKPOINT}\n")
    (root / OLD_RUN / "metrics.csv").write_text("iteration,episode_return_mean\n1,0.5\n3,0.9\n")


def old_run_there(root: Path) -> bool:
    metrics = root / OLD_RUN / "metrics.csv"
    return metrics.is_file() and metrics.read_text().endswith("3,0.9\n")


def get_or_none(cp: ControlPlane, *args: str) -> dict[str, Any] | None:
    result = cp.kubectl("get", *args, "-o", "json", check=False)
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    return dict(json.loads(result.stdout))


def keep_claim(cp: ControlPlane) -> dict[str, Any] | None:
    return get_or_none(cp, "pvc", "-n", KEEP_NS, KEEP_CLAIM)


def keep_volume(cp: ControlPlane) -> dict[str, Any] | None:
    return get_or_none(cp, "pv", KEEP_PV)


def phase(obj: dict[str, Any] | None) -> str | None:
    return None if obj is None else obj.get("status", {}).get("phase")


def claim_in_state(project: PulumiProject) -> dict[str, Any]:
    (claim,) = [r for r in project.resources(KEEP) if r["type"] == CLAIM_TYPE]
    return claim


def remove_the_keep_stack(project: PulumiProject, cp: ControlPlane) -> None:
    """Whatever the keep tests left, from any point of failure: the module's later tests
    start without it (the dev stack's destroy stops while another stack's RayCluster
    lives)."""
    project.run("destroy", "--yes", stack=KEEP, check=False, during=operator_follows_chart(cp))
    project.run("stack", "rm", "--yes", "--force", stack=KEEP, check=False)
    for kind, name in (("namespace", KEEP_NS), ("pv", KEEP_PV), ("storageclass", KEEP_CLASS)):
        cp.kubectl("delete", kind, name, "--ignore-not-found", "--wait=true", timeout_s=guard(180))
    shutil.rmtree(keep_volume_dir(cp), ignore_errors=True)


def test_destroy_keeps_the_runs_claim_and_its_runs_on_a_delete_volume(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    """Issue 54: `pulumi destroy` removes compute, not results. On the tier's pool
    (reclaim policy Retain) a deleted claim loses no file; on a Delete volume, as a
    cloud's default storage class makes, it loses every run: hence this volume."""
    cp = bare_control_plane
    volume_dir = create_delete_volume(cp)
    project.new_stack(
        KEEP,
        {
            "topology.name": KEEP,
            # Its own, which the stack creates and destroys, as the dev stack does its.
            "topology.namespace": KEEP_NS,
            "topology.operator.install": "false",  # the dev stack's operator serves it
            "topology.simulator.kind": "mock",
            "topology.workers.replicas": "1",
            "topology.runs.claim.storage_class": KEEP_CLASS,
            "topology.runs.claim.size": "1Gi",
        },
    )
    up(project, cp, KEEP)
    claim = keep_claim(cp)
    assert claim is not None and claim["spec"].get("volumeName") == KEEP_PV, claim
    assert claim_in_state(project).get("retainOnDelete") is True
    uid = claim["metadata"]["uid"]
    store_old_run(volume_dir)  # as a training on the head writes to /uerl/runs

    project.run("destroy", "--yes", stack=KEEP, during=operator_follows_chart(cp))

    kept, volume = keep_claim(cp), keep_volume(cp)
    namespace = get_or_none(cp, "namespace", KEEP_NS)
    assert kept is not None, (
        f"the destroy deleted {KEEP_CLAIM}: namespace {KEEP_NS} "
        f"{'kept' if namespace else 'deleted, and every object in it'}; "
        f"volume {KEEP_PV} {phase(volume) or 'deleted'}, runs "
        f"{'there' if old_run_there(volume_dir) else 'gone'}"
    )
    assert kept["metadata"]["uid"] == uid and "deletionTimestamp" not in kept["metadata"]
    assert phase(kept) == "Bound" and phase(volume) == "Bound", (kept, volume)
    assert volume is not None and volume["spec"]["claimRef"]["uid"] == uid
    assert old_run_there(volume_dir)
    # Everything else of the stack goes; the claim's namespace stays with it.
    left = {f"persistentvolumeclaim/{KEEP_CLAIM}", f"namespace/{KEEP_NS}"}
    cp.wait_until(
        lambda: set(stack_objects(cp, KEEP_SELECTOR)) <= left,
        guard(180),
        "every object of the keep stack but its claim (and namespace) to be gone",
    )
    assert project.resources(KEEP) == []  # kept, and no longer the stack's


def test_the_next_up_takes_the_kept_claim_back_and_its_runs_are_listed(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    volume_dir = keep_volume_dir(cp)
    kept, volume = keep_claim(cp), keep_volume(cp)
    # Without it, `up` would wait minutes for a claim no volume can bind.
    assert kept is not None and volume is not None, "no claim kept by the test before"
    uid = kept["metadata"]["uid"]
    assert volume["spec"]["claimRef"]["uid"] == uid

    result = up(project, cp, KEEP)  # the default provider would fail with AlreadyExists

    assert "AlreadyExists" not in result.output, result.output
    claim = keep_claim(cp)
    assert claim is not None and claim["metadata"]["uid"] == uid  # the same claim, not anew
    assert phase(claim) == "Bound" and claim["spec"]["volumeName"] == KEEP_PV
    assert claim_in_state(project).get("retainOnDelete") is True  # kept by the next one too
    assert old_run_there(volume_dir)
    # `uerl runs list --stack keep` runs `uerl runs list --dir /uerl/runs --json` on the
    # head (an exec, which the simulated pod cannot serve): the head mounts the claim
    # there, and this volume is what it mounts, so the same command reads it here.
    assert project.outputs(KEEP)["endpoints"]["runs"]["uri"] == f"file://{RUNS_MOUNT_PATH}"
    (head,) = [
        p for p in ray_pods(cp, KEEP, KEEP_NS)
        if p["metadata"]["labels"].get("ray.io/node-type") == "head"
        and not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in head["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    mounts = {
        m["mountPath"]
        for c in head["spec"]["containers"]
        for m in c.get("volumeMounts", [])
        if claims.get(m["name"]) == KEEP_CLAIM
    }
    assert mounts == {RUNS_MOUNT_PATH}, head["spec"]
    listed = subprocess.run(
        [str(UERL), "runs", "list", "--dir", str(volume_dir), "--json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    runs = [(r["name"], r["checkpoint"], r["iteration"]) for r in json.loads(listed)]
    assert runs == [(OLD_RUN, OLD_CHECKPOINT, 3)]


def test_without_keep_on_destroy_destroy_deletes_the_claim_and_a_delete_volume_its_runs(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    """Why the claim is kept by default: on a volume with reclaim policy Delete (a
    cloud's default storage class) the claim's deletion deletes the runs."""
    cp = bare_control_plane
    volume_dir = keep_volume_dir(cp)
    try:
        kept = keep_claim(cp)
        assert kept is not None and project.resources(KEEP), "no stack up with its claim"
        uid = kept["metadata"]["uid"]
        namespace = get_or_none(cp, "namespace", KEEP_NS)
        assert namespace is not None
        project.config_set(KEEP, "topology.runs.claim.keep_on_destroy", "false")
        up(project, cp, KEEP)
        # Other providers, the same claim and namespace: the runs stay until the destroy.
        claim = keep_claim(cp)
        assert claim is not None and claim["metadata"]["uid"] == uid
        after = get_or_none(cp, "namespace", KEEP_NS)
        assert after is not None and after["metadata"]["uid"] == namespace["metadata"]["uid"]
        assert not claim_in_state(project).get("retainOnDelete")
        assert old_run_there(volume_dir)

        project.run("destroy", "--yes", stack=KEEP, during=operator_follows_chart(cp))

        assert keep_claim(cp) is None
        # Nothing kept: the stack's namespace goes too.
        cp.wait_until(
            lambda: get_or_none(cp, "namespace", KEEP_NS) is None, guard(180), f"{KEEP_NS} gone"
        )
        if HOSTPATH_DELETER_PATHS.search(str(volume_dir)):
            # The controller deletes the volume as a cloud's deletes the disk: runs gone.
            cp.wait_until(
                lambda: keep_volume(cp) is None, guard(180), f"{KEEP_PV} deleted (Delete)"
            )
            assert not volume_dir.exists()
        else:
            # Its deleter refuses this path: the volume fails instead, the files outlive it.
            cp.wait_until(
                lambda: phase(keep_volume(cp)) == "Failed", guard(180), f"{KEEP_PV} Failed"
            )
    finally:
        remove_the_keep_stack(project, cp)
    assert keep_volume(cp) is None and get_or_none(cp, "namespace", KEEP_NS) is None


# ---- 5. destroy -----------------------------------------------------------------------------


def test_destroy_leaves_only_the_runs_claim_in_its_namespace_and_removes_the_crds_it_installed(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    assert stack_objects(cp)  # the selector does find the stack while it exists
    claim_uid = cp.get_json("pvc", "-n", NAMESPACE, DEV_CLAIM)["metadata"]["uid"]
    project.run("destroy", "--yes", stack="dev", during=operator_follows_chart(cp))

    # Compute goes, results stay (`runs.claim.keep_on_destroy`, the default): the claim,
    # and the stack's namespace, whose deletion would delete the claim.
    kept = {f"persistentvolumeclaim/{DEV_CLAIM}", f"namespace/{NAMESPACE}"}
    cp.wait_until(
        lambda: set(stack_objects(cp)) == kept, guard(180), "the dev stack's objects to be gone"
    )
    claim = cp.get_json("pvc", "-n", NAMESPACE, DEV_CLAIM)
    assert claim["metadata"]["uid"] == claim_uid and claim["status"]["phase"] == "Bound"
    assert "deletionTimestamp" not in cp.get_json("namespace", NAMESPACE)["metadata"]
    crds = {c["metadata"]["name"] for c in cp.get_json("crd")["items"]}
    assert not crds & KUBERAY_CRD_NAMES  # `crds: install`: the stack's own, deleted with it
    assert project.resources("dev") == []


# ---- 6. CRDs left by an earlier KubeRay ----------------------------------------------------------


def test_leftover_crds_fail_install_with_the_fix_and_adopt_takes_them_over(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    cp = bare_control_plane
    # What `helm install` of KubeRay leaves behind after `helm uninstall`.
    cp.kubectl("apply", "--server-side", "--field-manager=helm", "-f", str(KUBERAY_CRDS_DIR))
    cp.wait_until(cp.crds_established, guard(120), "the leftover CRDs to be established")

    result = up(project, cp, check=False)
    assert result.returncode != 0
    assert "topology.operator.crds" in result.output and "adopt" in result.output, result.output

    project.config_set("dev", "topology.operator.crds", "adopt")
    up(project, cp)
    assert raycluster(cp)["status"]["state"] == "ready"
    managers = {
        m["manager"]
        for m in cp.get_json("crd", "rayjobs.ray.io", "--show-managed-fields")["metadata"][
            "managedFields"
        ]
    }
    assert "uerl" in managers, managers


OTHER_TEAM = "other-team"  # a namespace of another team, with its own RayCluster
OTHER_TEAMS_CLUSTER = {
    "apiVersion": "ray.io/v1",
    "kind": "RayCluster",
    "metadata": {"name": "theirs", "namespace": OTHER_TEAM},
    "spec": {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:theirs"}]}},
        }
    },
}


def test_destroy_in_adopt_mode_leaves_the_crds_and_another_teams_raycluster(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    """`adopt` is what uerl tells a user to set when the CRDs are already there: they are
    the cluster's, and deleting them would delete every team's RayClusters with them."""
    cp = bare_control_plane
    cp.kubectl("create", "namespace", OTHER_TEAM)
    cp.kubectl("create", "-f", "-", input=json.dumps(OTHER_TEAMS_CLUSTER))
    theirs = ("raycluster", "-n", OTHER_TEAM, "theirs")
    uid = cp.get_json(*theirs)["metadata"]["uid"]

    def their_head() -> list[dict[str, Any]]:
        return ray_pods(cp, "theirs", OTHER_TEAM)

    cp.wait_until(lambda: bool(their_head()), guard(180), "the other team's head pod")
    head_uids = uids(their_head())

    project.run("destroy", "--yes", stack="dev", during=operator_follows_chart(cp))

    crds = {c["metadata"]["name"] for c in cp.get_json("crd")["items"]}
    assert crds >= KUBERAY_CRD_NAMES, crds
    still = cp.get_json(*theirs)["metadata"]
    assert still["uid"] == uid and "deletionTimestamp" not in still, still
    assert uids(their_head()) == head_uids
    assert project.resources("dev") == []
    # The next scenario starts from a cluster without KubeRay's CRDs.
    cp.kubectl("delete", "namespace", OTHER_TEAM, "--wait=true", timeout_s=guard(180))
    cp.kubectl("delete", "-f", str(KUBERAY_CRDS_DIR), "--wait=true", timeout_s=guard(180))


def test_crds_another_pulumi_resource_manages_are_refused_with_the_hand_over(
    project: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    """A stack made when the CRDs were the chart's children: taking them over would
    leave those old resources to delete them (and every RayCluster) at the end of the
    update; the update stops first, saying how to hand them over."""
    cp = bare_control_plane
    manager = "--field-manager=pulumi-kubernetes-1a2b3c4d"  # the Kubernetes provider's kind
    cp.kubectl("apply", "--server-side", manager, "-f", str(KUBERAY_CRDS_DIR))
    cp.wait_until(cp.crds_established, guard(120), "the CRDs to be established")
    project.new_stack(
        "handover",
        {
            "topology.operator.chart_path": str(KUBERAY_CHART_DIR),
            "topology.operator.crds": "adopt",
            "topology.name": "handover",
            "topology.namespace": "uerl-handover",
        },
    )

    result = up(project, cp, "handover", check=False)
    assert result.returncode != 0
    assert "pulumi state delete" in result.output, result.output
    assert "Traceback" not in result.output, result.output
    assert cp.crds_established()  # nothing deleted
    project.run("destroy", "--yes", stack="handover", during=operator_follows_chart(cp))
    project.run("stack", "rm", "--yes", stack="handover")
    cp.kubectl("delete", "namespace", "uerl-handover", "--ignore-not-found", "--wait=true",
               timeout_s=guard(180))  # fmt: skip
    assert cp.crds_established()  # still nothing deleted
