"""The cluster case: env runners and games in separate processes, one fixed port, one host
per game (as `<name>-ue-{i}` DNS names are on Kubernetes; here 127.0.1.i on loopback).

A game is stopped and a new one started on the same endpoint, as a restarted pod
would be; training goes on and the runner samples from the new game.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from host_speed import CLUSTER_START_S

from infra.topology import Topology
from training.local.local_endpoints import local_endpoints
from training.local.ray_cluster import LocalRayCluster, node_specs
from training.mock_ue import MockUEServer
from training.rllib import hparams as hp
from training.run.driver import TrainOptions, run_training

HOSTS = {1: "127.0.1.1", 2: "127.0.1.2"}


def _port_free_on_every_host() -> int:
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((HOSTS[1], 0))
            port = probe.getsockname()[1]
        try:
            with socket.socket() as other:
                other.bind((HOSTS[2], port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on both loopback hosts")


@pytest.fixture
def cluster() -> Iterator[LocalRayCluster]:
    specs = node_specs(
        learners=0, learner_cpus=1, workers=2, worker_cpus=1, custom_resource="ue_worker"
    )
    with LocalRayCluster(specs, start_timeout_s=CLUSTER_START_S) as started:
        yield started
    ray.shutdown()


# A hang guard: a Ray cluster and a short run, minutes at most on a loaded host.
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_runners_rejoin_a_game_restarted_on_the_same_fixed_endpoint(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    port = _port_free_on_every_host()
    servers = {i: MockUEServer(host, port, "CartPole-v1", 1) for i, host in HOSTS.items()}
    for server in servers.values():
        server.start()
    topology = Topology.parse(
        {"pattern": "networked", "learners": {"replicas": 0}, "workers": {"replicas": 2}}
    )
    endpoints = local_endpoints(
        topology, gcs_address=cluster.address, client_port=cluster.client_port, base_port=port
    ).model_copy(
        update={
            "worker_url_template": "127.0.1.{worker_index}",
            "port": port,
            "port_offset_mode": "fixed",
            "discovery_endpoint": f"{HOSTS[1]}:{port}",
        }
    )
    options = TrainOptions(
        iterations=6,
        run_dir=tmp_path,
        checkpoint_dir=tmp_path / "checkpoints",
        hparams=hp.merge("PPO", ("test", {"train_batch_size_per_learner": 400})),
        request_timeout_s=2.0,
    )
    lines: list[str] = []
    restarted: list[MockUEServer] = []

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("iter    2 "):
            threading.Thread(target=restart_game_1, daemon=True).start()

    def restart_game_1() -> None:
        servers[1].stop(grace=0)
        time.sleep(1.0)  # the pod is gone for a moment, then comes back on the same name
        replacement = MockUEServer(HOSTS[1], port, "CartPole-v1", 1)
        replacement.start()
        restarted.append(replacement)

    try:
        result = run_training(endpoints, options, log=log)
    finally:
        for server in [*servers.values(), *restarted]:
            server.stop(grace=0)
    output = "\n".join(lines)
    assert result.failure is None and len(result.rows) == 6, output
    assert any("env runner 1 (127.0.1.1:" in line and "failed" in line for line in lines), output
    assert any("env runner 1 (127.0.1.1:" in line and "is back" in line for line in lines), output
    assert restarted and restarted[0].stats.steps > 0, output
    assert servers[2].stats.sessions_opened == 1  # the other runner never lost its game
    last = result.rows[-1]
    assert (last.runners_healthy, last.runners_total, last.runners_unknown) == (2, 2, 0)
