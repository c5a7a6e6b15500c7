"""`uerl local`: the whole topology on this machine, trained through the `uerl train` path."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path

import pytest
from local_runs import LocalRun, run_local, start, wait_for_line
from proc_tree import Deadline, StartedProcesses, TreeSampler, survivors

from training.rllib.ray_output import QUIET_TAG

ITERATIONS = 3

# A hang guard, for each module fixture's run with the first test using it, as for each
# test: a short run (a Ray start, games, three iterations) takes about a minute idle and
# up to 5x that beside the Go build and the Kubernetes tier. Each wait below ends before it.
pytestmark = pytest.mark.timeout(1200)


# What Ray and RLlib 2.60 print on every run, each from a different place: never on a
# run's console, all in its `logs/ray.log` (training.rllib.ray_output).
ROUTINE_NOISE = (
    "You are running PPO on the new API stack",  # the driver's RLlib logger
    "has constructor arguments in the object store",  # the driver's C++ core worker
    "RLModuleConfig",  # RLlib's own deprecated class, in driver, runners and learner
    "Setting up process group",  # Ray Train, in the learner actor
    "gputil",  # Ray Tune's utilisation monitor
)


def _run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pattern: str
) -> LocalRun:
    # Not `module_deadline`: that is set once for the module, and this runs once a pattern.
    deadline = Deadline.for_item(request.node, request.config)
    run_dir = tmp_path_factory.mktemp(f"local-{pattern}")
    sidecar = pattern == "sidecar"
    tls = [] if sidecar else ["--tls", "mutual"]
    run = run_local(
        run_dir,
        *tls,
        "--pattern",
        pattern,
        "--workers",
        "2",
        "--learners",
        "1",
        "--iterations",
        str(ITERATIONS),
        "--checkpoint-every",
        "2",
        "--train-batch-size",
        "500",
        "--minibatch-size",
        "100",
        timeout_s=deadline.left(),
        # README's first command, from a shell that exports RAY_AUTH_MODE=token (an
        # earlier in-process `ray.init` or the user's profile may).
        through_make=sidecar,
        env={**os.environ, "RAY_AUTH_MODE": "token"} if sidecar else None,
    )
    print(
        f"\n[{pattern}] wall {run.wall_s:.1f}s, peak RSS of the tree "
        f"{run.peak_rss_bytes / 2**20:.0f} MiB, {len(run.pids)} processes"
    )
    return run


@pytest.fixture(scope="module")
def readme_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> LocalRun:
    """The sidecar run (`make test`), plaintext, as README's `make local ARGS="..."`: the
    one run that README's, the console's and every plain run's checks are made on."""
    return _run(request, tmp_path_factory, "sidecar")


# The sidecar run in `make test`; the networked one, a second full run, in `make
# test-slow`, over mutual TLS (`--tls mutual`).
@pytest.fixture(
    scope="module", params=["sidecar", pytest.param("networked", marks=pytest.mark.slow)]
)
def local_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LocalRun:
    if request.param == "sidecar":
        return request.getfixturevalue("readme_run")
    return _run(request, tmp_path_factory, request.param)


def test_exits_zero(local_run: LocalRun) -> None:
    assert local_run.returncode == 0, local_run.output


def test_games_serve_the_transport_asked_for(local_run: LocalRun) -> None:
    endpoints = json.loads((local_run.run_dir / "endpoints.json").read_text())
    ready_lines = [
        line
        for log in sorted((local_run.run_dir / "games").glob("*.log"))
        for line in log.read_text().splitlines()
        if line.startswith("mock-ue listening on")
    ]
    assert len(ready_lines) >= 2
    if "--tls" in local_run.args:
        # A throwaway CA in the run directory; env runners present its certificate.
        tls = endpoints["tls"]
        assert tls["ca_path"] == str(local_run.run_dir / "tls" / "ca.crt")
        assert (tls["cert_path"], tls["key_path"]) == (
            str(local_run.run_dir / "tls" / "tls.crt"),
            str(local_run.run_dir / "tls" / "tls.key"),
        )
        assert all(line.endswith(", mutual TLS)") for line in ready_lines), ready_lines
    else:
        assert endpoints["tls"] is None
        assert all(line.endswith(", plaintext)") for line in ready_lines), ready_lines


def test_prints_a_progress_line_per_iteration(local_run: LocalRun) -> None:
    lines = [line for line in local_run.output.splitlines() if line.startswith("iter ")]
    assert len(lines) == ITERATIONS
    assert all("steps/s" in line and "return mean" in line for line in lines)


def test_every_worker_game_served_its_own_env_runner(local_run: LocalRun) -> None:
    games = local_run.games
    for worker in ("ue-1", "ue-2"):
        # The env runner's session stepped its game; discovery may add one stepless session.
        assert games[worker]["sessions_opened"] >= 1, games
        assert games[worker]["steps"] > 0, games


