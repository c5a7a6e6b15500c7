"""`uerl supervise` and `uerl submit --supervise`: a stored run carried on across a lost
Ray head or a failed job, against a fake head whose job API behaves as Ray's does (a
new head has no jobs: 404 "does not exist"). The whole flow on real pods, deleting the
head mid-run: tests/k8s/test_pods_e2e.py."""

from __future__ import annotations

import collections
import hashlib
import random
import re
import signal
import string
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
from network_policy_eval import Peer, ingress_allowed

from infra import manifests
from infra.endpoints import RunStorage
from infra.manifests import pod_security
from infra.manifests.common import labels
from infra.topology import DASHBOARD_PORT, GCS_PORT, Topology
from training.commands.submit import main as submit
from training.commands.supervise import main as supervise
from training.rayjobs.log_tail import LogTail
from training.runstore import attempts, events
from training.runstore.bucket import S3Location
from training.runstore.location import check_run_name
from training.submit import supervisor_job
from training.supervise import record
from training.supervise.supervisor import Supervisor, exit_code, stored_a_checkpoint


class Head:
    """A Ray head's job API: jobs by id, each a script of statuses it goes through (the
    last one stays); `lose()` is a new head (no jobs); `down` raises ConnectionError."""

    def __init__(self, scripts: dict[str, list[str]]) -> None:
        self.scripts = scripts  # the statuses each submitted job will go through
        self.jobs: dict[str, list[str]] = {}
        self.submitted: list[dict[str, Any]] = []
        self.down = False
        # The run's record, as the short job reading it on the head prints it.
        self.stored_last_attempt = 0
        self.record_jobs: list[str] = []
        self.record_failures = 0  # record jobs that fail first (a store down a moment)
        self.logs: dict[str, str] = {}
        self.metadata: dict[str, dict[str, str]] = {}  # what each job was submitted with
        self.failed_message = "Job entrypoint command failed with exit code 1, last logs: x"
        # Characters of each job's log sent, each way: (way, job) -> count.
        self.served: collections.Counter[tuple[str, str]] = collections.Counter()

    def _up(self) -> None:
        if self.down:
            raise ConnectionError("Failed to connect to Ray at address: http://head:8265")

    def submit_job(self, **kwargs: Any) -> str:
        self._up()
        job_id = kwargs["submission_id"]
        if job_id in self.jobs:  # as Ray's job manager refuses it, through the dashboard
            raise RuntimeError(
                "Request failed with status code 400: Traceback (most recent call last):\n"
                f"ValueError: Job with submission_id {job_id} already exists. "
                "Please use a different submission_id.\n."
            )
        if "uerl train" not in kwargs["entrypoint"]:  # the job reading the run's record
            self.record_jobs.append(job_id)
            failing = len(self.record_jobs) <= self.record_failures
            self.jobs[job_id] = ["FAILED" if failing else "SUCCEEDED"]
            self.logs[job_id] = f'uerl-record: {{"last_attempt": {self.stored_last_attempt}}}\n'
            return str(job_id)
        self.submitted.append(kwargs)
        self.metadata[job_id] = dict(kwargs.get("metadata") or {})
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
        logs = self.logs.get(job_id, f"log of {job_id}\n")
        self.served["logs", job_id] += len(logs)
        return logs

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        # The log so far, then the stream ends (as a connection cut would): LogTail opens
        # it again, skipping what it passed on.
        self._job(job_id)
        logs = self.logs.get(job_id, f"log of {job_id}\n")
        self.served["tail", job_id] += len(logs)
        yield logs

    def get_job_info(self, job_id: str) -> Any:
        self._job(job_id)
        return SimpleNamespace(message=self.failed_message)

    def list_jobs(self) -> list[Any]:
        self._up()
        return [
            SimpleNamespace(
                submission_id=job_id,
                status=statuses[0],
                metadata=self.metadata.get(job_id)
                or {"uerl_run": job_id.rsplit("-", 1)[0].removeprefix("uerl-")},
            )
            for job_id, statuses in self.jobs.items()
        ]


class Clock:
    def __init__(self, limit_s: float = 24 * 3600) -> None:
        self.now = 0.0
        self.limit_s = limit_s  # a supervisor looping for ever fails the test, not hangs it
        self.on_sleep: list[Any] = []  # callables run at each sleep (the cluster changing)

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        assert self.now <= self.limit_s, f"the supervisor still runs after {self.limit_s:.0f} s"
        for step in list(self.on_sleep):
            step(self.now)


