"""Preflight: mismatches between endpoints and cluster fail fast with expected vs actual."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import ray
from grpc_health.v1 import health, health_pb2_grpc
from host_speed import CLUSTER_START_S, guard

from infra.endpoints import Endpoints, Resources
from infra.topology import Topology
from training.local import processes
from training.local.local_endpoints import local_endpoints
from training.local.ray_cluster import LocalRayCluster, node_specs
from training.preflight.checks import PreflightError, preflight

# Generous sanity bound: preflight must never hang; it answers in seconds.
BOUND_S = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    # 1 learner node of 2 CPUs + 1 uerl_learner, 2 worker nodes of 1 CPU + 1 ue_worker each.
    specs = node_specs(
        learners=1,
        learner_cpus=2,
        workers=2,
        worker_cpus=1,
        custom_resource="ue_worker",
        learner_resource="uerl_learner",
    )
    with LocalRayCluster(specs, start_timeout_s=CLUSTER_START_S) as started:
        yield started


@pytest.fixture(scope="module")
def game() -> Iterator[str]:
    """A real gRPC server standing in for the discovery game (health service only)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


@pytest.fixture(autouse=True)
def _disconnect() -> Iterator[None]:
    yield
    ray.shutdown()


def endpoints_for(cluster: LocalRayCluster, discovery: str, **changes: object) -> Endpoints:
    topo = Topology.parse(
        {"learners": {"replicas": 1, "cpus": 2}, "workers": {"replicas": 2, "cpus": 1}}
    )
    base = local_endpoints(
        topo, gcs_address=cluster.address, client_port=cluster.client_port, base_port=50000
    )
    return base.model_copy(update={"discovery_endpoint": discovery, **changes})


def timed_failure(endpoints: Endpoints, **kwargs: object) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(PreflightError) as info:
        preflight(endpoints, **kwargs)  # type: ignore[arg-type]
    return str(info.value), time.monotonic() - start


def test_matching_cluster_passes_and_places_the_learner(
    cluster: LocalRayCluster, game: str
) -> None:
    report = preflight(endpoints_for(cluster, game), timeout_s=10)
    assert report.custom_resource_total == 2
    assert len(report.learner_placement) == 1
    assert report.elapsed_s < BOUND_S


def test_missing_custom_resource_names_expected_and_available(
    cluster: LocalRayCluster, game: str
) -> None:
    message, elapsed = timed_failure(
        endpoints_for(cluster, game, custom_resource="ue_game"), timeout_s=10
    )
    assert "custom resource 'ue_game': expected at least 2" in message
    assert "the cluster has 0 available" in message
    assert elapsed < BOUND_S


def test_a_run_told_to_wait_for_nodes_looks_again_until_the_wait_is_over(
    cluster: LocalRayCluster, game: str
) -> None:
    # A supervised attempt on a new head waits for its workers to rejoin (the real-pods
    # tier deletes the head); nodes that never come give the same error, after the wait.
    message, elapsed = timed_failure(
        endpoints_for(cluster, game, custom_resource="ue_game"), timeout_s=10, nodes_wait_s=5
    )
    assert "custom resource 'ue_game': expected at least 2" in message
    assert 5 <= elapsed < BOUND_S


def test_fewer_custom_resource_units_than_env_runners_fails(
    cluster: LocalRayCluster, game: str
) -> None:
    message, elapsed = timed_failure(endpoints_for(cluster, game, num_env_runners=3), timeout_s=10)
    assert "expected at least 3" in message and "the cluster has 2 available" in message
    assert elapsed < BOUND_S


def test_too_few_learner_cpus_names_expected_and_room(cluster: LocalRayCluster, game: str) -> None:
    # Two learners of 2 CPUs: the only 2-CPU node takes one; worker nodes have 0 left.
    message, elapsed = timed_failure(endpoints_for(cluster, game, num_learners=2), timeout_s=10)
    assert "expected room for 2 learner(s) of 2 CPU + 0 GPU each" in message
    assert "the cluster has room for 1" in message
    assert elapsed < BOUND_S


def test_learner_larger_than_any_node_fails_even_if_total_cpus_suffice(
    cluster: LocalRayCluster, game: str
) -> None:
    # 4 CPUs exist in total, but no single node has 3.
    resources = Resources(cpus_per_learner=3, gpus_per_learner=0, cpus_per_env_runner=0)
    message, _ = timed_failure(endpoints_for(cluster, game, resources=resources), timeout_s=10)
    assert "room for 1 learner(s) of 3 CPU" in message and "room for 0" in message


def test_learners_go_only_to_nodes_advertising_the_learner_resource(
    cluster: LocalRayCluster, game: str
) -> None:
    # The learner node's 2 CPUs would fit both 0.5-CPU learners, but it has one unit.
    resources = Resources(cpus_per_learner=0.5, gpus_per_learner=0, cpus_per_env_runner=0)
    endpoints = endpoints_for(cluster, game, resources=resources, num_learners=2)
    message, _ = timed_failure(endpoints, timeout_s=10)
    assert "must fit on a node advertising 'uerl_learner', one unit per learner" in message
    assert "room for 1 after placing 2 env runner(s), 1 unit(s) of 'uerl_learner'" in message


def test_learner_gpus_missing_fails(cluster: LocalRayCluster, game: str) -> None:
    resources = Resources(cpus_per_learner=1, gpus_per_learner=1, cpus_per_env_runner=1)
    message, _ = timed_failure(endpoints_for(cluster, game, resources=resources), timeout_s=10)
    assert "1 CPU + 1 GPU each" in message and "room for 0" in message


