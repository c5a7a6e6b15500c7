"""`uerl supervise` and `uerl submit --supervise`: a stored run carried on across a lost
Ray head or a failed job, against a fake head whose job API behaves as Ray's does (a
new head has no jobs: 404 "does not exist"). The whole flow on real pods, deleting the
head mid-run: tests/k8s/test_pods_e2e.py."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from network_policy_eval import Peer, ingress_allowed

from infra import manifests
from infra.manifests import pod_security
from infra.manifests.common import labels
from infra.topology import DASHBOARD_PORT, GCS_PORT, Topology
from training.commands.submit import main as submit
from training.runstore import attempts
from training.submit import supervisor_job
from training.supervise.supervisor import Supervisor, exit_code


class Head:
    """A Ray head's job API: jobs by id, each a script of statuses it goes through (the
    last one stays); `lose()` is a new head (no jobs); `down` raises ConnectionError."""

    def __init__(self, scripts: dict[str, list[str]]) -> None:
        self.scripts = scripts  # the statuses each submitted job will go through
        self.jobs: dict[str, list[str]] = {}
        self.submitted: list[dict[str, Any]] = []
        self.down = False
        self.failed_message = "Job entrypoint command failed with exit code 1, last logs: x"

    def _up(self) -> None:
        if self.down:
            raise ConnectionError("Failed to connect to Ray at address: http://head:8265")

    def submit_job(self, **kwargs: Any) -> str:
        self._up()
        job_id = kwargs["submission_id"]
        self.submitted.append(kwargs)
        self.jobs[job_id] = list(self.scripts.get(job_id, ["SUCCEEDED"]))
        return str(job_id)

    def _job(self, job_id: str) -> list[str]:
        self._up()
        if job_id not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return self.jobs[job_id]

    def get_job_status(self, job_id: str) -> str:
        statuses = self._job(job_id)
        return statuses.pop(0) if len(statuses) > 1 else statuses[0]

    def get_job_logs(self, job_id: str) -> str:
        self._job(job_id)
        return f"log of {job_id}\n"

    def get_job_info(self, job_id: str) -> Any:
        self._job(job_id)
        return SimpleNamespace(message=self.failed_message)

    def list_jobs(self) -> list[Any]:
        self._up()
        return [
            SimpleNamespace(
                submission_id=job_id,
                status=statuses[0],
                metadata={"uerl_run": job_id.rsplit("-", 1)[0].removeprefix("uerl-")},
            )
            for job_id, statuses in self.jobs.items()
        ]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.on_sleep: list[Any] = []  # callables run at each sleep (the cluster changing)

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for step in list(self.on_sleep):
            step(self.now)


def supervisor(head: Head, clock: Clock, **kwargs: Any) -> tuple[Supervisor, list[str]]:
    lines: list[str] = []
    sup = Supervisor(
        lambda: head,
        "r1",
        ["--iterations", "100"],
        log=lines.append,
        clock=lambda: clock.now,
        sleep=clock.sleep,
        out=lambda text: None,
        **kwargs,
    )
    return sup, lines


def test_a_run_whose_head_is_lost_is_submitted_again_saying_why() -> None:
    head = Head({"uerl-r1-1": ["RUNNING"], "uerl-r1-2": ["RUNNING", "SUCCEEDED"]})
    clock = Clock()

    def lose_the_head(now: float) -> None:
        if now == 20:  # the head pod deleted: no answer, then a new head with no jobs
            head.down = True
        if now == 60:
            head.down, head.jobs = False, {}

    clock.on_sleep.append(lose_the_head)
    sup, lines = supervisor(head, clock)
    assert sup.run() == 0
    first, second = head.submitted
    assert first["entrypoint"] == (
        "uerl train --run-name r1 --resume auto --wait-for-nodes 600 --iterations 100"
    )
    assert second["submission_id"] == "uerl-r1-2"
    env = second["runtime_env"]["env_vars"]
    assert env["UERL_ATTEMPT"] == "2"
    assert env["UERL_ATTEMPT_REASON"].startswith("the Ray head was lost (its job API unreachable")
    assert "job uerl-r1-1 is gone" in env["UERL_ATTEMPT_REASON"]
    assert any("resuming from its last checkpoint" in line for line in lines)


def test_a_failed_job_is_submitted_again() -> None:
    head = Head({"uerl-r1-1": ["RUNNING", "FAILED"], "uerl-r1-2": ["SUCCEEDED"]})
    sup, _ = supervisor(head, Clock())
    assert sup.run() == 0
    reason = head.submitted[1]["runtime_env"]["env_vars"]["UERL_ATTEMPT_REASON"]
    assert reason == "job uerl-r1-1 FAILED: " + head.failed_message


def test_the_reason_leaves_out_rays_pointer_to_the_log() -> None:
    head = Head({"uerl-r1-1": ["FAILED"], "uerl-r1-2": ["SUCCEEDED"]})
    head.failed_message = (
        "Job entrypoint command failed with exit code 1, last available logs (truncated to "
        "20,000 chars):"
    )
    sup, _ = supervisor(head, Clock())
    assert sup.run() == 0
    reason = head.submitted[1]["runtime_env"]["env_vars"]["UERL_ATTEMPT_REASON"]
    assert reason == "job uerl-r1-1 FAILED: Job entrypoint command failed with exit code 1"


def test_a_job_that_failed_on_bad_input_is_not_submitted_again() -> None:
    head = Head({"uerl-r1-1": ["FAILED"]})
    head.failed_message = "Job entrypoint command failed with exit code 2, last logs: x"
    sup, _ = supervisor(head, Clock())
    assert sup.run() == 2
    assert len(head.submitted) == 1


def test_a_run_stopped_by_a_person_ends_the_supervisor() -> None:
    head = Head({"uerl-r1-1": ["RUNNING", "STOPPED"]})
    sup, _ = supervisor(head, Clock())
    assert sup.run() == 0
    assert len(head.submitted) == 1


def test_restarts_are_bounded() -> None:
    head = Head({f"uerl-r1-{n}": ["FAILED"] for n in range(1, 10)})
    sup, lines = supervisor(head, Clock(), max_restarts=3)
    assert sup.run() == 1
    assert len(head.submitted) == 4
    assert "3 restarts used, giving up" in lines[-1]


def test_a_head_that_never_comes_back_ends_the_supervisor_after_the_wait() -> None:
    head = Head({"uerl-r1-1": ["RUNNING"]})
    clock = Clock()
    clock.on_sleep.append(lambda now: setattr(head, "down", now >= 10))
    sup, lines = supervisor(head, clock, head_wait_s=300)
    assert sup.run() == 1
    assert 300 < clock.now < 320
    assert "did not answer for 300 s; giving up" in lines[-1]


def test_a_supervisor_started_again_follows_the_running_attempt() -> None:
    head = Head({"uerl-r1-3": ["RUNNING", "SUCCEEDED"]})
    head.jobs["uerl-r1-3"] = ["RUNNING", "SUCCEEDED"]  # its pod replaced mid-run
    sup, lines = supervisor(head, Clock())
    assert sup.run() == 0
    assert head.submitted == []
    assert "following attempt 3 (job uerl-r1-3), already RUNNING" in lines[0]


def test_an_unreachable_head_at_the_first_submit_is_waited_for() -> None:
    head = Head({"uerl-r1-1": ["SUCCEEDED"]})
    head.down = True
    clock = Clock()
    clock.on_sleep.append(lambda now: setattr(head, "down", now < 30))
    sup, _ = supervisor(head, clock)
    assert sup.run() == 0
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-1"]


def test_the_exit_code_is_read_from_rays_failure_message() -> None:
    assert exit_code("Job entrypoint command failed with exit code 2, last available logs") == 2
    assert exit_code("Job supervisor actor died") is None


# ---- the run's record of its attempts -------------------------------------------------


def test_each_attempt_is_recorded_with_its_reason_and_checkpoint(tmp_path: Path) -> None:
    assert attempts.from_environment({}) is None
    started = attempts.from_environment({"UERL_ATTEMPT": "2", "UERL_ATTEMPT_REASON": "lost"})
    assert started == (2, "lost")
    attempts.record(tmp_path, 1, "the run starts", resumed_from=None, iteration=None)
    attempts.record(tmp_path, *started, resumed_from="checkpoint_000010", iteration=10)
    first, second = attempts.read(tmp_path)
    assert (first["attempt"], first["resumed_from"]) == (1, None)
    assert (second["reason"], second["resumed_from"], second["iteration"]) == (
        "lost",
        "checkpoint_000010",
        10,
    )


# ---- the Job `uerl submit --supervise` makes -------------------------------------------

HEAD_POD = {
    "metadata": {"name": "uerl-head-abc", "labels": {"app.kubernetes.io/instance": "uerl"}},
    "spec": {
        "containers": [{"name": "ray-head", "image": "registry.example/uerl/ray:1"}],
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"pool": "cpu"},
    },
}


def job(run_name: str = "first") -> dict[str, Any]:
    return supervisor_job.build(
        Topology().endpoints(), HEAD_POD, run_name, ["--iterations", "100"], max_restarts=4
    )


def test_the_supervisor_job_runs_uerl_supervise_in_the_heads_image_and_placement() -> None:
    made = job()
    pod = made["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert made["metadata"] == {
        "name": "uerl-supervise-first",
        "namespace": "uerl",
        "labels": made["spec"]["template"]["metadata"]["labels"],
    }
    assert container["image"] == "registry.example/uerl/ray:1"
    assert container["command"] == [
        "uerl", "supervise", "--address", "http://uerl-head-svc.uerl.svc.cluster.local:8265",
        "--run-name", "first", "--max-restarts", "4", "--", "--iterations", "100",
    ]  # fmt: skip
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["automountServiceAccountToken"] is False


def test_the_supervisor_is_given_the_ray_apis_token_from_the_stacks_secret() -> None:
    [container] = job()["spec"]["template"]["spec"]["containers"]
    assert container["env"] == [
        {"name": "RAY_AUTH_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": "uerl", "key": "auth_token"}}}
    ]  # fmt: skip


def test_a_stack_whose_ray_asks_for_no_token_gives_the_supervisor_none() -> None:
    endpoints = Topology.parse({"ray": {"auth": {"mode": "disabled"}}}).endpoints()
    made = supervisor_job.build(endpoints, HEAD_POD, "first", [], max_restarts=4)
    assert made["spec"]["template"]["spec"]["containers"][0]["env"] == []


def test_a_refused_token_ends_the_supervisor_at_once_as_bad_input() -> None:
    class Refusing(Head):
        def _up(self) -> None:
            raise RuntimeError(
                "Authentication failed: Forbidden: Invalid authentication token\n\n"
                "Token authentication is enabled but the authentication token is invalid."
            )

    head, clock = Refusing({}), Clock()
    sup, lines = supervisor(head, clock)
    assert sup.run() == 2
    assert head.submitted == [] and clock.now == 0  # no waiting for a head that answers
    assert lines == [
        "run r1: the Ray head's job API refused this supervisor's token (RAY_AUTH_TOKEN, "
        "from the stack's ray.token_secret): Authentication failed: Forbidden: Invalid "
        "authentication token"
    ]


def test_the_supervisor_pod_passes_the_restricted_standard() -> None:
    assert pod_security.violations(job()["spec"]["template"]["spec"]) == []


def test_a_run_name_becomes_a_valid_job_name() -> None:
    assert job("Sumo_Run.2")["metadata"]["name"] == "uerl-supervise-sumo-run-2"
    assert len(job("x" * 100)["metadata"]["name"]) == 63


def test_the_stacks_policies_let_its_supervisor_reach_the_job_api_only() -> None:
    a = Topology.parse({"name": "uerl"})
    b = Topology.parse({"name": "other"})
    policies = [p for t in (a, b) for p in manifests.build(t).network_policies]
    head = labels(a, name="ray", component="ray-head")
    worker = labels(a, name="ray", component="ray-env-runner")
    mine = job()["spec"]["template"]["metadata"]["labels"]
    theirs = {**mine, "app.kubernetes.io/instance": "other"}

    def reaches(pod: dict[str, str], peer: dict[str, str], port: int) -> bool:
        return ingress_allowed(
            policies, namespace=a.namespace, pod_labels=pod, peer=Peer(a.namespace, peer), port=port
        )

    assert reaches(head, mine, DASHBOARD_PORT)
    assert not reaches(head, mine, GCS_PORT)
    assert not reaches(worker, mine, DASHBOARD_PORT)
    assert not reaches(head, theirs, DASHBOARD_PORT)


# ---- `uerl submit --supervise`: what it refuses before reaching anything ----------------


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["eval", "--checkpoint", "x"], "only `train` is supervised"),
        (["train", "--run-dir", "/tmp/x"], "give --run-name, not --run-dir"),
        (["train", "--run-name", "r", "--resume", "latest"], "leave --resume out"),
    ],
)
def test_submit_supervise_refuses_what_it_cannot_carry_on(
    command: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(Topology().endpoints().to_json())
    assert submit(["--endpoints", str(path), "--supervise", "--", *command]) == 2
    assert said in capsys.readouterr().err


def test_a_call_that_hangs_counts_as_no_answer() -> None:
    head = Head({"uerl-r1-1": ["RUNNING", "SUCCEEDED"]})
    release = threading.Event()
    answer = head.get_job_status
    calls = [0]

    def hangs_once(job_id: str) -> str:
        calls[0] += 1
        if calls[0] == 1:  # a request to a head pod that vanished mid-way
            release.wait(5)
        return answer(job_id)

    head.get_job_status = hangs_once  # type: ignore[method-assign]
    sup, lines = supervisor(head, Clock(), call_timeout_s=0.2)
    try:
        assert sup.run() == 0
    finally:
        release.set()
    assert any("does not answer: no answer in 0 s" in line for line in lines), lines