def supervisor(head: Head, clock: Clock, **kwargs: Any) -> tuple[Supervisor, list[str]]:
    lines: list[str] = []
    sup = Supervisor(
        lambda: head,
        "r1",
        ["--iterations", "100"],
        log=lines.append,
        tail_logs=LogTail,
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
    assert first["entrypoint"].endswith(
        "; uerl train --run-name r1 --resume auto --wait-for-nodes 600 --iterations 100"
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
    assert job_action(2) == "FailJob"  # no pod of the Job submits it again
    assert len(head.submitted) == 1


def test_a_run_stopped_by_a_person_ends_the_supervisor() -> None:
    head = Head({"uerl-r1-1": ["RUNNING", "STOPPED"]})
    sup, _ = supervisor(head, Clock())
    assert sup.run() == 0
    assert len(head.submitted) == 1


def test_a_new_supervised_job_of_an_ended_run_carries_it_on_its_replaced_pod_does_not() -> None:
    # Before: any supervisor finding the run's newest job SUCCEEDED exited 0 without
    # training, so a new Job (more --iterations, after `ray job stop`) did nothing.
    head = Head({"uerl-r1-1": ["SUCCEEDED"], "uerl-r1-2": ["RUNNING", "SUCCEEDED"]})
    first, _ = supervisor(head, Clock(), supervision="job-uid-a")
    assert first.run() == 0
    replaced, lines = supervisor(head, Clock(), supervision="job-uid-a")  # its pod replaced
    assert replaced.run() == 0
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-1"]
    assert "attempt 1 already ended SUCCEEDED" in lines[-1]
    new_job, lines = supervisor(head, Clock(), supervision="job-uid-b")
    assert new_job.run() == 0
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-1", "uerl-r1-2"]
    second = head.submitted[1]
    assert second["metadata"]["uerl_supervision"] == "job-uid-b"
    assert second["runtime_env"]["env_vars"]["UERL_ATTEMPT_REASON"] == (
        "a new supervision of the run (attempt 1 had ended SUCCEEDED)"
    )


def test_the_supervisor_job_tells_its_pods_their_jobs_uid() -> None:
    job = supervisor_job.build(
        Topology().endpoints(), HEAD_POD, "r1", ["--iterations", "10"], max_restarts=3
    )
    [container] = job["spec"]["template"]["spec"]["containers"]
    [supervision] = [e for e in container["env"] if e["name"] == "UERL_SUPERVISION"]
    assert supervision["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/controller-uid']"
    )


def test_a_head_that_answers_but_takes_no_job_ends_the_supervisor_after_the_wait() -> None:
    # Before: the same submission was tried again every poll, for ever.
    head = Head({})

    def refuses(**kwargs: Any) -> str:
        head._up()
        raise RuntimeError("Request failed with status code 500: the job agent is not up")

    head.submit_job = refuses  # type: ignore[method-assign]
    clock = Clock(limit_s=3600)
    sup, lines = supervisor(head, clock, head_wait_s=300)
    assert sup.run() == 1
    assert 300 <= clock.now < 320
    # The first job it submits is the one reading the run's record.
    assert "answered, but not reading the run's record, for 300 s" in lines[-1]
    assert "status code 500" in lines[-1]


def test_a_head_that_takes_no_training_job_ends_the_supervisor_after_the_wait() -> None:
    head = Head({})
    submit = head.submit_job

    def refuses_training(**kwargs: Any) -> str:
        if "uerl train" in kwargs["entrypoint"]:
            raise RuntimeError("Request failed with status code 500: the job agent is not up")
        return submit(**kwargs)

    head.submit_job = refuses_training  # type: ignore[method-assign]
    clock = Clock(limit_s=3600)
    sup, lines = supervisor(head, clock, head_wait_s=300)
    assert sup.run() == 1
    assert 300 <= clock.now < 320
    assert "the Ray head took no job for 300 s" in lines[-1] and "status code 500" in lines[-1]


def test_an_attempt_its_heads_own_stop_stopped_is_resumed_not_taken_for_a_persons_stop() -> None:
    # Issue 63, item 8: a drained head's preStop hook stops its jobs (so their drivers
    # write a final checkpoint); their supervisor carries the run on.
    head = Head({"uerl-r1-1": ["RUNNING", "STOPPED"], "uerl-r1-2": ["RUNNING", "SUCCEEDED"]})
    head.logs["uerl-r1-1"] = f"iter 1 | ...\n{events.line(events.HEAD_STOPPING)}\n"
    sup, _ = supervisor(head, Clock())
    assert sup.run() == 0
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-1", "uerl-r1-2"]
    reason = head.submitted[1]["runtime_env"]["env_vars"]["UERL_ATTEMPT_REASON"]
    assert reason == "job uerl-r1-1 was stopped by its Ray head's own stop (its pod deleted)"


def test_a_run_stopped_by_a_signal_while_its_head_stops_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    from training.commands import train

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert not train.said_head_stopping(130)  # no mark: a person's stop
    (tmp_path / events.HEAD_STOPPING_MARKER).touch()  # the preStop hook's
    assert not train.said_head_stopping(0)
    assert train.said_head_stopping(130)
    assert list(events.parse(capsys.readouterr().out)) == [{"event": "head_stopping"}]


def test_a_run_that_fails_while_its_head_stops_says_its_head_stopped_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # CI, stop 70 (the bucket schedule's new image, under load): SIGTERM came with the
    # head's stop, the final checkpoint failed (the learner's pod was going too), exit 1;
    # the job ended STOPPED without the event and its supervisor took it for a person's
    # stop: "STOPPED; done" at iteration 22 of 78.
    import tempfile

    from training.commands import train

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / events.HEAD_STOPPING_MARKER).touch()  # the preStop hook's
    assert train.said_head_stopping(1)
    assert list(events.parse(capsys.readouterr().out)) == [{"event": "head_stopping"}]


def test_restarts_are_bounded() -> None:
    head = Head({f"uerl-r1-{n}": ["FAILED"] for n in range(1, 10)})
    sup, lines = supervisor(head, Clock(), max_restarts=3)
    assert sup.run() == 1
    assert job_action(1) == "FailJob"  # the Job's next pod would start counting again
    assert len(head.submitted) == 4
    assert "3 restarts in a row without a new checkpoint, giving up" in lines[-1]


def test_a_head_that_never_comes_back_ends_the_supervisor_after_the_wait() -> None:
    head = Head({"uerl-r1-1": ["RUNNING"]})
    clock = Clock()
    clock.on_sleep.append(lambda now: setattr(head, "down", now >= 10))
    sup, lines = supervisor(head, clock, head_wait_s=300)
    assert sup.run() == 1
    assert job_action(1) == "FailJob"
    assert 300 < clock.now < 320
    assert "did not answer for 300 s; giving up" in lines[-1]


def test_a_supervisor_started_again_follows_the_running_attempt() -> None:
    head = Head({"uerl-r1-3": ["RUNNING", "SUCCEEDED"]})
    head.jobs["uerl-r1-3"] = ["RUNNING", "SUCCEEDED"]  # its pod replaced mid-run
    sup, lines = supervisor(head, Clock())
    assert sup.run() == 0
    assert head.submitted == []
    assert "following attempt 3 (job uerl-r1-3), already RUNNING" in lines[0]


def test_a_submit_whose_answer_was_lost_follows_the_job_it_made() -> None:
    head = Head({"uerl-r1-1": ["RUNNING", "SUCCEEDED"]})
    submit = head.submit_job

    def made_but_unanswered(**kwargs: Any) -> str:
        made = submit(**kwargs)
        if made != "uerl-r1-1" or head.submitted[1:]:
            return made
        raise ConnectionError("Connection aborted: RemoteDisconnected")  # made, unanswered

    head.submit_job = made_but_unanswered  # type: ignore[method-assign]
    sup, lines = supervisor(head, Clock(limit_s=3600))
    assert sup.run() == 0
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-1"]
    assert any("job uerl-r1-1 already exists; following it" in line for line in lines), lines


def test_a_supervisor_started_while_the_head_is_down_waits_then_follows_its_attempt() -> None:
    head = Head({})
    head.jobs["uerl-r1-2"] = ["RUNNING", "SUCCEEDED"]
    head.down = True
    clock = Clock(limit_s=3600)
    clock.on_sleep.append(lambda now: setattr(head, "down", now < 30))
    sup, lines = supervisor(head, clock)
    assert sup.run() == 0
    assert head.submitted == []
    assert any("following attempt 2 (job uerl-r1-2), already RUNNING" in line for line in lines)


def test_a_supervisor_started_on_a_new_head_numbers_its_attempt_from_the_runs_record() -> None:
    head = Head({"uerl-r1-4": ["RUNNING", "SUCCEEDED"]})
    head.stored_last_attempt = 3  # the head and the supervisor lost together (a node)
    sup, _ = supervisor(head, Clock(limit_s=3600))
    assert sup.run() == 0
    assert len(head.record_jobs) == 1
    [submitted] = head.submitted
    assert submitted["submission_id"] == "uerl-r1-4"
    env = submitted["runtime_env"]["env_vars"]
    assert env["UERL_ATTEMPT"] == "4"
    assert env["UERL_ATTEMPT_REASON"] == (
        "the Ray head has no job of the run (a new head): attempt 3 was lost with it"
    )


def test_a_record_that_could_not_be_read_once_is_read_again_not_numbered_from_1() -> None:
    head = Head({"uerl-r1-4": ["RUNNING", "SUCCEEDED"]})
    head.stored_last_attempt = 3
    head.record_failures = 1  # the bucket down for a moment when the first one read it
    sup, lines = supervisor(head, Clock(limit_s=3600))
    assert sup.run() == 0
    assert len(head.record_jobs) == 2
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-4"]
    assert any("the run's record could not be read" in line for line in lines)


def test_a_record_that_cannot_be_read_for_the_head_wait_gives_up_never_numbering_from_1() -> None:
    # Before: after 3 tries the supervisor numbered the attempts from 1 again (a second
    # "attempt": 1 in attempts.jsonl, a job id used twice).
    head = Head({})
    head.stored_last_attempt = 3
    head.record_failures = 10**6  # the store down for good
    sup, lines = supervisor(head, Clock(limit_s=4 * 3600), head_wait_s=600)
    assert sup.run() == 1
    assert head.submitted == []
    assert "a new attempt would number the run's attempts again; giving up" in lines[-1]


def test_a_record_whose_log_was_lost_is_read_again_not_numbered_from_1() -> None:
    head = Head({"uerl-r1-4": ["RUNNING", "SUCCEEDED"]})
    head.stored_last_attempt = 3
    served = head.get_job_logs

    def get_job_logs(job_id: str) -> str:
        if job_id == head.record_jobs[0]:  # the first record job SUCCEEDED, its log lost
            raise ConnectionError("the head's answer was lost")
        return served(job_id)

    head.get_job_logs = get_job_logs  # type: ignore[method-assign]
    sup, lines = supervisor(head, Clock(limit_s=3600))
    assert sup.run() == 0
    assert len(head.record_jobs) == 2
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-4"]
    assert any("its log could not be read" in line for line in lines), lines


def claim_endpoints(root: Path) -> Path:
    """An endpoints file whose run storage is the directory `root` (a claim)."""
    endpoints = Topology().endpoints()
    endpoints = endpoints.model_copy(update={"runs": RunStorage(uri=f"file://{root}")})
    path = root / "endpoints.json"
    path.write_text(endpoints.to_json())
    return path


def test_the_runs_record_is_read_from_its_claim_on_the_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = claim_endpoints(tmp_path)
    attempts.record(tmp_path / "r1", 1, "the run starts", resumed_from=None, iteration=None)
    attempts.record(tmp_path / "r1", 2, "lost", resumed_from="checkpoint_000003", iteration=3)
    assert record.main(["r1", "--endpoints", str(path)]) == 0
    assert capsys.readouterr().out == 'uerl-record: {"last_attempt": 2}\n'


def test_a_run_with_no_record_reads_as_no_attempt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = claim_endpoints(tmp_path)
    assert record.main(["new-run", "--endpoints", str(path)]) == 0
    assert capsys.readouterr().out == 'uerl-record: {"last_attempt": 0}\n'


def test_each_attempt_first_sets_a_lost_attempts_traceback_aside() -> None:
    head = Head({"uerl-r1-1": ["SUCCEEDED"]})
    sup, _ = supervisor(head, Clock())
    assert sup.run() == 0
    # `;`: an attempt trains whether or not that worked.
    assert head.submitted[0]["entrypoint"] == (
        "python -m training.supervise.record r1 --set-aside-traceback; "
        "uerl train --run-name r1 --resume auto --wait-for-nodes 600 --iterations 100"
    )


def test_a_lost_attempts_traceback_is_set_aside_under_its_attempt(tmp_path: Path) -> None:
    run = tmp_path / "r1"
    attempts.record(run, 1, "the run starts", resumed_from=None, iteration=None)
    (run / "traceback.txt").write_text("Traceback (most recent call last): ...")
    assert record.main(["r1", "--endpoints", str(claim_endpoints(tmp_path)),
                        "--set-aside-traceback"]) == 0  # fmt: skip
    assert not (run / "traceback.txt").exists()
    assert (run / "traceback-attempt-1.txt").read_text().startswith("Traceback")


def test_a_traceback_set_aside_never_replaces_an_earlier_one(tmp_path: Path) -> None:
    # Before: an attempt that failed before recording itself left the last recorded
    # number as it was, and its traceback was moved over that attempt's own.
    run = tmp_path / "r1"
    attempts.record(run, 1, "the run starts", resumed_from=None, iteration=None)
    (run / "traceback-attempt-1.txt").write_text("attempt 1's")
    (run / "traceback.txt").write_text("the next one's")
    assert record.main(["r1", "--endpoints", str(claim_endpoints(tmp_path)),
                        "--set-aside-traceback"]) == 0  # fmt: skip
    assert (run / "traceback-attempt-1.txt").read_text() == "attempt 1's"
    assert (run / "traceback-attempt-1-2.txt").read_text() == "the next one's"


def test_attempts_that_ended_before_recording_themselves_are_recorded_by_the_next(
    tmp_path: Path,
) -> None:
    # Before: attempts.jsonl read 1, 3 when attempt 2's store was down past its wait.
    attempts.record(tmp_path, 1, "the run starts", resumed_from=None, iteration=None)
    attempts.record(tmp_path, 3, "attempt 2 had FAILED", resumed_from=None, iteration=None)
    entries = attempts.read(tmp_path)
    assert [e["attempt"] for e in entries] == [1, 2, 3]
    assert entries[1]["reason"] == attempts.NOT_RECORDED and entries[1]["recorded_by"] == 3


def test_an_unreachable_head_at_the_first_submit_is_waited_for() -> None:
    head = Head({"uerl-r1-1": ["SUCCEEDED"]})
    head.down = True
    clock = Clock()
    clock.on_sleep.append(lambda now: setattr(head, "down", now < 30))
    sup, _ = supervisor(head, clock)
    assert sup.run() == 0
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-1"]


def test_a_lost_attempts_traceback_is_set_aside_in_its_bucket_and_the_heads_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyarrow import fs

    # The bucket, a directory through pyarrow's filesystem interface as S3 is reached.
    bucket = tmp_path / "store"
    monkeypatch.setattr(
        S3Location,
        "filesystem",
        lambda self: fs.SubTreeFileSystem(str(bucket), fs.LocalFileSystem()),
    )
    monkeypatch.setattr(record, "staging_root", lambda: tmp_path / "staging")
    stored, staged = bucket / "runs-bucket" / "uerl-runs" / "r1", tmp_path / "staging" / "r1"
    for run in (stored, staged):
        attempts.record(run, 1, "the run starts", resumed_from=None, iteration=None)
        (run / "traceback.txt").write_text("Traceback (most recent call last): ...")
    endpoints = (
        Topology()
        .endpoints()
        .model_copy(update={"runs": RunStorage(uri="s3://runs-bucket/uerl-runs")})
    )
    assert len(record.set_aside_traceback(endpoints, "r1")) == 2
    for run in (stored, staged):
        assert sorted(p.name for p in run.iterdir()) == [
            "attempts.jsonl",
            "traceback-attempt-1.txt",
        ]


def test_a_supervisor_sent_sigterm_stops_leaving_its_attempt_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As its container's first process, SIGTERM's default action (end) does not apply:
    # without a handler of its own the supervisor ignores it, beside its replacement.
    def deleted_pod(self: Supervisor) -> int:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), f"SIGTERM is {handler!r}"
        handler(signal.SIGTERM, None)
        return 0

    monkeypatch.setattr(Supervisor, "run", deleted_pod)
    before = signal.getsignal(signal.SIGTERM)
    assert supervise(["--address", "http://head:8265", "--run-name", "r1"]) == 143
    assert "stopped (SIGTERM): the current attempt goes on" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("not-a-url", "'not-a-url': not an http(s) URL with a host"),
        ("head:8265", "'head:8265': not an http(s) URL with a host"),
        ("http://head:99999", "'http://head:99999': the port must be from 1 to 65535"),
        # Before: taken (urlsplit keeps a space in the path) and retried for 30 minutes.
        ("http://head:8265/ x", "'http://head:8265/ x': a URL has no whitespace"),
        ("http://head:8265\n", "'http://head:8265\\n': a URL has no whitespace"),
    ],
)
def test_an_address_that_is_no_job_api_url_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], address: str, said: str
) -> None:
    # Before: taken, then retried as a head that does not answer, for 30 minutes.
    def started(self: Supervisor) -> int:
        raise AssertionError("the supervisor started")

    monkeypatch.setattr(Supervisor, "run", started)
    with pytest.raises(SystemExit) as exited:
        supervise(["--address", address, "--run-name", "r1"])
    assert exited.value.code == 2
    assert f"argument --address: {said}" in capsys.readouterr().err


