"""The console of a run: uerl's lines and real problems; Ray's and RLlib's chatter in a log.

Units: the worker-side tagging, the driver's handling of the actors' lines and of
its own Ray loggers, the stderr filter. End to end (`uerl train` / `uerl local` as
subprocesses on real `ray start` clusters): an env runner that cannot start still
shows its error on the console (that a normal run prints none of Ray's routine lines,
which are in `<run-dir>/logs/ray.log`, is tests/test_local_e2e.py's, on its README run).
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from host_speed import CLUSTER_START_S
from proc_tree import Deadline

from training.rllib.ray_output import (
    CORE_WORKER_NOISE,
    QUIET_TAG,
    RayConsole,
    _StderrFilter,
    _TagRoutine,
    _WorkerLines,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CORE_WORKER_LINE = (
    "[2026-11-23 09:01:35,418 E 25085 25085] core_worker.cc:2465: Actor with class name: "
    "'UEEnvRunner' and ID: 'ca1c23f0190713e660e3999901000000' has constructor arguments in "
    "the object store and max_restarts > 0. If the arguments in the object store go out of "
    "scope or are lost, the actor restart will fail."
)


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("ray.rllib.x", level, __file__, 1, message, None, None)


def test_every_line_of_a_worker_record_below_error_is_tagged() -> None:
    text = _TagRoutine(None).format(_record(logging.WARNING, "first\nsecond"))
    assert text.split("\n") == [QUIET_TAG + "first", QUIET_TAG + "second"]


def test_worker_errors_are_not_tagged() -> None:
    assert _TagRoutine(None).format(_record(logging.ERROR, "boom")) == "boom"


def _actor_lines(*lines: str) -> dict[str, Any]:
    return {"lines": list(lines), "pid": 4242, "ip": "127.0.0.2", "actor_name": "UEEnvRunner"}


@pytest.fixture
def worker_lines() -> Iterator[tuple[_WorkerLines, list[dict[str, Any]], io.StringIO]]:
    printed: list[dict[str, Any]] = []
    logged = io.StringIO()
    logger = logging.getLogger("uerl.test_ray_output")
    handler = logging.StreamHandler(logged)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield _WorkerLines(printed.append, logger), printed, logged
    logger.removeHandler(handler)


ROUTINE_ACTOR_LINES = (
    QUIET_TAG + "DeprecationWarning: `RLModule(config=[RLModuleConfig object])` ...",
    "2026-11-23 09:01:50,666\tWARNING rl_module.py:463 -- DeprecationWarning: ...",
)
ERROR_ACTOR_LINES = (
    "Traceback (most recent call last):",
    "training.protocol.errors.UEUnavailableError: UE game at 127.0.0.1:9 ...",
)


def test_the_console_gets_only_the_actors_untagged_lines(
    worker_lines: tuple[_WorkerLines, list[dict[str, Any]], io.StringIO],
) -> None:
    handle, printed, _ = worker_lines
    handle(_actor_lines(*ROUTINE_ACTOR_LINES, *ERROR_ACTOR_LINES))
    assert [batch["lines"] for batch in printed] == [list(ERROR_ACTOR_LINES)]
    assert printed[0]["pid"] == 4242  # Ray's printer still gets who printed it


def test_the_log_gets_every_actor_line_untagged_with_who_printed_it(
    worker_lines: tuple[_WorkerLines, list[dict[str, Any]], io.StringIO],
) -> None:
    handle, _, logged = worker_lines
    handle(_actor_lines(*ROUTINE_ACTOR_LINES, *ERROR_ACTOR_LINES))
    lines = logged.getvalue().splitlines()
    assert len(lines) == 4
    assert all(line.startswith("(UEEnvRunner pid=4242, ip=127.0.0.2) ") for line in lines)
    assert QUIET_TAG not in logged.getvalue()


def test_driver_ray_warnings_go_to_the_log_and_errors_also_to_the_console(
    tmp_path: Path,
) -> None:
    console_out = io.StringIO()
    logger = logging.getLogger("ray.uerl_test_ray_output")
    handler = logging.StreamHandler(console_out)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with RayConsole(tmp_path / "ray.log"):
            logger.warning("routine notice")
            logger.error("real problem")
        logger.warning("after the run")
    finally:
        logger.removeHandler(handler)
    assert console_out.getvalue().splitlines() == ["real problem", "after the run"]
    logged = (tmp_path / "ray.log").read_text()
    assert "routine notice" in logged and "real problem" in logged
    assert "after the run" not in logged


def test_verbose_leaves_ray_output_alone(tmp_path: Path) -> None:
    with RayConsole(tmp_path / "ray.log", verbose=True) as console:
        assert console.runtime_env("127.0.0.2:6379") is None
        assert console.capture_worker_output() is False
    assert not (tmp_path / "ray.log").exists()


def test_the_stderr_filter_moves_only_the_core_worker_line_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "ray.log"
    with _StderrFilter(CORE_WORKER_NOISE, log):
        os.write(2, f"before\n{CORE_WORKER_LINE}\nF fatal: check failed\n".encode())
    err = capfd.readouterr().err
    assert err.splitlines() == ["before", "F fatal: check failed"]
    assert log.read_text().strip() == CORE_WORKER_LINE


# ---------------------------------------------------------------------- end to end


@pytest.fixture
def one_worker_cluster() -> Iterator[Any]:
    from training.local.ray_cluster import LocalRayCluster, node_specs

    specs = node_specs(
        learners=0, learner_cpus=1, workers=1, worker_cpus=1, custom_resource="ue_worker"
    )
    with LocalRayCluster(specs, start_timeout_s=CLUSTER_START_S) as cluster:
        yield cluster


# A hang guard: a Ray cluster and a short run, minutes at most on a loaded host.
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_an_env_runner_that_cannot_start_shows_its_error_on_the_console(
    one_worker_cluster: Any,
    mock_ue: Callable[..., Any],
    closed_port: int,
    tmp_path: Path,
    deadline: Deadline,
) -> None:
    from infra.topology import Topology
    from training.local.local_endpoints import local_endpoints

    discovery = mock_ue("CartPole-v1")  # discovery answers; the runner's own game does not
    topology = Topology.parse(
        {"pattern": "networked", "learners": {"replicas": 0}, "workers": {"replicas": 1}}
    )
    endpoints = local_endpoints(
        topology,
        gcs_address=one_worker_cluster.address,
        client_port=one_worker_cluster.client_port,
        base_port=closed_port,
    ).model_copy(
        update={
            "discovery_endpoint": discovery.address,
            "worker_url_template": "127.0.0.1",
            "port": closed_port,
            "port_offset_mode": "fixed",
            "simulator_startup_timeout_s": 2.0,
        }
    )
    endpoints_file = tmp_path / "endpoints.json"
    endpoints_file.write_text(endpoints.to_json())
    argv = ["train", "--endpoints", str(endpoints_file), "--run-dir", str(tmp_path / "run")]
    run = subprocess.run(
        [sys.executable, "-m", "training.cli", *argv, "--iterations", "1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=deadline.left(),
    )
    console = run.stdout + run.stderr
    assert run.returncode == 1, console
    assert "none of the 1 env runner(s) started" in console
    # The runner's own error, as its actor printed it: which game did not answer.
    endpoint = f"127.0.0.1:{closed_port}"
    assert any(
        "EnvRunner pid=" in line and endpoint in line and "UEConnectionError" in line
        for line in console.splitlines()
    ), console
