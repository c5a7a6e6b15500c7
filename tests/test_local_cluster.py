"""LocalRayCluster: real raylets on 127.0.0.2, started and stopped by pid."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from host_speed import CLUSTER_START_S, guard

from training.local import processes
from training.local.ray_cluster import (
    NODE_IP,
    LocalClusterError,
    LocalRayCluster,
    NodeSpec,
    _Node,
    node_specs,
)

LEARNERS, LEARNER_CPUS, WORKERS, WORKER_CPUS = 1, 2, 2, 1


@pytest.fixture(scope="module")
def cluster_nodes() -> Iterator[tuple[list[dict], set[int]]]:
    """Start the cluster once, record what Ray sees and which pids ran, then stop it."""
    specs = node_specs(
        learners=LEARNERS,
        learner_cpus=LEARNER_CPUS,
        workers=WORKERS,
        worker_cpus=WORKER_CPUS,
        custom_resource="ue_worker",
    )
    with LocalRayCluster(specs, start_timeout_s=CLUSTER_START_S) as cluster:
        ray.init(address=cluster.address, _node_ip_address=NODE_IP, logging_level="warning")
        try:
            nodes = [n for n in ray.nodes() if n["Alive"]]
            # A task makes the raylets start worker processes, which must be stopped too.
            assert ray.get(ray.remote(lambda: os.getpid()).remote()) > 0
        finally:
            ray.shutdown()
        pids = cluster.pids()
    yield nodes, pids


def _by_kind(nodes: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {"head": [], "learner": [], "worker": []}
    for node in nodes:
        res = node["Resources"]
        if "node:__internal_head__" in res:
            kinds["head"].append(node)
        elif "ue_worker" in res:
            kinds["worker"].append(node)
        else:
            kinds["learner"].append(node)
    return kinds


def test_cluster_has_one_head_with_zero_cpus(cluster_nodes: tuple[list[dict], set[int]]) -> None:
    heads = _by_kind(cluster_nodes[0])["head"]
    assert len(heads) == 1
    assert heads[0]["Resources"].get("CPU", 0) == 0


def test_cluster_has_learner_nodes_with_learner_cpus(
    cluster_nodes: tuple[list[dict], set[int]],
) -> None:
    learners = _by_kind(cluster_nodes[0])["learner"]
    assert [n["Resources"]["CPU"] for n in learners] == [LEARNER_CPUS] * LEARNERS


def test_cluster_has_worker_nodes_with_one_custom_resource_each(
    cluster_nodes: tuple[list[dict], set[int]],
) -> None:
    workers = _by_kind(cluster_nodes[0])["worker"]
    assert [(n["Resources"]["CPU"], n["Resources"]["ue_worker"]) for n in workers] == [
        (WORKER_CPUS, 1.0)
    ] * WORKERS


def test_all_nodes_run_on_the_loopback_node_ip(cluster_nodes: tuple[list[dict], set[int]]) -> None:
    assert {n["NodeManagerAddress"] for n in cluster_nodes[0]} == {NODE_IP}


def test_no_process_survives_the_context(cluster_nodes: tuple[list[dict], set[int]]) -> None:
    nodes, pids = cluster_nodes
    # raylet + agents per node at least: the test saw the real trees.
    assert len(pids) >= 2 * len(nodes)
    assert processes.alive(pids) == set()


def test_failed_node_start_raises_and_stops_the_nodes_already_started() -> None:
    # "CPU" may not be given as a custom resource: that node's `ray start` fails.
    bad = [NodeSpec("head", "head", 0), NodeSpec("worker1", "worker", 1, 0, {"CPU": 1.0})]
    cluster = LocalRayCluster(bad, start_timeout_s=60)
    with pytest.raises(LocalClusterError, match="worker1"):
        cluster.__enter__()
    assert cluster.pids() == set()


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from training.local.ray_cluster import LocalRayCluster, node_specs
    specs = node_specs(learners=0, learner_cpus=1, workers=1, worker_cpus=1,
                       custom_resource="ue_worker")
    cluster = LocalRayCluster(specs).__enter__()
    print(json.dumps([sorted(cluster.pids()), str(cluster.temp_dir)]), flush=True)
    time.sleep(600)
    """
)


def test_nodes_die_with_their_owner_when_it_is_killed() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    temp_dir = ""
    try:
        assert owner.stdout is not None
        pid_list, temp_dir = json.loads(owner.stdout.readline())
        pids = set(pid_list)
        assert processes.alive(pids)
        os.kill(owner.pid, signal.SIGKILL)  # no chance to clean up
        owner.wait(timeout=10)
        deadline = time.monotonic() + guard(120)  # a loaded host's raylets take a while
        while processes.alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes.alive(pids) == set()
    finally:
        if owner.poll() is None:
            owner.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _fake_ray_start(tmp_path: Path, *, outcomes: list[str]):
    """A `_spawn` stand-in: each call starts the next outcome ("abort": killed by
    SIGABRT; "exit1": a plain error; "start": prints Ray's started line, then waits)."""
    scripts = {
        "abort": "import os; os.abort()",
        "exit1": "raise SystemExit(1)",
        "slow": "import sys; print('Exception: The current node timed out during startup. "
        "This could happen because some of the raylet failed to startup or the GCS has "
        "become overloaded.', flush=True); sys.exit(1)",
        "start": "import time; print('Ray runtime started.', flush=True); time.sleep(60)",
    }

    def spawn(spec: NodeSpec) -> tuple[subprocess.Popen[bytes], Path, int]:
        log = tmp_path / f"{spec.name}.log"
        offset = processes.log_end(log)
        argv = [sys.executable, "-c", scripts[outcomes.pop(0)]]
        return processes.spawn(argv, log_path=log), log, offset

    return spawn