def test_a_train_flag_typo_is_one_line_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(Supervisor, "run", lambda self: 0)
    assert supervise(["--address", "http://head:8265", "--run-name", "r1", "--",
                      "--iterations", "0"]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == (
        "uerl supervise: train flags (after `--`): argument --iterations: 0: must be at least 1"
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--run-name", "r2"], "--run-name r2: the run is --run-name before `--`"),
        (["--resume", "auto"], "the supervisor resumes the run itself (--resume auto)"),
        (["--run-dir", "elsewhere"], "leave out --run-dir and --checkpoint-dir"),
        (["--checkpoint-dir", "elsewhere"], "leave out --run-dir and --checkpoint-dir"),
    ],
)
def test_a_train_flag_the_supervisor_sets_itself_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    said: str,
) -> None:
    # Before: taken, and put after the supervisor's own: each attempt would have trained
    # run r2 (or elsewhere) while the supervisor watched r1's checkpoints.
    def started(self: Supervisor) -> int:
        raise AssertionError("the supervisor started")

    monkeypatch.setattr(Supervisor, "run", started)
    assert supervise(["--address", "http://head:8265", "--run-name", "r1", "--", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("uerl supervise: train flags (after `--`): ")
    assert said in err


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

HEAD_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
            ]
        }
    }
}
HEAD_TOLERATIONS = [
    {"key": "dedicated", "operator": "Equal", "value": "ray", "effect": "NoSchedule"}
]
HEAD_POD = {
    "metadata": {"name": "uerl-head-abc", "labels": {"app.kubernetes.io/instance": "uerl"}},
    "spec": {
        "containers": [{"name": "ray-head", "image": "registry.example/uerl/ray:1"}],
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"pool": "cpu"},
        "affinity": HEAD_AFFINITY,
        "tolerations": HEAD_TOLERATIONS,
    },
}


