"""Y mock UE servers (plus a discovery instance) as subprocesses on loopback.

Ports follow the endpoints contract's `per_worker` mode: worker i's game
listens on `base_port + i` (i = 1..Y) and the dedicated discovery instance on
`base_port` itself, so the whole set is one contiguous block.
Each server is `uerl mock-ue ... --stats-file F`; on SIGTERM it writes
{sessions opened/closed, steps, resets} to F, which `stop()` reads back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.local import processes

HOST = "127.0.0.1"
READY_PREFIX = "mock-ue listening on"


class LocalGamesError(RuntimeError):
    """A mock game did not come up; the message names it and shows its log."""


@dataclass
class MockGame:
    name: str  # "ue-1" .. "ue-Y", "ue-disc"
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    stats_file: Path

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"


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
    ) -> None:
        self.workers = workers
        self.env_id = env_id
        self.envs_per_game = envs_per_game
        self.run_dir = run_dir
        self.base_port = base_port or processes.free_port_block(workers + 1)
        self.discovery_instance = discovery_instance
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.extra_args = extra_args or []
        self.games: list[MockGame] = []
        self.stats: dict[str, dict[str, Any]] = {}
        self._stopped = False

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
            self.games.append(self._launch(name, port))
        deadline = time.monotonic() + self.startup_timeout_s
        for game in self.games:
            self._wait_ready(game, deadline)

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every game (TERM, then KILL) and return {name: stats}; idempotent."""
        if self._stopped:
            return self.stats
        self._stopped = True
        survivors = processes.terminate([g.proc for g in self.games], grace_s=self.stop_grace_s)
        for game in self.games:
            try:
                self.stats[game.name] = json.loads(game.stats_file.read_text())
            except (OSError, ValueError):
                continue  # killed before it could write: absent from stats
        if survivors:
            raise LocalGamesError(f"mock games survived SIGKILL: {sorted(survivors)}")
        return self.stats

    def pids(self) -> set[int]:
        out: set[int] = set()
        for game in self.games:
            out |= processes.tree(game.proc.pid)
        return out

    def _launch(self, name: str, port: int) -> MockGame:
        log = self.run_dir / f"{name}.log"
        stats = self.run_dir / f"{name}.stats.json"
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
            *self.extra_args,
        ]
        proc = processes.spawn(argv, log_path=log)
        return MockGame(name, port, proc, log, stats)

    def _wait_ready(self, game: MockGame, deadline: float) -> None:
        while True:
            if game.proc.poll() is not None:
                raise LocalGamesError(
                    f"mock game {game.name} ({game.endpoint}) exited with code "
                    f"{game.proc.returncode}; last log lines ({game.log}):\n"
                    f"{processes.tail(game.log)}"
                )
            try:
                if READY_PREFIX in game.log.read_text(errors="replace"):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LocalGamesError(
                    f"mock game {game.name} did not print '{READY_PREFIX} ...' within "
                    f"{self.startup_timeout_s:.0f}s; last log lines ({game.log}):\n"
                    f"{processes.tail(game.log)}"
                )
            time.sleep(0.1)
