"""A game as an image (docker/unreal-game.Dockerfile): the build in the image instead of
on the shared volume (`executables.in_image`), and its gRPC probe (`simulator.probe:
grpc`, docker/schola_probe.py) against real gRPC servers. The tier builds the image
around a fake packaged build and runs it as a pod (tests/k8s/test_pods_e2e.py)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from host_speed import guard
from infra_fixtures import PROJECT_ROOT

from infra import manifests
from infra.manifests import pod_security
from infra.topology import SIMULATOR_DEFAULTS, Topology, TopologyError
from training.mock_ue import MockUEServer

DOCKERFILE = PROJECT_ROOT / "docker" / "unreal-game.Dockerfile"
PROBE = PROJECT_ROOT / "docker" / "schola_probe.py"
IN_IMAGE = {
    "pattern": "networked",
    "simulator": {"kind": "unreal", "image": "registry.example.com/games/my-game:1.0",
                  "probe": "grpc"},
    "executables": {"in_image": True},
}  # fmt: skip


def _game_pod(data: dict[str, Any]) -> dict[str, Any]:
    objects = manifests.build(Topology.parse(data)).objects()
    [games] = [o for o in objects if o["kind"] == "StatefulSet"]
    return dict(games["spec"]["template"]["spec"])


def probe(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROBE), *argv], capture_output=True, text=True, timeout=guard(180)
    )


# ---- the topology --------------------------------------------------------------------


def test_a_build_in_the_image_mounts_no_volume_and_runs_no_loader() -> None:
    topology = Topology.parse(IN_IMAGE)
    kinds = [o["kind"] for o in manifests.build(topology).objects()]
    assert "Job" not in kinds
    claims = [o["metadata"]["name"] for o in manifests.build(topology).objects()
              if o["kind"] == "PersistentVolumeClaim"]  # fmt: skip
    assert claims == ["uerl-runs"]  # the runs' claim only: no executables volume
    pod = _game_pod(IN_IMAGE)
    assert [v["name"] for v in pod["volumes"]] == ["uerl-tmp"]
    assert "initContainers" not in pod  # no wait for a build
    [game] = [c for c in pod["containers"] if c["name"] == "ue"]
    assert game["image"] == "registry.example.com/games/my-game:1.0"
    assert game["command"] == ["/opt/ue/Game.sh"]  # the build where the image put it
    assert pod_security.violations(pod) == []


def test_the_grpc_probe_runs_schola_probe_in_the_game_container_within_its_timeout() -> None:
    [game] = [c for c in _game_pod(IN_IMAGE)["containers"] if c["name"] == "ue"]
    for kind in ("startupProbe", "readinessProbe"):
        check = game[kind]
        # Loopback, from inside the container: the game binds 127.0.0.1 behind its forwarder.
        assert check["exec"]["command"] == ["schola-probe", "127.0.0.1:50052", "3"]
        assert check["timeoutSeconds"] == 5 > 3


def test_the_tcp_probe_stays_the_default() -> None:
    [game] = [c for c in _game_pod({"pattern": "networked"})["containers"] if c["name"] == "ue"]
    assert "schola-probe" not in str(game["readinessProbe"])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"executables": {"in_image": True, "source_url": "https://example.com/g.zip"}},
            "topology.executables.source_url: executables.in_image is true: the build is in "
            "the game's image",
        ),
        (
            {"executables": {"in_image": True, "existing_claim": "builds"}},
            "topology.executables.existing_claim: executables.in_image is true",
        ),
        (
            {"simulator": {"kind": "mock", "probe": "grpc"}},
            "topology.simulator.probe: the grpc probe runs schola-probe in the game's image",
        ),
        ({"simulator": {"probe": "http"}}, "topology.simulator.probe: Input should be 'tcp'"),
    ],
)
def test_bad_game_image_input_names_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError) as err:
        Topology.parse(data)
    assert message in str(err.value)


# ---- the Dockerfile agrees with the topology -------------------------------------------


def test_the_image_runs_the_build_as_the_unreal_user_where_the_topology_looks() -> None:
    text = DOCKERFILE.read_text()
    topology = Topology.parse(IN_IMAGE)
    assert re.search(r"^USER (\d+)$", text, re.MULTILINE)[1] == str(pod_security.UNREAL_UID)  # type: ignore[index]
    assert f"COPY game/ {topology.executables.mount_path}/" in text
    # Alone, it starts as the topology starts a game: the launcher, the headless flags.
    cmd = re.search(r"^CMD (\[.*\])$", text, re.MULTILINE)[1]  # type: ignore[index]
    args = [a.format(port=topology.simulator.port) for a in SIMULATOR_DEFAULTS["unreal"]["args"]]
    assert cmd == str([f"/opt/ue/{topology.simulator.executable}", *args]).replace("'", '"')
    assert "COPY schola_probe.py " in text and "/usr/local/bin/schola-probe" in text


# ---- schola-probe against real gRPC servers -------------------------------------------


@pytest.fixture
def mock_game() -> Iterator[int]:
    server = MockUEServer(host="127.0.0.1", port=0)
    port = server.start()
    yield port
    server.stop(grace=0)


def _grpc_server(with_health: str | None) -> tuple[grpc.Server, int]:
    """A gRPC server; `with_health`: the health service's status (None: no such service,
    as a stock Schola build)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if with_health is not None:
        servicer = health.HealthServicer()
        servicer.set("", health_pb2.HealthCheckResponse.ServingStatus.Value(with_health))
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_a_serving_game_passes(mock_game: int) -> None:
    done = probe(f"127.0.0.1:{mock_game}")
    assert done.returncode == 0, done.stderr