def job(run_name: str = "first") -> dict[str, Any]:
    return supervisor_job.build(
        Topology().endpoints(), HEAD_POD, run_name, ["--iterations", "100"], max_restarts=4
    )


def job_action(exit_code: int, *, disrupted: bool = False) -> str:
    """What the supervisor's Job does when its pod ends with `exit_code`, read from its
    podFailurePolicy as Kubernetes reads it: the first rule that matches; none matching,
    the pod counts against backoffLimit and another is made ("Count")."""
    for rule in job()["spec"].get("podFailurePolicy", {}).get("rules", []):
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            matches = (exit_code in codes["values"]) == (codes["operator"] == "In")
        else:
            conditions = rule["onPodConditions"]
            matches = disrupted and any(c["type"] == "DisruptionTarget" for c in conditions)
        if matches:
            return str(rule["action"])
    return "Count"


def test_the_supervisor_job_runs_uerl_supervise_in_the_heads_image_and_placement() -> None:
    made = job()
    pod = made["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert made["metadata"] == {
        "name": "uerl-supervise-first",
        "namespace": "uerl",
        "labels": made["spec"]["template"]["metadata"]["labels"],
        "annotations": {"uerl.dev/run-name": "first"},
    }
    assert container["image"] == "registry.example/uerl/ray:1"
    assert container["command"] == [
        "uerl", "supervise", "--address", "http://uerl-head-svc.uerl.svc.cluster.local:8265",
        "--run-name", "first", "--max-restarts", "4", "--", "--iterations", "100",
    ]  # fmt: skip
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["automountServiceAccountToken"] is False


