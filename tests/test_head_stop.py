"""The head's preStop hook (training.headstop.stop_jobs): a head deleted gracefully stops
its running jobs first (their drivers get SIGTERM and write their final checkpoint) and
waits for them, at most Ray's grace for a stopped job. Against a fake job API."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from training.headstop.stop_jobs import stop_running_jobs


class JobApi:
    def __init__(self, statuses: dict[str, str], ends_after_polls: int) -> None:
        self.statuses = statuses
        self.stopped: list[str] = []
        self.ends_after_polls = ends_after_polls  # a stopped job's driver ends after these

    def list_jobs(self) -> list[Any]:
        if self.stopped:
            self.ends_after_polls -= 1
            if self.ends_after_polls < 0:
                for job_id in self.stopped:
                    self.statuses[job_id] = "STOPPED"
        return [SimpleNamespace(submission_id=j, status=s) for j, s in self.statuses.items()]

    def stop_job(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_each_running_job_is_stopped_and_waited_for_until_it_ends() -> None:
    api = JobApi({"uerl-r1-2": "RUNNING", "uerl-r1-1": "FAILED", "other": "SUCCEEDED"}, 5)
    clock = Clock()
    lines: list[str] = []
    left = stop_running_jobs(api, wait_s=120, log=lines.append, clock=lambda: clock.now,
                             sleep=clock.sleep)  # fmt: skip
    assert api.stopped == ["uerl-r1-2"] and left == []
    assert 5 <= clock.now < 10
    assert "stopping job uerl-r1-2" in lines[0]


def test_a_job_that_does_not_end_is_waited_for_at_most_the_grace() -> None:
    api = JobApi({"uerl-r1-1": "RUNNING"}, 10**6)
    clock = Clock()
    lines: list[str] = []
    left = stop_running_jobs(api, wait_s=120, log=lines.append, clock=lambda: clock.now,
                             sleep=clock.sleep)  # fmt: skip
    assert left == ["uerl-r1-1"] and 120 <= clock.now <= 121
    assert "still running after 120 s: uerl-r1-1" in lines[-1]


def test_a_head_whose_job_api_does_not_answer_ends_its_hook_in_seconds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile
    import time

    import ray.job_submission

    from training.headstop import stop_jobs

    def hangs(*args: object, **kwargs: object) -> None:
        time.sleep(60)  # Ray's client connecting to a dashboard that is gone

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", hangs)
    monkeypatch.setattr(stop_jobs, "CONNECT_WAIT_S", 1)
    started = time.monotonic()
    assert stop_jobs.main([]) == 1
    assert time.monotonic() - started < 30  # a hang guard, not a speed goal
    assert "did not answer within 1 s" in capsys.readouterr().err
