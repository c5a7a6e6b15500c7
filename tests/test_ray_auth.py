"""Ray's token authentication, for real: a Ray head started as KubeRay starts a stack's
(RAY_AUTH_MODE=token, RAY_AUTH_TOKEN), and uerl's clients of its job API against it.
The tier (tests/k8s/test_pods_e2e.py) checks the same on a stack's pods, where KubeRay
gives the head its token from the Secret."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from host_speed import guard
from local_runs import PROJECT_ROOT
from proc_tree import Deadline, StartedProcesses
from ray_api_calls import gcs_nodes, http_status

from training.local import processes
from training.local.ray_cluster import NODE_IP, TEMP_ROOT
from training.submit import job
from training.submit.submit_error import SubmitError

RAY = str(Path(sys.executable).with_name("ray"))


@dataclass(frozen=True)
class TokenHead:
    token: str
    dashboard_url: str
    gcs_address: str


@pytest.fixture(scope="module")
def token_head(
    started_for_module: StartedProcesses, module_deadline: Deadline
) -> Iterator[TokenHead]:
    token = secrets.token_urlsafe(32)
    gcs, dashboard = processes.free_port(), processes.free_port()
    temp_dir = Path(TEMP_ROOT) / f"uerl-auth-{secrets.token_hex(3)}"
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_ADDRESS": "",
           "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
    log = temp_dir.with_suffix(".log")
    with log.open("wb") as out:
        started_for_module.popen(
            [RAY, "start", "--head", "--block", f"--node-ip-address={NODE_IP}", "--num-cpus=0",
             f"--port={gcs}", f"--ray-client-server-port={processes.free_port()}",
             "--include-dashboard=true", f"--dashboard-host={NODE_IP}",
             f"--dashboard-port={dashboard}",
             f"--dashboard-agent-listen-port={processes.free_port()}",
             "--min-worker-port=0", "--max-worker-port=0", f"--temp-dir={temp_dir}",
             "--disable-usage-stats"],
            env=env, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://{NODE_IP}:{dashboard}"
    deadline = time.monotonic() + module_deadline.left(guard(300))  # a head's start
    while http_status(f"{url}/api/version", {"Authorization": f"Bearer {token}"}) != 200:
        assert time.monotonic() < deadline, f"the head's job API never answered:\n{log.read_text()}"
        time.sleep(0.5)
    # The dashboard answers before the head's raylet has registered with the GCS.
    while not gcs_nodes(f"{NODE_IP}:{gcs}", token, timeout_s=10):
        assert time.monotonic() < deadline, f"the head never registered:\n{log.read_text()}"
        time.sleep(0.5)
    yield TokenHead(token, url, f"{NODE_IP}:{gcs}")
    assert started_for_module.stop() == []  # the head by pid, then its session's files
    shutil.rmtree(temp_dir, ignore_errors=True)
    log.unlink(missing_ok=True)


def test_the_job_api_refuses_a_call_without_the_token_or_with_another(
    token_head: TokenHead,
) -> None:
    jobs = f"{token_head.dashboard_url}/api/jobs/"
    assert http_status(jobs, {}) == 401
    assert http_status(jobs, {"Authorization": "Bearer not-the-token"}) == 403
    assert http_status(jobs, {"Authorization": f"Bearer {token_head.token}"}) == 200


def test_submits_job_client_reaches_the_job_api_with_the_token(token_head: TokenHead) -> None:
    client = job.connect_client(
        token_head.dashboard_url, head=lambda: "the test's head", token=token_head.token, wait_s=0
    )
    # Past the token check, the job API itself answers: about a job it does not have (a
    # refused token raises Ray's AuthenticationError, no RuntimeError, before that).
    with pytest.raises(RuntimeError, match="status code 404: Job no-such-job does not exist"):
        client.get_job_status("no-such-job")
    assert list(client.list_jobs()) == []  # type: ignore[attr-defined]


def test_submit_told_another_token_says_which_secret_it_came_from_at_once(
    token_head: TokenHead,
) -> None:
    started = time.monotonic()
    with pytest.raises(SubmitError) as info:
        job.connect_client(
            token_head.dashboard_url,
            head=lambda: "the test's head",
            token="not-the-token",
            token_source="Secret uerl in namespace uerl (endpoints ray.token_secret)",
        )
    assert time.monotonic() - started < 10  # refused, not retried for 15 s
    assert info.value.exit_code == 2
    assert str(info.value).startswith(
        "the Ray head's job API refused the token from the Secret uerl in namespace uerl "
        "(endpoints ray.token_secret): Authentication failed"
    )


def test_uerl_supervise_given_another_token_stops_at_once_as_bad_input(
    token_head: TokenHead,
) -> None:
    env = {**os.environ, "RAY_AUTH_TOKEN": "not-the-token", "RAY_ADDRESS": ""}
    env.pop("RAY_AUTH_MODE", None)  # as in its Job: only the token is given
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "supervise", "--address",
         token_head.dashboard_url, "--run-name", "r1", "--", "--iterations", "1"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=guard(300),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "refused this supervisor's token (RAY_AUTH_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_gcs_refuses_a_call_without_the_token(token_head: TokenHead) -> None:
    import grpc

    with pytest.raises(grpc.RpcError) as refused:
        gcs_nodes(token_head.gcs_address, timeout_s=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(gcs_nodes(token_head.gcs_address, token_head.token, timeout_s=10)) == 1  # the head


def _ray_cli(token_head: TokenHead, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run(
        [RAY, "job", "list", "--address", token_head.dashboard_url],
        env={**clean, **env}, capture_output=True, text=True, timeout=guard(300),
    )  # fmt: skip


def test_rays_cli_told_the_token_as_the_docs_say_reaches_the_job_api(
    token_head: TokenHead,
) -> None:
    done = _ray_cli(token_head, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token_head.token)
    assert done.returncode == 0, done.stderr


def test_rays_cli_without_the_token_is_refused(token_head: TokenHead) -> None:
    done = _ray_cli(token_head)
    assert done.returncode != 0
    assert "Authentication required" in done.stderr + done.stdout