def test_a_grpc_server_without_the_health_service_passes_as_a_stock_schola_build() -> None:
    server, port = _grpc_server(None)
    try:
        done = probe(f"127.0.0.1:{port}")
    finally:
        server.stop(grace=0)
    assert done.returncode == 0, done.stderr


def test_a_game_not_serving_fails_saying_so() -> None:
    server, port = _grpc_server("NOT_SERVING")
    try:
        done = probe(f"127.0.0.1:{port}")
    finally:
        server.stop(grace=0)
    assert done.returncode == 1
    assert done.stderr.strip() == f"schola-probe: 127.0.0.1:{port}: the game says NOT_SERVING"


def test_a_closed_port_fails_within_the_deadline() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    done = probe(f"127.0.0.1:{port}", "2")
    assert done.returncode == 1
    assert done.stderr.startswith(f"schola-probe: 127.0.0.1:{port}: UNAVAILABLE")


def test_a_port_that_does_not_speak_grpc_fails() -> None:
    """An open port is not a game: an HTTP/1 server answers the HTTP/2 preface with junk."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_http1() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer_http1, daemon=True).start()
    try:
        done = probe(f"127.0.0.1:{port}", "2")
    finally:
        listener.close()
    assert done.returncode == 1
    assert done.stderr.startswith(f"schola-probe: 127.0.0.1:{port}: ")


@pytest.mark.parametrize("argv", [[], ["50051"], ["127.0.0.1:1", "soon"], ["a:1", "1", "x"]])
def test_bad_arguments_print_the_usage_with_exit_2(argv: list[str]) -> None:
    done = probe(*argv)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: schola-probe HOST:PORT [TIMEOUT_S]")


def test_the_probes_grpc_is_the_one_uerl_pins() -> None:
    """The probe's grpcio (in the image's own venv) within pyproject's bounds for uerl's."""
    pyproject = (PROJECT_ROOT / "pyproject.toml").read_text()
    dockerfile = DOCKERFILE.read_text()
    for name in ("grpcio", "grpcio-health-checking"):
        [pin] = re.findall(rf'^\s*"({re.escape(name)}[<>=][^"]*)",', pyproject, re.MULTILINE)
        assert f'"{pin}"' in dockerfile, pin
