"""The Ray job: submitted through the head's job API, its log streamed, its end turned
into an exit status; Ctrl-C stops it (its `uerl train` then writes a final checkpoint).

The job client is injected (training.rayjobs `JobClient`: the calls of Ray's
`JobSubmissionClient`), so streaming, the exit statuses and Ctrl-C are tested against a
fake; the watch of its status is training.rayjobs', as `uerl supervise`'s is."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, TextIO

from infra.contract import JOB_STOP_GRACE_S
from training import exit_status
from training.ray_auth import token_client
from training.rayjobs import job_watch
from training.rayjobs.job_client import JobClient, failure_message
from training.rayjobs.log_tail import LogTail
from training.runstore import events
from training.submit.submit_error import BAD_INPUT, CLUSTER_UNUSABLE, SubmitError

# A job's terminal status -> `uerl submit`'s exit status (130: stopped, as after Ctrl-C).
EXIT_STATUS = {
    "SUCCEEDED": exit_status.OK,
    "FAILED": exit_status.FAILED,
    "STOPPED": exit_status.INTERRUPTED,
}
INTERRUPTED = exit_status.INTERRUPTED
POLL_S = 1.0
# No answer from the job API for this long (the head gone, the API unreachable): give up.
NO_ANSWER_S = 120.0
# After `stop_job`: Ray gives the job JOB_STOP_GRACE_S after its SIGTERM before SIGKILL,
# then marks it STOPPED; past this, stop waiting for that.
STOP_WAIT_S = JOB_STOP_GRACE_S + 60.0
# Ray's job client takes these over the address it is given: a RAY_ADDRESS left set for
# `ray job submit` would send the job elsewhere than the port-forward to this stack.
ADDRESS_VARIABLES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")


def entrypoint(command: Sequence[str]) -> str:
    """`uerl train ...` as one shell line: the job runs it with a shell on the head."""
    return shlex.join(["uerl", *command])


@contextlib.contextmanager
def _without(names: Sequence[str]) -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def no_proxy_to_the_relay() -> Iterator[None]:
    """Ray's job client (requests) would send http://127.0.0.1:PORT to an HTTP proxy
    named in the environment unless no_proxy names 127.0.0.1: it does, meanwhile."""
    saved = {name: os.environ.get(name) for name in ("no_proxy", "NO_PROXY")}
    for name, value in saved.items():
        os.environ[name] = f"{value},127.0.0.1" if value else "127.0.0.1"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def connect_client(
    url: str,
    *,
    head: Callable[[], str],
    token: str | None = None,
    token_source: str = "",
    wait_s: float = 15.0,
) -> JobClient:
    """Ray's job client on `url`, sending `token` (from `token_source`, for the message
    when it is refused); its first request checks the job API answers. The head's
    dashboard may still be starting when the pod turns Ready: retried briefly."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + wait_s
    while True:
        try:
            with _without(ADDRESS_VARIABLES):
                client: JobClient = JobSubmissionClient(url, headers=token_client.headers(token))
            return client
        except Exception as exc:  # ConnectionError, or RuntimeError: a non-200 answer
            if token_client.is_refusal(exc):
                raise SubmitError(refused(exc, token, token_source), BAD_INPUT) from None
            if time.monotonic() >= deadline:
                raise SubmitError(
                    f"the job API of the Ray head ({head()}) does not answer: {reason(exc)}",
                    CLUSTER_UNUSABLE,
                ) from None
            time.sleep(1.0)


def refused(exc: BaseException, token: str | None, token_source: str) -> str:
    """The job API's refusal of a token, or of none, in a line."""
    said = str(exc).splitlines()[0].strip() if str(exc).strip() else type(exc).__name__
    if token is None:
        return (
            f"the Ray head's job API asks for a token and the endpoints name none "
            f"(ray.token_secret): {said}. `pulumi up` with this uerl names it"
        )
    return f"the Ray head's job API refused the token from the {token_source}: {said}"


def reason(exc: BaseException) -> str:
    """An error of the job API in a line. A refusal's body can be the dashboard's own
    traceback ("Request failed with status code 400: Traceback ..."): its last line."""
    text = str(exc) or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and "Traceback (most recent call last)" in text:
        status = re.match(r"Request failed with status code (\d+)", text)
        return (f"status {status[1]}: " if status else "") + lines[-1].rstrip(".") + "."
    return " ".join(lines)


def submit(client: JobClient, command: Sequence[str], submission_id: str | None) -> str:
    try:
        return client.submit_job(entrypoint=entrypoint(command), submission_id=submission_id)
    except Exception as exc:  # RuntimeError: the API said no; ConnectionError: no answer
        said = reason(exc)
        if submission_id is not None and "already exists" in said:
            raise SubmitError(
                f"--submission-id {submission_id}: the cluster has a job with that id "
                "already; choose another",
                BAD_INPUT,
            ) from None
        raise SubmitError(f"submitting the job failed: {said}", CLUSTER_UNUSABLE) from None


def _status(value: Any) -> str:
    return str(getattr(value, "value", value))  # JobStatus is a str enum


