"""Y mock UE servers (plus a discovery instance) as subprocesses on loopback.

Ports follow the endpoints contract's `per_worker` mode: worker i's game
listens on `base_port + i` (i = 1..Y) and the dedicated discovery instance on
`base_port` itself, so the whole set is one contiguous block.
Each server is `uerl mock-ue ... --stats-file F`; on SIGTERM it writes
{sessions opened/closed, steps, resets} to F, which `stop()` reads back.

Games are supervised as a Deployment or a restarting sidecar would be: one that
exits is started again on the same port after a backoff (`RestartPolicy`), its
log appended to, one plain line printed each time. Past the cap, `on_give_up`
is told why (the `uerl local` session then stops training).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.local import processes
from training.local.restart_policy import RestartPolicy
from training.run.stop import signals_held

HOST = "127.0.0.1"
READY_PREFIX = "mock-ue listening on"
# Ports kept free beyond the first games, for games a rescale adds.
PORT_HEADROOM = 16


class LocalGamesError(RuntimeError):
    """A mock game did not come up; the message names it and shows its log."""


@dataclass
class MockGame:
    name: str  # "ue-1" .. "ue-Y", "ue-disc"
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    stats_file: Path
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    started_at: float = field(default_factory=time.monotonic)
    restart_at: float | None = None  # pending restart (monotonic time)
    given_up: bool = False
    removed: bool = False  # stopped by a rescale: never restarted
    # Every incarnation writes its own stats file; stop() adds them up.
    stats_files: list[Path] = field(default_factory=list)
    # Where this process's lines begin: a kept run dir (`--resume`) holds an earlier
    # run's lines, its ready line among them.
    log_offset: int = 0

    def this_start(self) -> str:
        return processes.read_from(self.log, self.log_offset)

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class LocalMockGames(processes.StartedGroup):
    """Context manager: start the games, wait for each ready line, stop them, read stats."""

    def __init__(
        self,
        *,
        workers: int,
        env_id: str,
        envs_per_game: int,
        run_dir: Path,
        base_port: int | None = None,
        discovery_instance: bool = False,
        startup_timeout_s: float = 60.0,
        stop_grace_s: float = 10.0,
        extra_args: list[str] | None = None,
        max_restarts: int = 10,
        on_give_up: Callable[[str], None] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.workers = workers
        self.env_id = env_id
        self.envs_per_game = envs_per_game
        self.run_dir = run_dir
        # Room to grow (`uerl local scale`): game i listens on base_port + i.
        self.base_port = base_port or processes.free_port_block(workers + 1 + PORT_HEADROOM)
        self.discovery_instance = discovery_instance
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.extra_args = extra_args or []
        self.max_restarts = max_restarts
        self.on_give_up = on_give_up
        self.log = log
        self.games: list[MockGame] = []
        self.stats: dict[str, dict[str, Any]] = {}
        self._stopped = False
        self._stopping = threading.Event()
        # The supervisor and a rescale both touch `games`.
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None

    def worker_game(self, index: int) -> MockGame:
        return next(g for g in self.games if g.name == f"ue-{index}")

    @property
    def discovery_game(self) -> MockGame | None:
        return next((g for g in self.games if g.name == "ue-disc"), None)

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        plan = [(f"ue-{i}", self.base_port + i) for i in range(1, self.workers + 1)]
        if self.discovery_instance:
            plan.insert(0, ("ue-disc", self.base_port))
        for name, port in plan:
            with signals_held():  # a Ctrl-C now stops this game too
                self.games.append(self._launch(name, port))
        deadline = time.monotonic() + self.startup_timeout_s
        for game in self.games:
            self._wait_ready(game, deadline)
        self._supervisor = threading.Thread(
            target=self._supervise, name="uerl-local-games", daemon=True
        )
        self._supervisor.start()

    # -- rescale (`uerl local scale`) -------------------------------------------

    def worker_count(self) -> int:
        return sum(1 for g in self.games if g.name != "ue-disc")

    def add_worker_games(self, count: int) -> list[MockGame]:
        """Start games ue-(Y+1) .. ue-(Y+count) on their ports; return them once ready.
        If one cannot start, the ones this call started are stopped again (the next grow
        numbers its games from Y+1 as this one did) and the error is raised."""
        first = self.worker_count() + 1
        new: list[MockGame] = []
        try:
            for index in range(first, first + count):
                port = self.base_port + index
                if not processes.port_is_free(port, HOST):
                    raise LocalGamesError(
                        f"game ue-{index} needs port {port} (base port {self.base_port} + "
                        f"{index}), which another process holds"
                    )
                with signals_held():
                    game = self._launch(f"ue-{index}", port)
                    new.append(game)
                with self._lock:
                    self.games.append(game)
            deadline = time.monotonic() + self.startup_timeout_s
            for game in new:
                self._wait_ready(game, deadline)
        except BaseException:
            self.discard_worker_games(new)
            raise
        self.workers = self.worker_count()
        return new

    def discard_worker_games(self, games: list[MockGame]) -> None:
        """Stop games a failed grow started and forget them (stats and all): as if the grow
        had not happened."""
        with self._lock:
            for game in games:
                game.removed = True
            self.games = [g for g in self.games if g not in games]
        survivors = processes.terminate([g.proc for g in games], grace_s=self.stop_grace_s)
        self.workers = self.worker_count()
        if survivors:
            raise LocalGamesError(f"mock games survived SIGKILL: {sorted(survivors)}")

    def remove_worker_games(self, count: int) -> list[MockGame]:
        """Stop the last `count` worker games (highest index first), keeping their stats."""
        with self._lock:
            workers = [g for g in self.games if g.name != "ue-disc"]
            leaving = workers[len(workers) - count :]
            for game in leaving:
                game.removed = True
            self.games = [g for g in self.games if g not in leaving]
        survivors = processes.terminate([g.proc for g in leaving], grace_s=self.stop_grace_s)
        for game in leaving:
            self._collect_stats(game)
        self.workers = self.worker_count()
        if survivors:
            raise LocalGamesError(f"mock games survived SIGKILL: {sorted(survivors)}")
        return leaving

    def restarts(self) -> dict[str, int]:
        return {g.name: g.policy.restarts for g in self.games}

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every game (TERM, then KILL) and return {name: stats}; idempotent."""
        if self._stopped:
            return self.stats
        self._stopped = True
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=30)
        survivors = processes.terminate([g.proc for g in self.games], grace_s=self.stop_grace_s)
        for game in self.games:
            self._collect_stats(game)
        if survivors:
            raise LocalGamesError(f"mock games survived SIGKILL: {sorted(survivors)}")
        return self.stats

    def _collect_stats(self, game: MockGame) -> None:
        totals: dict[str, Any] = {}
        for path in game.stats_files:
            try:
                stats = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # killed before it could write: absent from the totals
            for key, value in stats.items():
                totals[key] = totals.get(key, 0) + value
        if totals:
            # A game that left and came back (scale down, then up) adds up.
            previous = self.stats.get(game.name, {})
            self.stats[game.name] = {
                k: previous.get(k, 0) + totals.get(k, 0) for k in {*previous, *totals}
            }

    def pids(self) -> set[int]:
        out: set[int] = set()
        for game in self.games:
            out |= processes.tree(game.proc.pid)
        return out

    def _launch(self, name: str, port: int) -> MockGame:
        log = self.run_dir / f"{name}.log"
        stats = self.run_dir / f"{name}.stats.json"
        offset = processes.log_end(log)
        proc = self._spawn(port, log, stats)
        return MockGame(
            name,
            port,
            proc,
            log,
            stats,
            policy=RestartPolicy(max_restarts=self.max_restarts),
            stats_files=[stats],
            log_offset=offset,
        )

    def _spawn(self, port: int, log: Path, stats: Path) -> subprocess.Popen[bytes]:
        stats.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "training.cli",
            "mock-ue",
            "--host",
            HOST,
            "--port",
            str(port),
            "--envs",
            str(self.envs_per_game),
            "--env",
            self.env_id,
            "--stats-file",
            str(stats),
            "--transport",
            self.transport,
            *self.extra_args,
        ]
        return processes.spawn(argv, log_path=log)

    @property
    def transport(self) -> str:
        """The compiled server when built (its CPU per call is a ninth of gRPC Python's, and
        the games share the cores with training here); gRPC Python for TLS games."""
        from training.clients import native

        tls = any(arg.startswith("--tls") for arg in self.extra_args)
        return "native" if native.available() and not tls else "grpcio"

    # ------------------------------------------------------------------ supervision

    def _supervise(self) -> None:
        while not self._stopping.wait(0.1):
            with self._lock:
                games = list(self.games)
            for game in games:
                if game.given_up or game.removed:
                    continue
                if game.restart_at is not None:
                    if time.monotonic() >= game.restart_at:
                        self._restart(game)
                elif game.proc.poll() is not None:
                    self._on_exit(game)

    def _on_exit(self, game: MockGame) -> None:
        how = describe_exit(game.proc.returncode)
        delay = game.policy.next_delay(uptime_s=time.monotonic() - game.started_at)
        if delay is None:
            game.given_up = True
            reason = (
                f"game {game.name} ({game.endpoint}) {how} after {game.policy.restarts} "
                f"restart(s) (cap {game.policy.max_restarts}, --game-restarts); "
                f"log: {game.log}"
            )
            self.log(f"uerl local: giving up: {reason}")
            if self.on_give_up is not None:
                self.on_give_up(reason)
            return
        game.restart_at = time.monotonic() + delay
        self.log(
            f"uerl local: game {game.name} ({game.endpoint}) {how}; restart "
            f"{game.policy.restarts}/{game.policy.max_restarts} in {delay:.1f} s "
            f"(log: {game.log})"
        )

    def _restart(self, game: MockGame) -> None:
        game.restart_at = None
        game.stats_file = self.run_dir / f"{game.name}.restart-{game.policy.restarts}.stats.json"
        game.stats_files.append(game.stats_file)
        with game.log.open("a") as fh:
            fh.write(f"--- uerl local: restart {game.policy.restarts} ---\n")
        game.log_offset = processes.log_end(game.log)
        with signals_held():
            game.proc = self._spawn(game.port, game.log, game.stats_file)
        game.started_at = time.monotonic()

    def _wait_ready(self, game: MockGame, deadline: float) -> None:
        while True:
            if game.proc.poll() is not None:
                raise LocalGamesError(
                    f"mock game {game.name} ({game.endpoint}) exited with code "
                    f"{game.proc.returncode}; last log lines ({game.log}):\n"
                    f"{processes.tail(game.log)}"
                )
            if READY_PREFIX in game.this_start():
                return
            if time.monotonic() > deadline:
                raise LocalGamesError(
                    f"mock game {game.name} did not print '{READY_PREFIX} ...' within "
                    f"{self.startup_timeout_s:.0f}s; last log lines ({game.log}):\n"
                    f"{processes.tail(game.log)}"
                )
            time.sleep(0.1)


def start_mock_at(env_id: str, num_envs: int, port: int, transport: str) -> subprocess.Popen[str]:
    """`uerl mock-ue` on `port` (0: any); RuntimeError if it does not start."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.cli",
            "mock-ue",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--envs",
            str(num_envs),
            "--env",
            env_id,
            "--transport",
            transport,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"mock-ue did not start: {line!r}")
    proc.address = line.split("listening on ", 1)[1].split()[0]  # type: ignore[attr-defined]
    return proc
