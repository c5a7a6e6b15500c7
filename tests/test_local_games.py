"""LocalMockGames: Y mock games (+ discovery) on per_worker ports, stopped by pid."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.topology import Topology
from training.local import processes
from training.local.endpoints import local_endpoints
from training.local.games import LocalGamesError, LocalMockGames
from training.run.preflight import grpc_ready


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
            grpc_ready(game.endpoint, timeout_s=10, what=game.name)
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
