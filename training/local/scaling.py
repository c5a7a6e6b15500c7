"""`uerl local scale N`: change a running `uerl local` session's number of workers.

The session owns its raylets and games, so the change happens in the session
process: `uerl local scale` drops a request in the run directory's `control/`
and waits for the answer; the session's scaler thread applies it and rewrites
`endpoints.json`, which the training (in the session, or a `ray job submit`ted
`uerl train --endpoints` against `uerl local serve`) follows between iterations,
exactly as it follows the ConfigMap after a `pulumi up` on a cluster.

Growing starts the games and worker nodes first, then publishes the endpoints; a grow
that fails stops the games and nodes it started, so nothing of it is left.
Shrinking publishes first, waits (bounded) until the training has released the
worker nodes it no longer needs, then stops idle nodes and the games that left.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from training.local import processes

if TYPE_CHECKING:
    from infra.endpoints import Endpoints
    from training.local.games import LocalMockGames
    from training.local.ray_cluster import LocalRayCluster

CONTROL_DIR = "control"
SESSION_FILE = "session.json"
REQUEST_FILE = "scale.request.json"
RESULT_FILE = "scale.result.json"
ENDPOINTS_FILE = "endpoints.json"
POLL_S = 0.25
# How long a shrink waits for the training to release the nodes it stops.
RELEASE_TIMEOUT_S = 120.0
MAX_WORKERS = 64


class ScaleError(RuntimeError):
    """The request could not be made or applied; the message says why."""


@dataclass(frozen=True)
class ScaleResult:
    request_id: str
    ok: bool
    workers: int
    message: str


def write_atomically(path: Path, text: str) -> None:
    """Readers (the training, re-reading each iteration) never see half a file."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- the CLI side --------------------------------------------------------------


def request_scale(run_dir: Path, workers: int, *, timeout_s: float) -> ScaleResult:
    """Ask the session running in `run_dir` for `workers` workers; wait for its answer."""
    if not 0 <= workers <= MAX_WORKERS:
        raise ScaleError(f"workers {workers}: must be between 0 and {MAX_WORKERS}")
    control = run_dir / CONTROL_DIR
    session = _read_json(control / SESSION_FILE)
    if session is None or not _alive(int(session.get("pid", 0))):
        raise ScaleError(
            f"no `uerl local` session is running in {run_dir} (no live {CONTROL_DIR}/"
            f"{SESSION_FILE}); start one with `uerl local --run-dir {run_dir}` or "
            f"`uerl local serve --run-dir {run_dir}`"
        )
    request_id = secrets.token_hex(6)
    write_atomically(control / REQUEST_FILE, json.dumps({"id": request_id, "workers": workers}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = _read_json(control / RESULT_FILE)
        if result is not None and result.get("id") == request_id:
            return ScaleResult(
                request_id, bool(result["ok"]), int(result["workers"]), result["message"]
            )
        if not _alive(int(session["pid"])):
            raise ScaleError(f"the session (pid {session['pid']}) ended before it answered")
        time.sleep(POLL_S)
    raise ScaleError(
        f"the session did not finish scaling to {workers} within {timeout_s:g} s; it may "
        f"still be working on it (see its output, and {control / RESULT_FILE})"
    )


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    return pid > 0 and bool(processes.alive({pid}))


# -- the session side ----------------------------------------------------------


class LocalScaler:
    """The session's scaler thread: applies requests to its cluster, games and endpoints.

    A long-lived thread on purpose: what it starts gets a parent-death signal tied to
    the thread that spawned it (`processes.spawn`), so the thread outlives them."""

    def __init__(
        self,
        run_dir: Path,
        cluster: LocalRayCluster,
        games: LocalMockGames,
        endpoints: Endpoints,
        *,
        log: Callable[[str], None],
        release_timeout_s: float = RELEASE_TIMEOUT_S,
    ) -> None:
        self.run_dir = run_dir
        self.control = run_dir / CONTROL_DIR
        self.cluster = cluster
        self.games = games
        self.endpoints = endpoints
        self.log = log
        self.release_timeout_s = release_timeout_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._handled: str | None = None

    def publish(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        write_atomically(self.run_dir / ENDPOINTS_FILE, endpoints.to_json())

    def start(self) -> None:
        self.control.mkdir(parents=True, exist_ok=True)
        (self.control / REQUEST_FILE).unlink(missing_ok=True)
        write_atomically(self.control / SESSION_FILE, json.dumps({"pid": os.getpid()}))
        self._thread = threading.Thread(target=self._serve, name="uerl-local-scale", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        (self.control / SESSION_FILE).unlink(missing_ok=True)

    def _serve(self) -> None:
        while not self._stopping.wait(POLL_S):
            request = _read_json(self.control / REQUEST_FILE)
            if request is None or request.get("id") == self._handled:
                continue
            self._handled = request.get("id")
            try:
                message = self.scale(int(request["workers"]))
                ok = True
            except Exception as exc:  # reported to the caller; the session goes on
                why = str(exc) or type(exc).__name__
                message, ok = f"scale to {request.get('workers')} failed: {why}", False
            self.log(f"uerl local: {message}")
            result = {
                "id": self._handled,
                "ok": ok,
                "workers": self.endpoints.num_env_runners,
                "message": message,
            }
            write_atomically(self.control / RESULT_FILE, json.dumps(result))

    def scale(self, workers: int) -> str:
        """Apply `workers`; a line saying what changed."""
        before = self.endpoints.num_env_runners
        started = time.monotonic()
        if workers == before:
            return f"already {workers} worker(s)"
        if workers > before:
            # Each step stops what it started if it fails; a failed grow leaves the session
            # as it was (the next one numbers its games as this one did).
            games = self.games.add_worker_games(workers - before)
            try:
                nodes = self.cluster.add_worker_nodes(workers - before)
            except BaseException:
                self.games.discard_worker_games(games)
                raise
            self.publish(self.endpoints.model_copy(update={"num_env_runners": workers}))
            what = (
                f"started {', '.join(g.name for g in games)} and worker node(s) {', '.join(nodes)}"
            )
        else:
            self.publish(self.endpoints.model_copy(update={"num_env_runners": workers}))
            nodes = self._nodes_to_stop(before - workers)
            self.cluster.remove_worker_nodes(nodes)
            games = self.games.remove_worker_games(before - workers)
            what = (
                f"stopped {', '.join(g.name for g in games)} and worker node(s) {', '.join(nodes)}"
            )
        return (
            f"scale {before} -> {workers} worker(s): {what} in "
            f"{time.monotonic() - started:.1f} s; {ENDPOINTS_FILE} lists {workers} game(s)"
        )

    def _nodes_to_stop(self, count: int) -> list[str]:
        """Idle worker nodes (the training released their env runners), newest first; after
        the release timeout, busy ones too (their runners are lost, as on a cluster)."""
        deadline = time.monotonic() + self.release_timeout_s
        while True:
            nodes = self.cluster.worker_nodes()
            busy = self.cluster.busy_worker_nodes()
            idle = [n for n in reversed(nodes) if n not in busy]
            if len(idle) >= count:
                return idle[:count]
            if time.monotonic() > deadline or self._stopping.is_set():
                break
            time.sleep(POLL_S)
        chosen = idle + [n for n in reversed(nodes) if n in busy][: count - len(idle)]
        self.log(
            f"uerl local: the training still uses {', '.join(sorted(set(chosen) & busy))} "
            f"after {self.release_timeout_s:g} s; stopping them anyway"
        )
        return chosen
