"""training.rayjobs.job_watch: the one loop `uerl submit` and `uerl supervise` follow a
Ray job's status with (each also tested through its own command's suite)."""

from __future__ import annotations

from typing import Any

from training.rayjobs import job_watch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _answers(*answers: Any) -> Any:
    """A status call answering each in turn (an Exception is raised), the last repeating."""
    calls = iter(answers)
    last: list[Any] = []

    def status() -> Any:
        answer = next(calls, None)
        if answer is None:
            answer = last[0]
        last[:] = [answer]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return status


def _watch(status: Any, **kwargs: Any) -> job_watch.Watched:
    clock = Clock()
    return job_watch.watch(
        status, poll_s=1.0, no_answer_s=kwargs.pop("no_answer_s", 10.0), clock=clock,
        sleep=clock.sleep, **kwargs,
    )  # fmt: skip


def test_a_terminal_status_ends_the_watch_after_finish_ran() -> None:
    finished: list[bool] = []
    watched = _watch(
        _answers("PENDING", "RUNNING", "SUCCEEDED"), finish=lambda: finished.append(True)
    )
    assert watched == job_watch.Watched("SUCCEEDED") and finished == [True]


def test_a_finish_that_fails_does_not_hide_the_jobs_end() -> None:
    def finish() -> None:
        raise ConnectionError("the log's end unread")

    assert _watch(_answers("FAILED"), finish=finish).status == "FAILED"


def test_a_head_that_has_no_such_job_is_gone_with_how_long_it_had_not_answered() -> None:
    cut = ConnectionError("Connection refused")
    gone = RuntimeError("Request failed with status code 404: Job j does not exist")
    watched = _watch(_answers("RUNNING", cut, cut, cut, gone))
    assert watched.status == job_watch.GONE and watched.error is gone
    assert watched.unanswered_s == 3.0


def test_no_answer_past_the_bound_ends_the_watch_unanswered_with_the_last_error() -> None:
    cut = ConnectionError("Connection refused")
    said: list[str] = []
    watched = _watch(_answers("RUNNING", cut), no_answer_s=10.0, say=said.append)
    assert watched.status == job_watch.UNANSWERED and watched.error is cut
    assert watched.unanswered_s is not None and watched.unanswered_s > 10.0
    assert said == ["the Ray head's job API does not answer: Connection refused"]


def test_an_api_that_answers_again_is_said_and_its_bound_starts_over() -> None:
    cut = ConnectionError("Connection refused")
    said: list[str] = []
    # 9 s without an answer, an answer, then 9 s more: never over 10 in a row.
    status = _answers("RUNNING", *[cut] * 9, "RUNNING", *[cut] * 9, "SUCCEEDED")
    assert _watch(status, no_answer_s=10.0, say=said.append).status == "SUCCEEDED"
    assert said[1] == "the Ray head's job API answers again after 9 s" and len(said) == 4


def test_leave_ends_the_watch_on_a_running_status_and_before_poll_runs_each_time() -> None:
    polls: list[int] = []
    watched = _watch(
        _answers("RUNNING"), before_poll=lambda: polls.append(1), leave=lambda _s: len(polls) == 3
    )
    assert watched == job_watch.Watched(job_watch.LEFT, running="RUNNING") and len(polls) == 3