def test_the_supervisor_job_is_placed_where_the_head_may_be() -> None:
    pod = job()["spec"]["template"]["spec"]
    assert pod["affinity"] == HEAD_AFFINITY
    assert pod["tolerations"] == HEAD_TOLERATIONS


def test_the_supervisor_job_validates_against_the_kubernetes_schema() -> None:
    kubernetes_validate.validate(job(), kubernetes_validate.latest_version(), strict=True)


def test_a_supervisor_pod_lost_to_a_disruption_is_replaced_without_counting() -> None:
    assert job_action(143, disrupted=True) == "Ignore"  # drained, evicted, preempted


def test_a_supervisor_that_ends_otherwise_is_replaced_within_the_backoff_limit() -> None:
    assert job_action(143) == "Count"  # SIGTERM, its pod deleted by a person
    assert job_action(137) == "Count"  # OOM-killed


def test_the_supervisor_is_given_the_ray_apis_token_from_the_stacks_secret() -> None:
    # Mounted, not an env var from the Secret: the kubelet refreshes a mounted Secret when
    # it is rotated, and the supervisor reads the file at each connection.
    spec = job()["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert [e for e in container["env"] if e["name"].startswith("RAY_AUTH_TOKEN")] == [
        {"name": "RAY_AUTH_TOKEN_FILE", "value": "/var/run/uerl/ray-token/auth_token"}
    ]
    [volume] = [v for v in spec["volumes"] if v["name"] == "ray-token"]
    assert volume["secret"]["secretName"] == "uerl"
    assert {"name": "ray-token", "mountPath": "/var/run/uerl/ray-token", "readOnly": True} in (
        container["volumeMounts"]
    )


