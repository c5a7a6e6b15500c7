"""The Ray Jobs flow, for real: `ray job submit ... -- uerl train` against a cluster with
a dashboard (`uerl local serve`: real raylets, mock games, job API on 127.0.0.2).

While the job trains, `uerl eval` is refused (its runners would need the games the
job's runners hold); `ray job stop` ends the job with a final checkpoint; then
`uerl eval` and `uerl export` run on that checkpoint, against the same games.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from host_speed import guard
from local_runs import PROJECT_ROOT, wait_for_line
from proc_tree import Deadline, StartedProcesses

from training.local.ray_cluster import TEMP_ROOT

# A hang guard for the module fixtures' set-up with the first test (a served cluster, a
# job to its first checkpoint, two refused evals, the job's stop: a few minutes idle, up
# to 5x that beside the Go build and the Kubernetes tier), as for each test. The waits
# below end before it, each phase's within its own generous cap.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

RAY = str(Path(sys.executable).with_name("ray"))
RUNNERS = re.compile(r"\| runners (\d+)/(\d+)(?:, (\d+) unknown)?$")
JOB_ID = f"uerl-test-{os.getpid()}"


@dataclass
class Served:
    proc: subprocess.Popen[str]
    run_dir: Path
    endpoints_file: Path
    dashboard_url: str


def cli_env() -> dict[str, str]:
    # The CLI talks to this cluster only, with its auth mode.
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}


def ray_cli(*args: str, timeout_s: float = guard(300)) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RAY, *args],
        cwd=PROJECT_ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def uerl(*args: str, timeout_s: float = guard(600)) -> subprocess.CompletedProcess[str]:
    """`uerl ARGS`; killed after `timeout_s`, then returned as killed (-SIGKILL)."""
    argv = [sys.executable, "-m", "training.cli", *args]
    try:
        return subprocess.run(
            argv,
            cwd=PROJECT_ROOT,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        err += f"\n(killed after {timeout_s}s)"
        return subprocess.CompletedProcess(argv, -signal.SIGKILL, out, err)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    started_for_module: StartedProcesses,
    module_deadline: Deadline,
) -> Iterator[Served]:
    run_dir = tmp_path_factory.mktemp("serve")
    proc = started_for_module.popen(
        [sys.executable, "-m", "training.cli", "local", "serve", "--workers", "2",
         "--learners", "0", "--run-dir", str(run_dir)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    # Stopped (SIGTERM, then SIGKILL of its whole tree) by `started_for_module`.
    wait_for_line(proc, "Ctrl-C stops everything", timeout_s=module_deadline.left(guard(450)))
    endpoints_file = run_dir / "endpoints.json"
    url = json.loads(endpoints_file.read_text())["ray"]["dashboard_url"]
    yield Served(proc, run_dir, endpoints_file, url)


def job_status(served: Served) -> str:
    # The SDK, not `ray job status`: the CLI words each terminal state differently.
    from ray.job_submission import JobSubmissionClient

    return str(JobSubmissionClient(served.dashboard_url).get_job_status(JOB_ID).value)


def job_logs(served: Served) -> str:
    """What `ray job logs` shows: the job's own output."""
    done = ray_cli("job", "logs", "--address", served.dashboard_url, JOB_ID)
    return done.stdout


