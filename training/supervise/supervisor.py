"""Keeps one stored run training until it is done: the loop `uerl supervise` runs in the
stack's namespace (a Kubernetes Job `uerl submit --supervise` makes).

It submits `uerl train --run-name RUN --resume auto ...` to the Ray head's job API as
attempt 1, follows it, and when the attempt is lost submits the next one, which resumes
from the run's last stored checkpoint:
- the head was lost (deleted, evicted, OOM-killed, replaced by `pulumi up`): the job API
  stops answering, then answers from a new head that has no such job (a head keeps its
  jobs in memory; KubeRay's GCS fault tolerance does not keep a job running either);
- the job FAILED (a learner pod lost kills the driver's learner actor, a crash).
It ends with the run: SUCCEEDED (0), STOPPED by a person (0: not resubmitted), a job
that failed on bad input (exit code 2: it would fail again; 2), a job API refusing the
supervisor's token (2), or restarts used up (1).
Each attempt tells the run why it started (UERL_ATTEMPT, UERL_ATTEMPT_REASON), which
`uerl train` records in the run's `attempts.jsonl`.

The job client is injected (the calls of Ray's JobSubmissionClient used here), so the
loop is tested against a fake head that loses its jobs.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from training.ray_auth.token_client import is_refusal
from training.runstore.attempts import ATTEMPT_VARIABLE, REASON_VARIABLE

RUN_METADATA = "uerl_run"  # the job metadata naming the run an attempt belongs to
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
BAD_INPUT = 2
POLL_S = 5.0
# How long the head may stay unreachable before the supervisor gives up: KubeRay makes
# a new head pod at once, but its image may need pulling and its node scheduling.
HEAD_WAIT_S = 1800.0
RESTART_DELAY_S = 10.0
CALL_TIMEOUT_S = 60.0
MAX_RESTARTS = 10
NODES_WAIT_S = 600


class SuperviseClient(Protocol):
    """What the supervisor calls of `ray.job_submission.JobSubmissionClient`."""

    def submit_job(self, **kwargs: Any) -> str: ...
    def get_job_status(self, job_id: str) -> Any: ...
    def get_job_info(self, job_id: str) -> Any: ...
    def get_job_logs(self, job_id: str) -> str: ...
    def list_jobs(self) -> list[Any]: ...


Log = Callable[[str], None]


class TokenRefused(BaseException):
    """The job API refused the supervisor's token: the same token would be refused on
    every retry. Not an Exception, so no wait-and-retry below takes it for a head that
    does not answer; `run` ends on it (bad input)."""


def _status(value: Any) -> str:
    return str(getattr(value, "value", value))  # JobStatus is a str enum


def job_gone(exc: BaseException) -> bool:
    """The job API answered that it has no such job (a new head)."""
    text = str(exc)
    return "does not exist" in text or "status code 404" in text


def exit_code(message: str) -> int | None:
    """The entrypoint's exit code in a FAILED job's message, if it says one."""
    found = re.search(r"exit code (-?\d+)", message)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Outcome:
    status: str  # SUCCEEDED, STOPPED, FAILED, LOST (the head lost the job), GONE (no head)
    why: str


class Supervisor:
    def __init__(
        self,
        connect: Callable[[], SuperviseClient],
        run_name: str,
        train_args: Sequence[str],
        *,
        log: Log,
        max_restarts: int = MAX_RESTARTS,
        poll_s: float = POLL_S,
        head_wait_s: float = HEAD_WAIT_S,
        restart_delay_s: float = RESTART_DELAY_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        out: Callable[[str], None] | None = None,
    ) -> None:
        self._connect = connect
        self._client: SuperviseClient | None = None
        self.run_name = run_name
        self.train_args = list(train_args)
        self.log = log
        self.out = out or (lambda text: print(text, end="", flush=True))
        self.max_restarts = max_restarts
        self.poll_s = poll_s
        self.head_wait_s = head_wait_s
        self.restart_delay_s = restart_delay_s
        self.call_timeout_s = call_timeout_s
        self.clock = clock
        self.sleep = sleep

    # ---- the job API, reached again after a lost head ---------------------------------

    def _api(self) -> SuperviseClient:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _call(self, call: Callable[[SuperviseClient], Any]) -> Any:
        """One call of the job API, bounded: Ray's client sets no timeout, and a request
        to a head pod that vanished mid-way can wait for TCP to give up (minutes)."""
        box: list[Any] = []

        def attempt() -> None:
            try:
                box.append((True, call(self._api())))
            except Exception as exc:
                box.append((False, exc))

        worker = threading.Thread(target=attempt, name="uerl-supervise-call", daemon=True)
        worker.start()
        worker.join(self.call_timeout_s)
        if not box:  # left behind; it ends when its socket does
            self._client = None
            raise TimeoutError(f"no answer in {self.call_timeout_s:.0f} s")
        ok, value = box[0]
        if not ok:
            self._client = None  # a new connection next time (a new head behind the Service)
            if is_refusal(value):
                raise TokenRefused(str(value).splitlines()[0]) from None
            raise value
        return value

    # ---- attempts ------------------------------------------------------------------

    def job_id(self, attempt: int) -> str:
        return f"uerl-{self.run_name}-{attempt}"

    def entrypoint(self) -> str:
        # On a new head the workers rejoin within a minute or two: the attempt waits for
        # them rather than failing (the user's own flags, after, may say otherwise).
        return shlex.join(
            ["uerl", "train", "--run-name", self.run_name, "--resume", "auto",
             "--wait-for-nodes", str(NODES_WAIT_S), *self.train_args]
        )  # fmt: skip

    def _submit(self, attempt: int, reason: str) -> str:
        job_id = self.job_id(attempt)
        self.log(f"attempt {attempt} of run {self.run_name}: submitting job {job_id} ({reason})")
        self._call(
            lambda api: api.submit_job(
                entrypoint=self.entrypoint(),
                submission_id=job_id,
                metadata={RUN_METADATA: self.run_name, "attempt": str(attempt)},
                runtime_env={"env_vars": {ATTEMPT_VARIABLE: str(attempt), REASON_VARIABLE: reason}},
            )
        )
        return job_id

    def _last_attempt(self) -> tuple[int, str | None]:
        """The newest attempt the head knows of this run, and its status (None: none):
        a supervisor started again (its pod replaced) carries on from there."""
        try:
            jobs = self._call(lambda api: api.list_jobs())
        except Exception:
            return 0, None
        newest, status = 0, None
        for job in jobs:
            if (getattr(job, "metadata", None) or {}).get(RUN_METADATA) != self.run_name:
                continue
            found = re.fullmatch(rf"uerl-{re.escape(self.run_name)}-(\d+)", job.submission_id or "")
            if found and int(found.group(1)) > newest:
                newest, status = int(found.group(1)), _status(job.status)
        return newest, status

    def run(self) -> int:
        try:
            return self._run()
        except TokenRefused as exc:
            self.log(
                f"run {self.run_name}: the Ray head's job API refused this supervisor's "
                f"token (RAY_AUTH_TOKEN, from the stack's ray.token_secret): {exc}"
            )
            return BAD_INPUT

    def _run(self) -> int:
        attempt, status = self._last_attempt()
        restarts = 0
        reason = "the run starts"
        job_id: str | None = None
        if status in ("PENDING", "RUNNING"):
            job_id = self.job_id(attempt)
            self.log(f"following attempt {attempt} (job {job_id}), already {status}")
        elif status in ("SUCCEEDED", "STOPPED"):
            self.log(f"run {self.run_name}: attempt {attempt} already ended {status}")
            return 0
        elif status == "FAILED":
            reason = f"attempt {attempt} (job {self.job_id(attempt)}) had FAILED"
        while True:
            if job_id is None:
                attempt += 1
                try:
                    job_id = self._submit(attempt, reason)
                except Exception as exc:
                    outcome = self._wait_for_head(f"submitting attempt {attempt}: {exc}")
                    if outcome is not None:
                        return self._give_up(outcome)
                    attempt -= 1
                    continue
            outcome = self._follow(job_id)
            if outcome.status in ("SUCCEEDED", "STOPPED"):
                self.log(f"run {self.run_name}: job {job_id} {outcome.status}; done")
                return 0
            if outcome.status == "GONE":
                return self._give_up(outcome)
            if outcome.status == "FAILED" and exit_code(outcome.why) == BAD_INPUT:
                self.log(f"run {self.run_name}: job {job_id} failed on bad input: {outcome.why}")
                return BAD_INPUT
            restarts += 1
            if restarts > self.max_restarts:
                self.log(
                    f"run {self.run_name}: {outcome.why}; {self.max_restarts} restarts used, "
                    "giving up"
                )
                return 1
            reason = outcome.why
            self.log(f"run {self.run_name}: {reason}; resuming from its last checkpoint")
            job_id = None
            self.sleep(self.restart_delay_s)

    def _give_up(self, outcome: Outcome) -> int:
        self.log(f"run {self.run_name}: {outcome.why}; giving up")
        return 1

    def _wait_for_head(self, what: str) -> Outcome | None:
        """Waits for the job API to answer (None), or GONE after head_wait_s."""
        since = self.clock()
        self.log(f"{what}; waiting for the Ray head's job API")
        while self.clock() - since <= self.head_wait_s:
            self.sleep(self.poll_s)
            try:
                self._call(lambda api: api.list_jobs())
                return None
            except Exception:
                continue
        return Outcome("GONE", self._no_head())

    def _no_head(self) -> str:
        return f"the Ray head's job API did not answer for {self.head_wait_s:.0f} s"

    def _follow(self, job_id: str) -> Outcome:
        printed = 0
        unreachable_since: float | None = None
        while True:
            try:
                status = _status(self._call(lambda api: api.get_job_status(job_id)))
                logs = self._call(lambda api: api.get_job_logs(job_id))
            except Exception as exc:
                if job_gone(exc):
                    away = (
                        f" (its job API unreachable for {self.clock() - unreachable_since:.0f} s)"
                        if unreachable_since is not None
                        else ""
                    )
                    return Outcome("LOST", f"the Ray head was lost{away}: job {job_id} is gone")
                if unreachable_since is None:
                    unreachable_since = self.clock()
                    self.log(f"the Ray head's job API does not answer: {exc}")
                elif self.clock() - unreachable_since > self.head_wait_s:
                    return Outcome("GONE", self._no_head())
                self.sleep(self.poll_s)
                continue
            if unreachable_since is not None:
                self.log(
                    f"the Ray head's job API answers again after "
                    f"{self.clock() - unreachable_since:.0f} s"
                )
                unreachable_since = None
            if len(logs) > printed:
                self.out(logs[printed:])
                printed = len(logs)
            if status in TERMINAL:
                return Outcome(status, self._why(job_id, status))
            self.sleep(self.poll_s)

    def _why(self, job_id: str, status: str) -> str:
        if status != "FAILED":
            return status
        message = ""
        with contextlib.suppress(Exception):  # best effort: the log says why too
            info = self._call(lambda api: api.get_job_info(job_id))
            message = (str(info.message or "").strip().splitlines() or [""])[0]
            # Ray's "..., last available logs (truncated to 20,000 chars):" leads nowhere
            # here: the attempt's log is above.
            message = message.split(", last available logs")[0].rstrip(":")
        return f"job {job_id} FAILED" + (f": {message}" if message else "")