def test_a_stack_whose_ray_asks_for_no_token_gives_the_supervisor_none() -> None:
    endpoints = Topology.parse({"ray": {"auth": {"mode": "disabled"}}}).endpoints()
    made = supervisor_job.build(endpoints, HEAD_POD, "first", [], max_restarts=4)
    env = made["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"].startswith("RAY_AUTH_TOKEN")] == []
    assert "ray-token" not in [v["name"] for v in made["spec"]["template"]["spec"]["volumes"]]


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
    assert job_action(2) == "FailJob"
    assert head.submitted == [] and clock.now == 0  # no waiting for a head that answers
    assert lines == [
        "run r1: the Ray head's job API refused this supervisor's token (RAY_AUTH_TOKEN, "
        "from the stack's ray.token_secret): Authentication failed: Forbidden: Invalid "
        "authentication token"
    ]


class TokenHead(Head):
    """A head whose job API takes one token (`accepted`); the supervisor's client sends
    the one its token source gave when it connected."""

    def __init__(self, scripts: dict[str, list[str]], accepted: str) -> None:
        super().__init__(scripts)
        self.accepted = accepted
        self.sent = accepted

    def _up(self) -> None:
        super()._up()
        if self.sent != self.accepted:
            raise RuntimeError("Authentication failed: Forbidden: Invalid authentication token")


