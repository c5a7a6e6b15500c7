"""What uerl calls of Ray's `JobSubmissionClient`, and what its answers mean."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

# A job's statuses that do not change again.
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class JobClient(Protocol):
    """The calls of `ray.job_submission.JobSubmissionClient` uerl makes (injected, so
    following, exit statuses and supervision are tested against fakes)."""

    def submit_job(self, **kwargs: Any) -> str: ...
    def get_job_status(self, job_id: str) -> Any: ...
    def get_job_info(self, job_id: str) -> Any: ...
    def get_job_logs(self, job_id: str) -> str: ...
    def tail_job_logs(self, job_id: str) -> AsyncIterator[str]: ...
    def stop_job(self, job_id: str) -> bool: ...
    def list_jobs(self) -> list[Any]: ...


def status_name(value: Any) -> str:
    """A status as its name: `JobStatus` is a str enum, a fake may answer the name."""
    return str(getattr(value, "value", value))


def job_gone(exc: BaseException) -> bool:
    """The job API answered that it has no such job: a head keeps its jobs in memory, so
    one that answers so about a job it ran is a new head (the old one replaced)."""
    text = str(exc)
    return "status code 404" in text or "does not exist" in text


def already_exists(exc: BaseException) -> bool:
    """The job API refused a submission id it has (Ray's job manager: "Job with
    submission_id ... already exists"): a submit whose answer was lost made it."""
    return "already exists" in str(exc)


def failure_message(info: Any) -> str:
    """The first line of a FAILED job's message ("... failed with exit code 1"), without
    Ray's ", last available logs (truncated to 20,000 chars):" (the log says the rest)."""
    message = (str(getattr(info, "message", "") or "").strip().splitlines() or [""])[0]
    return message.split(", last available logs")[0].rstrip(":")