def _node_started_after(
    tmp_path: Path, outcomes: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[LocalRayCluster, _Node]:
    specs = [NodeSpec("head", "head", 0), NodeSpec("worker1", "worker", 1)]
    cluster = LocalRayCluster(specs, log_dir=tmp_path, stop_grace_s=1)
    monkeypatch.setattr(cluster, "_spawn", _fake_ray_start(tmp_path, outcomes=outcomes))
    spec = cluster.specs[1]
    node = _Node(spec, *cluster._spawn(spec))
    cluster._nodes.append(node)
    return cluster, node


def test_a_ray_start_killed_by_a_signal_while_starting_is_started_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, node = _node_started_after(tmp_path, ["abort", "start"], monkeypatch)
    try:
        cluster._wait_started(node, time.monotonic() + 30)
        assert node.crashes == 1 and node.proc.poll() is None
        assert "ray start for node worker1 was killed by signal 6 while starting" in (
            capsys.readouterr().out
        )
        assert "--- uerl local: ray start crashed (-6); again ---" in node.log.read_text()
    finally:
        processes.terminate([node.proc], grace_s=1)


def test_a_node_that_missed_rays_30_s_registration_wait_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, node = _node_started_after(tmp_path, ["slow", "slow", "start"], monkeypatch)
    try:
        cluster._wait_started(node, time.monotonic() + 30)
        assert node.proc.poll() is None and node.crashes == 0
        assert capsys.readouterr().out.count("did not register within Ray's 30 s") == 2
    finally:
        processes.terminate([node.proc], grace_s=1)


def test_an_earlier_runs_started_line_in_a_kept_log_does_not_count_as_this_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `uerl local --resume` in the same run dir appends to the nodes' logs of the run
    # before, which say "Ray runtime started." already (seen in a CI run: every node taken
    # as started at once, the late ones never started again).
    (tmp_path / "worker1.log").write_text("Ray runtime started.\n--- an earlier run ---\n")
    cluster, node = _node_started_after(tmp_path, ["slow", "start"], monkeypatch)
    try:
        cluster._wait_started(node, time.monotonic() + 30)
        assert node.proc.poll() is None
        assert capsys.readouterr().out.count("did not register within Ray's 30 s") == 1
        assert node.this_start().strip() == "Ray runtime started."
    finally:
        processes.terminate([node.proc], grace_s=1)


def test_a_second_crash_or_an_error_exit_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for outcomes, code in ((["abort", "abort"], -6), (["exit1"], 1)):
        cluster, node = _node_started_after(tmp_path, outcomes, monkeypatch)
        with pytest.raises(LocalClusterError, match=f"worker1 exited with code {code}"):
            cluster._wait_started(node, time.monotonic() + 30)
        assert outcomes == []


def test_worker_nodes_added_by_a_call_that_fails_are_stopped_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = LocalRayCluster(
        [NodeSpec("head", "head", 0), NodeSpec("worker1", "worker", 1, 0, {"ue_worker": 1.0})],
        log_dir=tmp_path,
        stop_grace_s=2,
    )
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn(spec: NodeSpec) -> tuple[subprocess.Popen[bytes], Path, int]:
        log = tmp_path / f"{spec.name}.log"
        spawned.append(processes.spawn(["sleep", "60"], log_path=log))
        return spawned[-1], log, 0

    def wait_started(node: object, deadline: float) -> None:
        if node.spec.name == "worker3":  # type: ignore[attr-defined]
            raise LocalClusterError("ray start for node worker3 exited with code 1")

    monkeypatch.setattr(cluster, "_spawn", spawn)
    monkeypatch.setattr(cluster, "_wait_started", wait_started)
    try:
        with pytest.raises(LocalClusterError, match="worker3"):
            cluster.add_worker_nodes(2)
        assert cluster.worker_nodes() == []
        assert [s.name for s in cluster.specs] == ["head", "worker1"]
        assert processes.alive({p.pid for p in spawned}) == set()
    finally:
        processes.terminate(spawned, grace_s=1)


def test_uerl_local_gives_its_nodes_the_topologys_ray_start_timeout(tmp_path: Path) -> None:
    # One number for both: how long Ray may take to come up, in pods or here (a busy
    # host's nodes miss Ray's own 30 s registration wait, and are started again within it).
    from infra.topology import Topology
    from training.local.session import _cluster

    topology = Topology.parse({"ray": {"start_timeout_s": 42}})
    assert _cluster(topology, tmp_path, dashboard=False).start_timeout_s == 42
    assert _cluster(Topology.parse({}), tmp_path, dashboard=False).start_timeout_s == 300