def token_supervisor(
    head: TokenHead, clock: Clock, tokens: list[str]
) -> tuple[Supervisor, list[str]]:
    def connect() -> TokenHead:
        head.sent = tokens[0]
        return head

    lines: list[str] = []
    sup = Supervisor(connect, "r1", [], log=lines.append, tail_logs=LogTail,
                     clock=lambda: clock.now, sleep=clock.sleep, out=lambda text: None,
                     token=lambda: tokens[0])  # fmt: skip
    return sup, lines


def test_a_rotated_token_is_followed_once_the_mounted_secret_has_it() -> None:
    # Issue 63, item 9. Before: the token was an env var fixed at the pod's start, and
    # the first refusal after a rotation ended the supervision for good (exit 2, FailJob).
    head = TokenHead({"uerl-r1-1": ["RUNNING"] * 40 + ["SUCCEEDED"]}, accepted="old")
    clock, tokens = Clock(limit_s=3600), ["old"]

    def rotate(now: float) -> None:
        if now >= 30:
            head.accepted = "new"  # the Secret rotated, the head restarted with it
        if now >= 90:
            tokens[0] = "new"  # the kubelet refreshed the mounted file a minute later

    clock.on_sleep.append(rotate)
    sup, lines = token_supervisor(head, clock, tokens)
    assert sup.run() == 0
    assert any("token was rotated; going on with the new one" in line for line in lines), lines
    assert [s["submission_id"] for s in head.submitted] == ["uerl-r1-1"]


def test_a_refused_token_that_stays_the_same_ends_the_supervisor_after_the_wait() -> None:
    head = TokenHead({"uerl-r1-1": ["RUNNING"]}, accepted="new")
    clock = Clock(limit_s=3600)
    sup, lines = token_supervisor(head, clock, ["old"])
    assert sup.run() == 2
    assert 180 <= clock.now < 200
    assert "refused this supervisor's token" in lines[-1]


def test_the_supervisor_pod_passes_the_restricted_standard() -> None:
    assert pod_security.violations(job()["spec"]["template"]["spec"]) == []


def test_a_run_name_becomes_a_valid_job_name() -> None:
    assert job("sumo-run-2")["metadata"]["name"] == "uerl-supervise-sumo-run-2"
    # Changed to fit (case, `.`, `_`, length): the run name's hash keeps it apart.
    digest = hashlib.sha256(b"Sumo_Run.2").hexdigest()[:8]
    assert job("Sumo_Run.2")["metadata"]["name"] == f"uerl-supervise-sumo-run-2-{digest}"
    assert len(job("x" * 100)["metadata"]["name"]) == 63


# What the API server checks of a Job (k8s.io/apimachinery/pkg/util/validation): its name
# becomes the label `batch.kubernetes.io/job-name` of its pods, so a label value (63 at
# most, a letter or digit at both ends), and a DNS-1123 label; its labels' values too.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def assert_a_valid_job(made: dict[str, Any]) -> None:
    kubernetes_validate.validate(made, kubernetes_validate.latest_version(), strict=True)
    name = made["metadata"]["name"]
    assert len(name) <= 63 and DNS1123_LABEL.fullmatch(name), name
    for meta in (made["metadata"], made["spec"]["template"]["metadata"]):
        for value in meta["labels"].values():
            assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), value


@pytest.mark.parametrize("run_name", ["first.", "first_", "first-", "a" * 62 + "._-" + "b" * 35])
def test_a_run_name_ending_in_punctuation_makes_a_valid_job(run_name: str) -> None:
    assert_a_valid_job(job(run_name))


def test_run_names_differing_by_case_or_punctuation_get_distinct_jobs() -> None:
    names = ["run", "Run", "RUN", "r.un", "r_un", "r-un"]
    assert len({job(name)["metadata"]["name"] for name in names}) == len(names)


def test_long_run_names_sharing_their_start_get_distinct_jobs() -> None:
    names = ["x" * 100, "x" * 99 + "y", "x" * 70]
    assert len({job(name)["metadata"]["name"] for name in names}) == len(names)
    assert len({job(name)["metadata"]["labels"]["uerl.dev/run"] for name in names}) == 3


