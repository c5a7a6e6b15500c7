"""training.runstore.events: what a run says to its supervisor and the tests, as lines
of its log, and what a person at a terminal is spared of them."""

from __future__ import annotations

import io
import math
import os
import pty
from types import SimpleNamespace
from typing import Any

import run_events

from training.run import driver, metrics
from training.runstore import events
from training.submit.job import CtrlC, Follower

ROW = metrics.IterationRow(
    iteration=3, env_steps_total=3000, episodes_total=4, time_s=2.5, env_steps_per_s=400.0,
    episode_return_mean=math.nan, episode_len_mean=math.nan, learner_steps_per_s=math.nan,
    runners_healthy=2, runners_total=3, runners_unknown=1,
)  # fmt: skip


def test_an_iterations_event_carries_the_progress_lines_figures_nan_as_null() -> None:
    [event] = run_events.iterations(driver._iteration_event(ROW))
    assert event == {
        "event": "iteration", "iteration": 3, "env_steps": 3000, "steps_per_s": 400.0,
        "return_mean": None, "time_s": 2.5, "runners": [2, 3], "unknown": 1,
    }  # fmt: skip


def test_an_event_line_read_back_is_what_was_said_whatever_comes_before_it() -> None:
    said = events.checkpoint_stored("checkpoint_000010", uploaded_mib=1.5, upload_s=0.25)
    assert run_events.events(f"uerl supervise: {said}\n") == [
        {"event": "checkpoint_stored", "checkpoint": "checkpoint_000010", "iteration": 10,
         "uploaded_mib": 1.5, "upload_s": 0.25}
    ]  # fmt: skip


def test_a_terminal_is_given_the_log_without_its_event_lines_a_pipe_with_them() -> None:
    text = "iter    3 | ...\n" + driver._iteration_event(ROW) + "\nnext\n"
    main, side = pty.openpty()
    try:
        with os.fdopen(side, "w", closefd=False) as terminal:
            assert events.for_stream(text, terminal) == "iter    3 | ...\nnext\n"
    finally:
        os.close(main)
        os.close(side)
    assert events.for_stream(text, io.StringIO()) == text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Jobs:
    """A job whose log comes in parts that cut an event line in two, then ends."""

    parts = ['iter 1\nuerl-event: {"event": ', '"iteration"}\niter 2\nlast']

    def __init__(self) -> None:
        self.polls = 0

    def get_job_status(self, job_id: str) -> str:
        self.polls += 1
        return "SUCCEEDED" if self.polls > 2 else "RUNNING"

    def get_job_logs(self, job_id: str) -> str:
        return "".join(self.parts)

    async def tail_job_logs(self, job_id: str) -> Any:
        for part in self.parts:
            yield part

    def get_job_info(self, job_id: str) -> Any:
        return SimpleNamespace(message="")


def test_uerl_submit_on_a_terminal_shows_whole_lines_without_events_and_the_last_line() -> None:
    out = _Terminal()
    follower = Follower(
        _Jobs(), "job-1", head=lambda: "pod h", follow_hint="HINT", out=out, err=io.StringIO(),
        poll_s=0.05,
    )  # fmt: skip
    assert follower.run(CtrlC()) == 0
    assert out.getvalue() == "iter 1\niter 2\nlast"