class CtrlC:
    """SIGINT while a job is followed: the first press asks for the job to be stopped,
    the second leaves at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.presses = 0
        self._previous: Any = None

    @property
    def requested(self) -> bool:
        return self.presses > 0

    def press(self) -> None:
        self.presses += 1
        if self.presses > 1:
            raise KeyboardInterrupt

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.press()

    def __enter__(self) -> CtrlC:
        # Handlers can only be set from the main thread (not under some test runners).
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class Follower:
    """Prints a job's log as it grows until the job ends; returns the exit status."""

    def __init__(
        self,
        client: JobClient,
        job_id: str,
        *,
        head: Callable[[], str],
        follow_hint: str,
        out: TextIO | None = None,
        err: TextIO | None = None,
        prog: str = "uerl submit",
        poll_s: float = POLL_S,
        no_answer_s: float = NO_ANSWER_S,
        stop_wait_s: float = STOP_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.head = head  # names the head (and the relay's last error) in messages
        self.follow_hint = follow_hint  # how to follow/stop the job without us
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.prog = prog
        self.poll_s = poll_s
        self.no_answer_s = no_answer_s
        self.stop_wait_s = stop_wait_s
        self.clock = clock
        self.sleep = sleep
        self.stop_asked_at: float | None = None
        self.stop_sent = False
        self._partial = ""  # on a terminal: a line not yet whole

    def _say(self, text: str) -> None:
        print(f"{self.prog}: {text}", file=self.err, flush=True)

    def run(self, ctrl_c: CtrlC) -> int:
        try:
            return self._loop(ctrl_c)
        except KeyboardInterrupt:
            self._say(
                f"left without waiting: job {self.job_id} may still be running. " + self.follow_hint
            )
            return INTERRUPTED

    def _write(self, text: str) -> None:
        # A terminal is given whole lines without the run's event lines; a file or a
        # pipe, the log as it comes.
        if not events.is_terminal(self.out):
            self.out.write(text)
        else:
            whole, _, self._partial = (self._partial + text).rpartition("\n")
            if whole:
                self.out.write(events.for_stream(whole + "\n", self.out))
        self.out.flush()

    def _send_stop(self) -> None:
        if self.stop_asked_at is None:  # the wait for the job to stop counts from here
            self.stop_asked_at = self.clock()
        try:
            self.client.stop_job(self.job_id)
        except Exception:
            return  # the port-forward between heads: sent again on the next poll
        self.stop_sent = True
        self._say(
            f"stopping job {self.job_id}: it finishes its iteration and writes a final "
            f"checkpoint (Ray waits up to {JOB_STOP_GRACE_S} s); Ctrl-C again to leave now"
        )

    def _loop(self, ctrl_c: CtrlC) -> int:
        # The log streams beside the polls of the status (each part fetched once).
        tail = LogTail(lambda: self.client, self.job_id, self._write)
        try:
            return self._polls(ctrl_c, tail)
        finally:
            tail.stop()
            if self._partial:  # the log's last line, without its newline
                self.out.write(self._partial)
                self.out.flush()

    def _polls(self, ctrl_c: CtrlC, tail: LogTail) -> int:
        def ctrl_c_sent_on() -> None:
            if ctrl_c.requested and not self.stop_sent:
                self._send_stop()

        def stop_waited_out(_status: str) -> bool:
            return self.stop_asked_at is not None and (
                self.clock() - self.stop_asked_at > self.stop_wait_s
            )

        watched = job_watch.watch(
            lambda: self.client.get_job_status(self.job_id),
            poll_s=self.poll_s,
            no_answer_s=self.no_answer_s,
            clock=self.clock,
            sleep=self.sleep,
            before_poll=ctrl_c_sent_on,
            leave=stop_waited_out,
            finish=tail.finish,  # without it the log printed lacks its end
        )
        if watched.status == job_watch.GONE:
            self._say(
                f"job {self.job_id} is gone: the Ray head ({self.head()}) was replaced, "
                "and a new head has none of the old one's jobs. Submit the training "
                "again with `--resume auto` and the same --run-name to go on from its "
                "last stored checkpoint, or with --supervise to have that done "
                "whenever the head is lost"
            )
            return CLUSTER_UNUSABLE
        if watched.status == job_watch.UNANSWERED:
            assert watched.error is not None
            self._say(
                f"no answer about job {self.job_id} from the Ray head ({self.head()}) "
                f"for {self.no_answer_s:.0f} s: {reason(watched.error).rstrip('.')}. "
                + self.follow_hint
            )
            return CLUSTER_UNUSABLE
        if watched.status == job_watch.LEFT:
            self._say(
                f"job {self.job_id} is still {watched.running} {self.stop_wait_s:.0f} s after "
                f"it was asked to stop. {self.follow_hint}"
            )
            return INTERRUPTED
        return self._ended(watched.status, ctrl_c)

    def _ended(self, status: str, ctrl_c: CtrlC) -> int:
        if status == "FAILED":
            message = ""
            # Its first line ("... failed with exit code 1"); the rest repeats the log. Best
            # effort: the log printed above already says why, should the API not answer.
            with contextlib.suppress(Exception):
                message = failure_message(self.client.get_job_info(self.job_id))
            self._say(f"job {self.job_id} FAILED" + (f": {message}" if message else ""))
            return EXIT_STATUS["FAILED"]
        self._say(f"job {self.job_id} {status}")
        # Stopped on request, whether or not it managed to finish first.
        return INTERRUPTED if ctrl_c.requested else EXIT_STATUS[status]