def test_sessions_are_closed_when_the_run_ends(local_run: LocalRun) -> None:
    for name, stats in local_run.games.items():
        assert (
            stats["sessions_closed"] + stats.get("sessions_superseded", 0)
            == stats["sessions_opened"]
        ), name


def test_discovery_goes_to_the_patterns_discovery_game(local_run: LocalRun) -> None:
    games = local_run.games
    if "networked" in local_run.args:
        # Dedicated instance: one stepless discovery session; ue-1 serves only its runner.
        assert (games["ue-disc"]["sessions_opened"], games["ue-disc"]["steps"]) == (1, 0)
        assert games["ue-1"]["sessions_opened"] == 1
    else:
        # Sidecar: the discovery task asked worker 1's own game, then its runner connected.
        assert "ue-disc" not in games
        assert games["ue-1"]["sessions_opened"] == 2
    assert games["ue-2"]["sessions_opened"] == 1  # its runner's alone


def test_checkpoints_every_k_and_at_the_end(local_run: LocalRun) -> None:
    names = sorted(p.name for p in local_run.checkpoints.glob("checkpoint_*"))
    assert names == ["checkpoint_000002", "checkpoint_000003"]
    assert (local_run.checkpoints / "latest").read_text() == "checkpoint_000003"


def test_writes_metrics_csv_and_learning_curve(local_run: LocalRun) -> None:
    with (local_run.run_dir / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3]
    assert int(rows[-1]["env_steps_total"]) >= ITERATIONS * 500
    png = (local_run.run_dir / "learning_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_leaves_no_process_behind(local_run: LocalRun) -> None:
    # raylets, GCS, agents, Ray workers, mock games: all were seen, none survive.
    assert len(local_run.pids) > 10
    assert survivors(local_run.pids) == set()


# Ctrl-C. SIGTERM and SIGHUP take the same path (`StopRequest`); SIGTERM during training
# is proven by tests/test_ray_jobs.py (`ray job stop`), and to `uerl local` during start-up
# below.
def test_ctrl_c_during_training_stops_cleanly_with_a_final_checkpoint(
    tmp_path: Path, started: StartedProcesses, deadline: Deadline
) -> None:
    proc = start(
        started,
        tmp_path,
        "--workers",
        "2",
        "--learners",
        "1",
        "--iterations",
        "100",
        "--checkpoint-every",
        "50",
        "--train-batch-size",
        "500",
        "--minibatch-size",
        "100",
    )
    with TreeSampler(proc.pid) as sampler:
        seen = wait_for_line(proc, "iter    1 |", timeout_s=deadline.left())
        os.kill(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=deadline.left())
    assert proc.returncode == 130, seen + rest
    latest = (tmp_path / "checkpoints" / "latest").read_text()
    assert (tmp_path / "checkpoints" / latest).is_dir()
    assert survivors(sampler.pids - {proc.pid}) == set()


def test_signal_during_startup_stops_everything_started_so_far(
    tmp_path: Path, started: StartedProcesses, deadline: Deadline
) -> None:
    proc = start(started, tmp_path, "--workers", "2", "--learners", "1", "--iterations", "100")
    with TreeSampler(proc.pid, interval_s=0.1) as sampler:
        seen = wait_for_line(proc, "logs in", timeout_s=deadline.left())
        time.sleep(2)  # nodes and games are starting
        os.kill(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=deadline.left())
    assert proc.returncode == 130, seen + rest
    assert len(sampler.pids) > 1
    assert survivors(sampler.pids - {proc.pid}) == set()


def test_make_local_trains_end_to_end(readme_run: LocalRun) -> None:
    # README's first command (`make local`, its ARGS short), whose last line says so.
    assert readme_run.args[:2] == ("make", "local")
    assert readme_run.returncode == 0, readme_run.output[-6000:]
    assert "done in" in readme_run.output
    assert f"{ITERATIONS} iteration(s) recorded" in readme_run.output
    assert (readme_run.run_dir / "metrics.csv").is_file()


def test_an_inherited_ray_auth_mode_does_not_break_the_run(readme_run: LocalRun) -> None:
    # A shell (or an earlier in-process `ray.init`) may export RAY_AUTH_MODE=token; the
    # local cluster runs without auth, and its driver must agree (the README run has it).
    assert readme_run.returncode == 0, readme_run.output
    assert "iter    1 |" in readme_run.output


def test_a_training_run_prints_none_of_rays_routine_lines_and_logs_them(
    readme_run: LocalRun,
) -> None:
    assert readme_run.returncode == 0, readme_run.output
    shown = [noise for noise in ROUTINE_NOISE if noise in readme_run.output]
    assert shown == [], readme_run.output
    assert QUIET_TAG not in readme_run.output
    logged = (readme_run.run_dir / "logs" / "ray.log").read_text()
    assert "Setting up process group" in logged  # from the learner actor
    assert "has constructor arguments in the object store" in logged  # the driver's C++ core
