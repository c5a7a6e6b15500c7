"""A `uerl local` session: the whole topology on this machine, then the `uerl train` code path.

A Ray head with 0 CPUs, X learner nodes and Y worker nodes each with one unit of
the custom resource (separate raylets on 127.0.0.2), Y mock games (+ a discovery
instance when networked) on 127.0.0.1, and an endpoints object describing them.
Everything started is stopped on exit, on error and on Ctrl-C/SIGTERM/SIGHUP
(and dies with this process if it is killed).
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from training import exit_status

if TYPE_CHECKING:
    from infra.endpoints import Endpoints
    from infra.topology import Topology
    from training.local.games import LocalMockGames
    from training.local.local_game_tls import LocalGameTLS, TLSMode
    from training.local.ray_cluster import LocalRayCluster
    from training.run.stop import StopRequest

# What runs against the started topology (training, evaluation, or both): its exit code.
Work = Callable[["Endpoints", "StopRequest"], int]


def run_local(
    topology: Topology,
    work: Work,
    *,
    run_dir: Path,
    env_id: str,
    envs_per_game: int,
    base_port: int | None,
    prog: str,
    max_game_restarts: int = 10,
    dashboard: bool = False,
    tls: TLSMode | None = None,
) -> int:
    """Start the topology, run `work` against its endpoints (the `uerl train` / `uerl eval`
    code paths), stop it all."""
    from training.local.local_game_tls import throwaway

    run_dir.mkdir(parents=True, exist_ok=True)
    game_tls = throwaway(run_dir, tls) if tls is not None else None
    cluster = _cluster(topology, run_dir, dashboard=dashboard)
    games = _games(
        topology,
        run_dir,
        env_id=env_id,
        envs_per_game=envs_per_game,
        base_port=base_port,
        max_restarts=max_game_restarts,
        game_tls=game_tls,
    )
    # Belt and braces: the `with` blocks stop everything, atexit covers sys.exit paths
    # taken from elsewhere; both stops are idempotent (_serve unregisters them).
    atexit.register(games.stop)
    atexit.register(cluster.stop)
    started = time.monotonic()
    code = _serve(
        topology, work, cluster, games, game_tls, run_dir=run_dir, prog=prog, started=started
    )
    _report_games(games, run_dir)
    print(f"{prog}: finished in {time.monotonic() - started:.1f}s (exit {code})", flush=True)
    return code


def _serve(
    topology: Topology,
    work: Work,
    cluster: LocalRayCluster,
    games: LocalMockGames,
    game_tls: LocalGameTLS | None,
    *,
    run_dir: Path,
    prog: str,
    started: float,
) -> int:
    """Start the games and the cluster, run `work` against their endpoints and stop them:
    the exit code of `work`, else 130 after Ctrl-C, 1 if the games or nodes failed."""
    from training.local.games import LocalGamesError
    from training.local.ray_cluster import LocalClusterError
    from training.local.scaling import LocalScaler
    from training.run.stop import StopRequest

    code = exit_status.FAILED
    scaler: LocalScaler | None = None
    try:
        with StopRequest() as stop:
            # A game past its restart cap ends training like a fatal error would,
            # after the iteration in progress and a final checkpoint.
            games.on_give_up = stop.fail
            print(
                f"{prog}: {topology.pattern}, {topology.workers.replicas} worker(s), "
                f"{topology.learners.replicas} learner(s); logs in {run_dir}",
                flush=True,
            )
            with games, cluster:
                stop.abort_if_signalled()  # a signal while they started
                endpoints = _endpoints(topology, cluster, games, game_tls)
                # `uerl local scale N --run-dir` reaches the session through it.
                scaler = LocalScaler(run_dir, cluster, games, endpoints, log=_print_line)
                scaler.publish(endpoints)
                scaler.start()
                print(_up_line(prog, cluster, games, game_tls, started), flush=True)
                print(
                    f"{prog}: metrics (Prometheus) of each Ray node, uerl's among Ray's: "
                    f"{', '.join(cluster.metrics_urls().values())}; scrape targets in "
                    f"{run_dir / METRICS_TARGETS_FILE} (file_sd)",
                    flush=True,
                )
                code = work(endpoints, stop)
    except KeyboardInterrupt:
        print(f"{prog}: aborted; everything started was stopped", file=sys.stderr)
        code = exit_status.INTERRUPTED
    except (LocalClusterError, LocalGamesError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        code = exit_status.FAILED
    finally:
        # After the games and nodes it may have started are stopped (see LocalScaler).
        if scaler is not None:
            scaler.stop()
        atexit.unregister(cluster.stop)
        atexit.unregister(games.stop)
    return code


# The nodes' metrics endpoints as a Prometheus file_sd file, kept as nodes come and go.
METRICS_TARGETS_FILE = "metrics_targets.json"


def _print_line(line: str) -> None:
    print(line, flush=True)


def _cluster(topology: Topology, run_dir: Path, *, dashboard: bool) -> LocalRayCluster:
    """The Ray nodes of `topology` on this machine (not started yet)."""
    from training.local.ray_cluster import LocalRayCluster, topology_node_specs

    return LocalRayCluster(
        topology_node_specs(topology),
        start_timeout_s=topology.ray.start_timeout_s,
        log_dir=run_dir / "logs",
        dashboard=dashboard,
        metrics_targets=run_dir / METRICS_TARGETS_FILE,
        metrics_labels={"stack": topology.name},
    )


def _games(
    topology: Topology,
    run_dir: Path,
    *,
    env_id: str,
    envs_per_game: int,
    base_port: int | None,
    max_restarts: int,
    game_tls: LocalGameTLS | None,
) -> LocalMockGames:
    """One mock game per worker of `topology` (+ discovery's own), not started yet."""
    from training.local.games import LocalMockGames

    return LocalMockGames(
        workers=topology.workers.replicas,
        env_id=env_id,
        envs_per_game=envs_per_game,
        run_dir=run_dir / "games",
        base_port=base_port,
        discovery_instance=topology.has_dedicated_discovery,
        startup_timeout_s=min(topology.simulator.startup_timeout_s, 120.0),
        max_restarts=max_restarts,
        extra_args=game_tls.server_args if game_tls else None,
        log=_print_line,
    )


def _endpoints(
    topology: Topology,
    cluster: LocalRayCluster,
    games: LocalMockGames,
    game_tls: LocalGameTLS | None,
) -> Endpoints:
    """The endpoints object of the started cluster and games (with the games' TLS)."""
    from training.local.local_endpoints import local_endpoints

    endpoints = local_endpoints(
        topology,
        gcs_address=cluster.address,
        client_port=cluster.client_port,
        base_port=games.base_port,
        dashboard_url=cluster.dashboard_url,
    )
    if game_tls is not None:
        endpoints = endpoints.model_copy(update={"tls": game_tls.client})
    return endpoints


def _up_line(
    prog: str,
    cluster: LocalRayCluster,
    games: LocalMockGames,
    game_tls: LocalGameTLS | None,
    started: float,
) -> str:
    """What is up, where, and how long it took to start."""
    tls = game_tls.mode if game_tls is not None else None
    return (
        f"{prog}: Ray at {cluster.address}, games "
        + ", ".join(f"{g.name}={g.endpoint}" for g in games.games)
        + (f" over {'mutual ' if tls == 'mutual' else ''}TLS" if tls else "")
        + f" (up in {time.monotonic() - started:.1f}s)"
        + (f"; dashboard and job API at {cluster.dashboard_url}" if cluster.dashboard else "")
    )


def _report_games(games: LocalMockGames, run_dir: Path) -> None:
    """Per-game session and step counts: proof each env runner used its own game."""
    if not games.stats:
        return
    (run_dir / "games.json").write_text(json.dumps(games.stats, indent=2, sort_keys=True))
    restarts = games.restarts()
    for name, stats in sorted(games.stats.items()):
        print(
            f"  {name}: {stats.get('sessions_opened', 0)} session(s), "
            f"{stats.get('steps', 0)} step RPCs, {stats.get('resets', 0)} resets, "
            f"{restarts.get(name, 0)} restart(s)",
            flush=True,
        )
