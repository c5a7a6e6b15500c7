"""LocalMockGames: Y mock games (+ discovery) on per_worker ports, stopped by pid."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from host_speed import guard

from infra.topology import Topology
from training.clients.game_client import GymClient
from training.local import processes
from training.local.games import LocalGamesError, LocalMockGames
from training.local.local_endpoints import local_endpoints
from training.preflight.checks import grpc_ready


def test_games_listen_on_base_port_plus_worker_index_and_discovery_on_base(
    tmp_path: Path,
) -> None:
    with LocalMockGames(
        workers=2,
        env_id="CartPole-v1",
        envs_per_game=1,
        run_dir=tmp_path,
        discovery_instance=True,
    ) as games:
        base = games.base_port
        assert [(g.name, g.port) for g in games.games] == [
            ("ue-disc", base),
            ("ue-1", base + 1),
            ("ue-2", base + 2),
        ]
        for game in games.games:
            grpc_ready(game.endpoint, timeout_s=guard(60), what=game.name)
        pids = games.pids()
    assert pids and processes.alive(pids) == set()


def test_stopped_games_report_their_stats(tmp_path: Path) -> None:
    games = LocalMockGames(workers=1, env_id="CartPole-v1", envs_per_game=1, run_dir=tmp_path)
    with games:
        pass
    assert games.stats["ue-1"]["sessions_opened"] == 0
    assert set(games.stats["ue-1"]) >= {"sessions_opened", "sessions_closed", "steps", "resets"}


def test_a_game_that_cannot_start_raises_with_its_log_and_leaves_nothing(tmp_path: Path) -> None:
    games = LocalMockGames(
        workers=1, env_id="NoSuchEnv-v9", envs_per_game=1, run_dir=tmp_path, startup_timeout_s=30
    )
    with pytest.raises(LocalGamesError, match="ue-1"):
        games.__enter__()
    assert games.pids() == set()


def test_an_earlier_runs_ready_line_in_a_kept_run_dir_does_not_count_as_ready(
    tmp_path: Path,
) -> None:
    # `uerl local --resume` keeps the run dir; the game logs go on after the last run's.
    (tmp_path / "ue-1.log").write_text("mock-ue listening on 127.0.0.1:1 (an earlier run)\n")
    games = LocalMockGames(
        workers=1, env_id="NoSuchEnv-v9", envs_per_game=1, run_dir=tmp_path, startup_timeout_s=30
    )
    with pytest.raises(LocalGamesError, match=r"ue-1 .* exited with code"):
        games.__enter__()
    assert games.pids() == set()


@pytest.mark.parametrize(
    ("pattern", "discovery", "expected_offset"),
    [("sidecar", "worker1", 1), ("networked", "dedicated", 0), ("networked", "worker1", 1)],
)
def test_local_endpoints_point_discovery_at_the_right_game(
    pattern: str, discovery: str, expected_offset: int
) -> None:
    topo = Topology.parse(
        {"pattern": pattern, "simulator": {"discovery": discovery}, "workers": {"replicas": 3}}
    )
    ep = local_endpoints(topo, gcs_address="127.0.0.2:6000", client_port=6001, base_port=40000)
    assert ep.discovery_endpoint == f"127.0.0.1:{40000 + expected_offset}"
    assert [ep.worker_endpoint(i) for i in (1, 2, 3)] == [
        "127.0.0.1:40001",
        "127.0.0.1:40002",
        "127.0.0.1:40003",
    ]
    assert ep.ray.gcs_address == "127.0.0.2:6000"


def _ephemeral_range(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE_FILE", path)


def test_game_ports_are_chosen_below_the_kernels_ephemeral_port_range(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A restarting game's port must not be handed to an outgoing connection meanwhile.
    _ephemeral_range(monkeypatch, tmp_path, "30000\t60999\n")
    bases = [processes.free_port_block(3) for _ in range(20)]
    assert all(base >= processes.GAME_PORT_LOW and base + 3 <= 30000 for base in bases), bases


def test_game_ports_go_above_the_ephemeral_range_when_none_fit_below(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _ephemeral_range(monkeypatch, tmp_path, "1024\t60999\n")
    bases = [processes.free_port_block(3) for _ in range(20)]
    assert all(base >= 61000 and base + 3 <= 65536 for base in bases), bases


def test_the_local_clusters_ports_are_outside_the_ephemeral_range_and_never_repeat(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Ray binds them seconds after they are picked (its client server on 127.0.0.1 too):
    # an outgoing connection must not be able to take one meanwhile.
    _ephemeral_range(monkeypatch, tmp_path, "30000\t60999\n")
    ports = [processes.free_port() for _ in range(200)]
    assert all(processes.GAME_PORT_LOW <= port < 30000 for port in ports), ports
    assert len(set(ports)) == len(ports)


def _wait(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_killed_game_is_restarted_on_its_port_and_answers_again(tmp_path: Path) -> None:
    lines: list[str] = []
    with LocalMockGames(
        workers=1, env_id="CartPole-v1", envs_per_game=1, run_dir=tmp_path, log=lines.append
    ) as games:
        game = games.worker_game(1)
        first = game.proc
        first.send_signal(signal.SIGKILL)
        # Hang guards: a restart takes about a second idle.
        _wait(lambda: game.proc is not first, timeout_s=guard(60))
        _wait(lambda: game.log.read_text().count("listening on") == 2, timeout_s=guard(120))
        grpc_ready(game.endpoint, timeout_s=guard(60), what=game.name)
        assert games.restarts() == {"ue-1": 1}
        pids = games.pids()
    assert len(lines) == 1 and "ue-1" in lines[0] and "killed by SIGKILL" in lines[0]
    assert "restart 1/10" in lines[0]
    assert "--- uerl local: restart 1 ---" in (tmp_path / "ue-1.log").read_text()
    assert processes.alive(pids) == set()


def test_a_game_past_its_restart_cap_is_given_up_with_a_reason_naming_it(
    tmp_path: Path,
) -> None:
    reasons: list[str] = []
    with LocalMockGames(
        workers=2,
        env_id="CartPole-v1",
        envs_per_game=1,
        run_dir=tmp_path,
        max_restarts=0,
        on_give_up=reasons.append,
        log=lambda _line: None,
    ) as games:
        games.worker_game(2).proc.send_signal(signal.SIGKILL)
        _wait(lambda: bool(reasons), timeout_s=guard(60))
        assert games.worker_game(1).proc.poll() is None  # the others keep running
    assert len(reasons) == 1
    assert "ue-2" in reasons[0] and "cap 0" in reasons[0] and "--game-restarts" in reasons[0]


def test_plaintext_games_are_served_by_the_compiled_server_tls_games_by_grpc_python(
    tmp_path: Path,
) -> None:
    from training.clients import native

    plain = LocalMockGames(workers=1, env_id="CartPole-v1", envs_per_game=1, run_dir=tmp_path)
    tls = LocalMockGames(
        workers=1,
        env_id="CartPole-v1",
        envs_per_game=1,
        run_dir=tmp_path,
        extra_args=["--tls-cert", "c.pem", "--tls-key", "k.pem"],
    )
    assert plain.transport == ("native" if native.available() else "grpcio")
    assert tls.transport == "grpcio"
    with plain as games:
        (game,) = games.games
        with GymClient(game.endpoint, startup_timeout_s=10) as client:
            client.connect()
            assert client.reset({0: 0}).initial_state.environment_states[0]
    assert games.stats["ue-1"]["sessions_opened"] == 1


def test_a_grow_that_fails_stops_the_games_it_started_and_the_next_are_numbered_as_before(
    tmp_path: Path,
) -> None:
    import socket

    with LocalMockGames(
        workers=1, env_id="CartPole-v1", envs_per_game=1, run_dir=tmp_path
    ) as games:
        holder = socket.socket()
        holder.bind(("127.0.0.1", games.base_port + 3))  # ue-3's port, held by another
        holder.listen()
        with holder, pytest.raises(LocalGamesError, match="ue-3 needs port"):
            games.add_worker_games(2)  # ue-2 starts, ue-3 cannot
        started = games.pids()
        assert [g.name for g in games.games] == ["ue-1"]
        assert [g.name for g in games.add_worker_games(1)] == ["ue-2"]
        assert games.worker_count() == 2
    assert processes.alive(started | games.pids()) == set()


def test_a_port_held_by_a_listener_is_not_free() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert not processes.port_is_free(listener.getsockname()[1], "127.0.0.1")


def test_a_port_left_only_with_closing_connections_is_free() -> None:
    # A stopped game closes its clients' connections first: its port keeps them in
    # TIME_WAIT for a minute, yet a new game binds it at once (servers use SO_REUSEADDR).
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    listener.close()
    served.close()  # the server's side closes first: it ends in TIME_WAIT
    assert client.recv(1) == b""
    client.close()
    time.sleep(0.1)
    assert processes.port_is_free(port, "127.0.0.1")