def test_unreachable_discovery_endpoint_fails_within_the_timeout(
    cluster: LocalRayCluster,
) -> None:
    dead = f"127.0.0.1:{processes.free_port()}"
    message, elapsed = timed_failure(endpoints_for(cluster, dead), timeout_s=5)
    assert f"discovery endpoint {dead} is unreachable" in message
    assert elapsed < BOUND_S


def test_unreachable_networked_discovery_endpoint_fails_from_the_driver(
    cluster: LocalRayCluster,
) -> None:
    dead = f"127.0.0.1:{processes.free_port()}"
    endpoints = endpoints_for(cluster, dead, pattern="networked")
    message, elapsed = timed_failure(endpoints, timeout_s=5)
    assert f"discovery endpoint {dead} is unreachable" in message
    assert "worker node" not in message
    assert elapsed < BOUND_S


def test_sidecar_discovery_endpoint_is_checked_from_a_worker_node(
    cluster: LocalRayCluster,
) -> None:
    dead = f"127.0.0.1:{processes.free_port()}"
    message, _ = timed_failure(endpoints_for(cluster, dead, pattern="sidecar"), timeout_s=5)
    assert message.endswith("(checked from a worker node)")


def test_discovery_endpoint_that_is_not_grpc_fails_within_the_timeout(
    cluster: LocalRayCluster,
) -> None:
    # Accepts TCP but never speaks HTTP/2: must not hang past the timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        message, elapsed = timed_failure(endpoints_for(cluster, endpoint), timeout_s=3)
    assert "accepts TCP but no gRPC server answered" in message
    # A hang never ends; the 3 s timeout plus a Ray task on a busy host took 33 s once
    # (CI capped at 1.5 cores beside the build): the bound tells the two apart, no more.
    assert elapsed < guard(120)


def test_unreachable_ray_fails_without_hanging(game: str) -> None:
    topo = Topology.parse({})
    dead = f"127.0.0.2:{processes.free_port()}"
    endpoints = local_endpoints(topo, gcs_address=dead, client_port=1, base_port=50000)
    message, elapsed = timed_failure(endpoints, timeout_s=3)
    assert f"Ray GCS {dead} is unreachable" in message
    assert elapsed < guard(120)  # a hang guard, as above
    assert not ray.is_initialized()


def _ray_client_listener() -> socket.socket:
    """Something listening where a Ray Client proxy would (the TCP probe comes first)."""
    return socket.create_server(("127.0.0.1", 0))


def test_a_ray_client_server_that_dies_at_start_is_asked_once_more(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.preflight import checks as pf

    calls: list[str] = []

    def init(address: str, **_: object) -> None:
        calls.append(address)
        if len(calls) == 1:
            raise ConnectionAbortedError(
                "Initialization failure from server:\\nRuntimeError: Starting Ray client "
                "server failed. See ray_client_server_23000.err for detailed logs."
            )

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(pf, "CLIENT_RETRY_DELAY_S", 0.0)
    with _ray_client_listener() as sock:
        address = f"ray://127.0.0.1:{sock.getsockname()[1]}"
        pf.connect_ray(address, timeout_s=5)
    assert calls == [address, address]
    assert "the cluster could not start a client server for this driver" in (
        capsys.readouterr().err
    )


def test_other_ray_client_failures_and_a_second_one_are_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from training.preflight import checks as pf

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(pf, "CLIENT_RETRY_DELAY_S", 0.0)
    for message, attempts in (("auth failed", 1), (pf.CLIENT_SERVER_FAILED, 2)):
        calls: list[str] = []

        def init(
            address: str, _message: str = message, _calls: list[str] = calls, **_: object
        ) -> None:
            _calls.append(address)
            raise ConnectionAbortedError(_message)

        monkeypatch.setattr(ray, "init", init)
        with _ray_client_listener() as sock, pytest.raises(ConnectionAbortedError):
            pf.connect_ray(f"ray://127.0.0.1:{sock.getsockname()[1]}", timeout_s=5)
        assert len(calls) == attempts


# -- something listening at the GCS address that is not Ray's GCS ------------------------


def _with_gcs(address: str) -> Endpoints:
    return local_endpoints(Topology.parse({}), gcs_address=address, client_port=1, base_port=1)


def test_an_http_server_at_the_gcs_address_fails_preflight_at_once(web_server: str) -> None:
    # Before: ray.init retried against it for over 150 s, past --preflight-timeout.
    # At once: well before its timeout, which is long, so a loaded host keeps the bound.
    message, elapsed = timed_failure(_with_gcs(web_server), timeout_s=30)
    assert message.startswith(f"Ray GCS {web_server} is not a gRPC server")
    assert elapsed < guard(60) and not ray.is_initialized()


def test_a_grpc_server_that_is_not_ray_at_the_gcs_address_fails_preflight(game: str) -> None:
    message, elapsed = timed_failure(_with_gcs(game), timeout_s=30)  # as above
    assert message.startswith(f"Ray GCS {game} is a gRPC server but not Ray's GCS")
    assert elapsed < guard(60) and not ray.is_initialized()


def test_a_silent_listener_at_the_gcs_address_fails_preflight_within_its_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        message, elapsed = timed_failure(_with_gcs(address), timeout_s=2)
    assert message.startswith(f"Ray GCS {address} accepts TCP but did not answer")
    # Its 2 s, with room for a loaded host (ray.init retried for over 150 s).
    assert elapsed < guard(60) and not ray.is_initialized()


def test_the_gcs_handshake_passes_against_rays_gcs(cluster: LocalRayCluster) -> None:
    from training.preflight.checks import gcs_handshake

    gcs_handshake(cluster.address, timeout_s=10)