@dataclass
class JobRun:
    logs: str
    status: str
    train_dir: Path
    eval_while_training: subprocess.CompletedProcess[str]
    client_eval_while_training: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def job(
    served: Served, tmp_path_factory: pytest.TempPathFactory, module_deadline: Deadline
) -> JobRun:
    train_dir = tmp_path_factory.mktemp("job") / "train"
    submitted = ray_cli(
        "job", "submit", "--address", served.dashboard_url, "--submission-id", JOB_ID,
        "--working-dir", ".", "--no-wait", "--",
        "uerl", "train", "--endpoints", str(served.endpoints_file), "--run-dir", str(train_dir),
        "--iterations", "200", "--checkpoint-every", "2",
        "--train-batch-size", "500", "--minibatch-size", "100",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    deadline = time.monotonic() + module_deadline.left(guard(600))
    while not (train_dir / "checkpoints" / "latest").is_file():
        assert time.monotonic() < deadline, job_logs(served)
        assert job_status(served) in ("RUNNING", "PENDING"), job_logs(served)
        time.sleep(2)
    # The job's env runners hold both games now.
    refused = uerl(
        "eval", "--endpoints", str(served.endpoints_file),
        "--checkpoint", str(train_dir / "checkpoints"), "--episodes", "2",
        "--preflight-timeout", "60", "--output", str(train_dir / "refused.json"),
        timeout_s=module_deadline.left(guard(600)),
    )  # fmt: skip
    # The same through Ray Client (`ray://`), where the driver sees no per-node usage.
    client_address = json.loads(served.endpoints_file.read_text())["ray"]["client_address"]
    refused_via_client = uerl(
        "eval", "--endpoints", str(served.endpoints_file), "--ray-address", client_address,
        "--checkpoint", str(train_dir / "checkpoints"), "--episodes", "2",
        "--preflight-timeout", "60", "--timeout", "180",
        "--output", str(train_dir / "refused-client.json"),
        timeout_s=module_deadline.left(guard(600)),
    )  # fmt: skip
    if "Starting Ray client server failed" in refused_via_client.stderr:
        # The proxier's per-client server logs only inside the cluster's session
        # directory, which goes with the cluster: keep it in the failure message.
        refused_via_client.stderr += "".join(
            f"\n--- {err} ---\n{err.read_text(errors='replace')[-4000:]}"
            for err in Path(TEMP_ROOT).glob("uerl-*/*/session_*/logs/ray_client_server_*.err")
            if err.stat().st_mtime > time.time() - 600
        )
    assert job_status(served) == "RUNNING", job_logs(served)
    stopped = ray_cli(
        "job", "stop", "--address", served.dashboard_url, JOB_ID,
        timeout_s=module_deadline.left(guard(450)),
    )  # fmt: skip
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    deadline = time.monotonic() + module_deadline.left(guard(300))
    while (status := job_status(served)) in ("RUNNING", "PENDING"):
        assert time.monotonic() < deadline
        time.sleep(2)
    logs = job_logs(served)
    print(f"\n--- ray job logs {JOB_ID} ---\n{logs}")
    return JobRun(logs, status, train_dir, refused, refused_via_client)


def test_the_job_finds_its_endpoints_and_prints_progress_lines(job: JobRun) -> None:
    assert "preflight ok" in job.logs
    progress = [line for line in job.logs.splitlines() if line.startswith("iter ")]
    assert len(progress) >= 2, job.logs
    # Both runners reported this iteration, each with its game answering: a runner
    # without a fresh report would show as `runners 1/2, 1 unknown`.
    runners = [RUNNERS.search(line) for line in progress]
    assert all(m is not None and m.groups() == ("2", "2", None) for m in runners), job.logs


def test_the_job_writes_checkpoints_metrics_and_tensorboard_events(job: JobRun) -> None:
    assert (job.train_dir / "checkpoints" / "latest").is_file()
    assert (job.train_dir / "metrics.csv").is_file()
    assert list(job.train_dir.glob("events.out.tfevents.*"))


def test_ray_job_stop_ends_with_a_final_checkpoint(job: JobRun) -> None:
    assert job.status == "STOPPED"
    assert "SIGTERM: stopping after this iteration" in job.logs
    last = job.logs.rsplit("iter ", 1)[1].split("|", 1)[0].strip()
    latest = (job.train_dir / "checkpoints" / "latest").read_text()
    assert latest == f"checkpoint_{int(last):06d}", job.logs


def test_eval_is_refused_while_the_job_holds_the_games(job: JobRun) -> None:
    refused = job.eval_while_training
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "the games are in use" in refused.stderr
    assert "hold 2 of 2 unit(s) of 'ue_worker'" in refused.stderr


def test_eval_through_ray_client_is_refused_while_the_job_holds_the_games(job: JobRun) -> None:
    refused = job.client_eval_while_training
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "the games are in use" in refused.stderr, refused.stdout + refused.stderr
    assert "hold 2 of 2 unit(s) of 'ue_worker'" in refused.stderr


def test_eval_after_the_job_reports_per_policy_returns(served: Served, job: JobRun) -> None:
    report_file = job.train_dir / "eval.json"
    done = uerl(
        "eval", "--endpoints", str(served.endpoints_file),
        "--checkpoint", str(job.train_dir / "checkpoints"), "--episodes", "4",
        "--output", str(report_file),
    )  # fmt: skip
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_file.read_text())
    assert report["episodes"] == 4 and not report["explore"]
    stats = report["policies"]["cartpole"]
    assert stats["episodes"] == 4
    # CartPole pays 1 per step and truncates at 500 steps: an episode's return is its length.
    assert stats["return_mean"] == stats["episode_len_mean"], stats
    assert stats["return_min"] >= 1.0 and stats["return_max"] <= 500.0, stats
    # Both games played: one eval runner per game, as in training.
    assert len(report["games"]) == 2


def test_export_of_the_jobs_checkpoint_is_verified(job: JobRun) -> None:
    done = uerl("export", "--checkpoint", str(job.train_dir / "checkpoints"))
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cartpole.onnx" in done.stdout and "0 mismatch(es)" in done.stdout