def test_the_supervisor_job_keeps_the_exact_run_name_in_an_annotation() -> None:
    made = job("Sumo_Run." + "x" * 90)
    for meta in (made["metadata"], made["spec"]["template"]["metadata"]):
        assert meta["annotations"] == {"uerl.dev/run-name": "Sumo_Run." + "x" * 90}


def test_any_valid_run_name_makes_a_valid_job_of_its_own() -> None:
    rng = random.Random(54)
    first, rest = string.ascii_letters + string.digits, string.ascii_letters + string.digits
    rest += "._-" * 10  # punctuation often, at the ends too
    names = {
        rng.choice(first) + "".join(rng.choice(rest) for _ in range(rng.randrange(100)))
        for _ in range(300)
    }
    names |= {name[:1] + name[1:].lower() for name in names}  # the same but for case
    made = {name: job(name) for name in names if check_run_name(name)}
    for one in made.values():
        assert_a_valid_job(one)
    assert len({one["metadata"]["name"] for one in made.values()}) == len(made)


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


def test_a_long_run_whose_attempts_each_store_a_checkpoint_never_runs_out_of_restarts() -> None:
    # Twelve head replacements, each attempt storing a checkpoint before its head is lost.
    attempts_made = 13
    head = Head({f"uerl-r1-{n}": ["RUNNING", "FAILED"] for n in range(1, attempts_made)})
    head.scripts[f"uerl-r1-{attempts_made}"] = ["RUNNING", "SUCCEEDED"]
    for n in range(1, attempts_made + 1):
        head.logs[f"uerl-r1-{n}"] = (
            f"iter {n:4d} | ...\ncheckpoint_{n:06d} written: 3.1 MiB in 0.42 s (RLlib's state "
            f"0.40 s, storing 0.02 s)\n{events.checkpoint_stored(f'checkpoint_{n:06d}')}\n"
        )
    sup, _ = supervisor(head, Clock(), max_restarts=3)
    assert sup.run() == 0
    assert len(head.submitted) == attempts_made


def test_the_restart_limit_counts_attempts_in_a_row_without_a_new_checkpoint() -> None:
    head = Head({f"uerl-r1-{n}": ["FAILED"] for n in range(1, 12)})
    head.logs["uerl-r1-2"] = events.checkpoint_stored("checkpoint_000002") + "\n"  # progress
    sup, lines = supervisor(head, Clock(), max_restarts=3)
    assert sup.run() == 1
    # Attempt 2 stored a checkpoint: the count starts again after it (3, 4, 5, 6 fail).
    assert len(head.submitted) == 6
    assert "3 restarts in a row without a new checkpoint, giving up" in lines[-1]


def test_a_checkpoint_written_on_the_head_but_never_stored_is_no_progress() -> None:
    # Before: "checkpoint_N written" (saved to a bucket run's staging) reset the count,
    # so a run whose store was down after its start never used its restarts up.
    head = Head({f"uerl-r1-{n}": ["FAILED"] for n in range(1, 12)})
    for n in range(1, 12):
        head.logs[f"uerl-r1-{n}"] = f"checkpoint_{n:06d} written: 3.1 MiB in 0.42 s\n"
    sup, lines = supervisor(head, Clock(), max_restarts=3)
    assert sup.run() == 1
    assert len(head.submitted) == 4
    assert "3 restarts in a row without a new checkpoint, giving up" in lines[-1]


def test_a_claim_run_says_each_checkpoint_stored_once_as_an_event(tmp_path: Path) -> None:
    from run_fakes import SavingAlgo, meta

    from training.run import checkpoints
    from training.runstore.stored_run import open_stored_run

    endpoints = (
        Topology().endpoints().model_copy(update={"runs": RunStorage(uri=f"file://{tmp_path}")})
    )
    lines: list[str] = []
    stored = open_stored_run(endpoints, "r1", resume=None, log=lines.append)
    checkpoints.save(SavingAlgo(), stored.run_dir / "checkpoints", meta(2))
    stored.sync()
    stored.sync()
    assert stored.close()
    said = [e for line in lines for e in events.parse(line)]
    assert said == [
        {"event": "checkpoint_stored", "checkpoint": "checkpoint_000002", "iteration": 2}
    ]
    assert stored_a_checkpoint("\n".join(lines) + "\n")


def test_the_supervisor_fetches_an_attempts_log_once_not_at_every_poll() -> None:
    head = Head({"uerl-r1-1": ["RUNNING"] * 30 + ["SUCCEEDED"]})
    head.logs["uerl-r1-1"] = "iter    1 | env steps 4,000\n" * 1000  # a long run's log
    printed: list[str] = []
    sup, _ = supervisor(head, Clock())
    sup.out = printed.append
    assert sup.run() == 0
    assert "".join(printed) == head.logs["uerl-r1-1"]
    assert head.served["logs", "uerl-r1-1"] <= len(head.logs["uerl-r1-1"])  # once, at the end
