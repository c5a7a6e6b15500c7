"""A real Prometheus for the tests: Debian's package, fetched and cached by
tests/tools/prometheus.sh (outside the work tree), started on a free port of 127.0.0.1
with its storage in a temporary directory, scraping the targets of a Prometheus
`file_sd` file (what `uerl local` writes in its run directory) every second. Owned by a
`StartedProcesses` (stopped by pid: SIGTERM, then SIGKILL)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host_speed import guard
from proc_tree import StartedProcesses

from training.local.processes import free_port

PROJECT_ROOT = Path(__file__).resolve().parent.parent
FETCH_SCRIPT = PROJECT_ROOT / "tests" / "tools" / "prometheus.sh"
SCRAPE_INTERVAL_S = 1


def cached_binary() -> Path:
    """Where the script keeps the binary (it may not be there yet)."""
    text = FETCH_SCRIPT.read_text()
    (version,) = re.findall(r"^VERSION=(\S+)$", text, re.MULTILINE)
    cache = os.environ.get("UERL_PROMETHEUS_CACHE") or str(Path.home() / ".cache/uerl-prometheus")
    return Path(cache) / version / "usr" / "bin" / "prometheus"


def prometheus_binary() -> Path:
    """The cached binary, fetched first if it is not there (a second call: no download)."""
    done = subprocess.run(
        ["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, timeout=guard(300)
    )
    if done.returncode != 0:
        raise RuntimeError(f"{FETCH_SCRIPT.name} failed:\n{done.stderr}{done.stdout}")
    return Path(done.stdout.strip().splitlines()[-1])


def promtool_binary() -> Path:
    return prometheus_binary().with_name("promtool")


def config_for(targets_file: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "uerl-local",
                # Re-read every second as well as on change: the file may not exist yet
                # (the run writes it once its nodes are up), nor its directory.
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            }
        ],
    }


class PrometheusError(AssertionError):
    pass


def api_get(url: str, path: str, params: dict[str, Any] | None = None) -> Any:
    """A Prometheus HTTP API call's `data`; a refused query (400) raises with its reason."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"{url}{path}{query}", timeout=guard(30)) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as err:  # a bad query: 400 with Prometheus' reason
        body = json.loads(err.read() or b"{}")
    if body.get("status") != "success":
        raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[Any]
    log: Path

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        return api_get(self.url, path, params)

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """`expr` evaluated at Unix time `at`: [{"metric": labels, "value": [t, "v"]}]."""
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        return data["result"]

    def query_range(
        self, expr: str, start: float, end: float, step_s: float = 1.0
    ) -> list[dict[str, Any]]:
        """[{"metric": labels, "values": [[t, "v"], ...]}] from `start` to `end`."""
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
        )
        return data["result"]

    def active_targets(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/targets", {"state": "active"})["activeTargets"]

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start_prometheus(started: StartedProcesses, targets_file: Path, workdir: Path) -> Prometheus:
    """Prometheus scraping `targets_file`'s targets, ready to answer (its API up)."""
    binary = prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps(config_for(targets_file), indent=1))  # YAML reads JSON
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        proc = started.popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1d",
            ],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + guard(60)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited ({proc.returncode}):\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=guard(5)) as reply:
                if reply.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"prometheus not ready in time:\n{server.log_tail()}")
        time.sleep(0.2)
