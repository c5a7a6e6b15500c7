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
supervisor's token (2), or restarts used up (1: max_restarts attempts in a row that
stored no new checkpoint).
Each attempt tells the run why it started (UERL_ATTEMPT, UERL_ATTEMPT_REASON), which
`uerl train` records in the run's `attempts.jsonl`.
A supervisor started again (its pod replaced) waits for the head, then follows the run's
running attempt; on a head with no job of the run (lost with the supervisor) it numbers
the next attempt from that stored record (training.supervise.record, a short job on the
head). A submission whose answer was lost, tried again, is refused by Ray as existing:
that job is followed.

The job client is injected (training.rayjobs `JobClient`), so the loop is tested
against a fake head that loses its jobs; a job is watched as `uerl submit` watches it
(training.rayjobs.job_watch).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from training import exit_status
from training.ray_auth.token_client import is_refusal
from training.rayjobs import job_watch
from training.rayjobs.job_client import JobClient, already_exists, failure_message, status_name
from training.rayjobs.log_tail import LogTail
from training.runstore import events
from training.runstore.attempts import ATTEMPT_VARIABLE, REASON_VARIABLE
from training.runstore.events import CHECKPOINT_STORED, HEAD_STOPPING
from training.supervise import record

RUN_METADATA = "uerl_run"  # the job metadata naming the run an attempt belongs to
RECORD_METADATA = "uerl_record_of"  # ... and the run a job reading its record is for
# ... and the supervision that submitted it: the supervisor Job's uid, which its replaced
# pods share and a new Job of the same run does not.
SUPERVISION_METADATA = "uerl_supervision"
BAD_INPUT = exit_status.BAD_INPUT  # a job that ended so would fail again
POLL_S = 5.0
# A refused token waited on for a rotation to reach the mounted Secret, at most.
TOKEN_WAIT_S = 180.0
# How long the head may stay unreachable before the supervisor gives up: KubeRay makes
# a new head pod at once, but its image may need pulling and its node scheduling.
HEAD_WAIT_S = 1800.0
RESTART_DELAY_S = 10.0
CALL_TIMEOUT_S = 60.0
MAX_RESTARTS = 10
# The stored record of attempts (a short job on the head) unread: read again this often,
# for up to the head wait.
RECORD_RETRY_S = 20.0
NODES_WAIT_S = 600


Log = Callable[[str], None]


class JobLog(Protocol):
    """A job's log passed on as it grows, each part fetched once (training.rayjobs
    .log_tail.LogTail, or a test's)."""

    def stop(self) -> None: ...
    def finish(self, logs: Callable[[], Any] | None = None) -> None: ...


# (the job client, made again after a lost head; the job; where its log goes) -> its log
TailLogs = Callable[[Callable[[], Any], str, Callable[[str], None]], JobLog]


class GiveUp(Exception):
    """No head for head_wait_s while starting: `run` ends on it (1)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.why)
        self.outcome = outcome


class TokenRefused(BaseException):
    """The job API refused the supervisor's token: the same token would be refused on
    every retry. Not an Exception, so no wait-and-retry below takes it for a head that
    does not answer; `run` ends on it (bad input)."""


def stored_a_checkpoint(log_text: str) -> bool:
    """Does this part of an attempt's log (whole lines) say a checkpoint was stored (the
    run's `checkpoint_stored` event, training.runstore.events: in a bucket once uploaded,
    not when only written on the head)?"""
    return any(event["event"] == CHECKPOINT_STORED for event in events.parse(log_text))


class _CheckpointLines:
    """Whether a log passed on in parts said a checkpoint was stored."""

    def __init__(self) -> None:
        self.seen = False
        self.head_stopping = False  # stopped by its head's own stop, not by a person
        self._partial = ""  # whole lines only: a line the stream split is read once whole

    def read(self, text: str) -> None:
        lines, _, self._partial = (self._partial + text).rpartition("\n")
        self.seen = self.seen or stored_a_checkpoint(lines)
        self.head_stopping = self.head_stopping or any(
            event["event"] == HEAD_STOPPING for event in events.parse(lines)
        )


def exit_code(message: str) -> int | None:
    """The entrypoint's exit code in a FAILED job's message, if it says one."""
    found = re.search(r"exit code (-?\d+)", message)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Outcome:
    status: str  # SUCCEEDED, STOPPED, FAILED, LOST (the head lost the job), GONE (no head)
    why: str
    progressed: bool = False  # the attempt stored a new checkpoint


class Supervisor:
    def __init__(
        self,
        connect: Callable[[], JobClient],
        run_name: str,
        train_args: Sequence[str],
        *,
        log: Log,
        tail_logs: TailLogs = LogTail,
        max_restarts: int = MAX_RESTARTS,
        poll_s: float = POLL_S,
        head_wait_s: float = HEAD_WAIT_S,
        restart_delay_s: float = RESTART_DELAY_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        out: Callable[[str], None] | None = None,
        supervision: str | None = None,
        token: Callable[[], str | None] | None = None,
        token_wait_s: float = TOKEN_WAIT_S,
    ) -> None:
        self._connect = connect
        # The token as it is now (a mounted Secret, read at each connection); None: fixed.
        self.token = token
        self.token_wait_s = token_wait_s
        self._connected_token: str | None = None
        # This supervision's id (its Job's uid; None: a `uerl supervise` by hand).
        self.supervision = supervision
        self._client: JobClient | None = None
        self.run_name = run_name
        self.train_args = list(train_args)
        self.log = log
        self.tail_logs = tail_logs
        self.out = out or (lambda text: print(text, end="", flush=True))
        self.max_restarts = max_restarts
        self.poll_s = poll_s
        self.head_wait_s = head_wait_s
        self.restart_delay_s = restart_delay_s
        self.call_timeout_s = call_timeout_s
        self.clock = clock
        self.sleep = sleep

    # ---- the job API, reached again after a lost head ---------------------------------

    def _api(self) -> JobClient:
        if self._client is None:
            self._connected_token = self.token() if self.token is not None else None
            self._client = self._connect()
        return self._client

    def _call(self, call: Callable[[JobClient], Any]) -> Any:
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
        # A failed attempt's traceback is set aside first (`;`: the attempt trains
        # whether or not that worked). On a new head the workers rejoin within a minute
        # or two: the attempt waits for them rather than failing (the user's own flags,
        # after, may say otherwise).
        set_aside = shlex.join(
            ["python", "-m", record.MODULE, self.run_name, "--set-aside-traceback"]
        )
        train = shlex.join(
            ["uerl", "train", "--run-name", self.run_name, "--resume", "auto",
             "--wait-for-nodes", str(NODES_WAIT_S), *self.train_args]
        )  # fmt: skip
        return f"{set_aside}; {train}"

    def _submit(self, attempt: int, reason: str) -> str:
        job_id = self.job_id(attempt)
        self.log(f"attempt {attempt} of run {self.run_name}: submitting job {job_id} ({reason})")
        self.log(events.line(events.ATTEMPT, attempt=attempt, job=job_id, following=False))
        try:
            self._call(
                lambda api: api.submit_job(
                    entrypoint=self.entrypoint(),
                    submission_id=job_id,
                    metadata={
                        RUN_METADATA: self.run_name,
                        "attempt": str(attempt),
                        **({SUPERVISION_METADATA: self.supervision} if self.supervision else {}),
                    },
                    runtime_env={
                        "env_vars": {ATTEMPT_VARIABLE: str(attempt), REASON_VARIABLE: reason}
                    },
                )
            )
        except Exception as exc:
            if not already_exists(exc):
                raise
            # Made by an earlier try whose answer was lost: Ray refuses the id again.
            self.log(f"job {job_id} already exists; following it")
        return job_id

    def _until_answered(self, call: Callable[[JobClient], Any], what: str) -> Any:
        """`call`'s answer, waiting for the head as long as head_wait_s; GiveUp after,
        also when the head answers other calls but keeps failing this one."""
        since = self.clock()
        while True:
            try:
                return self._call(call)
            except Exception as exc:
                outcome = self._wait_for_head(f"{what}: {exc}")
                if outcome is None and self.clock() - since >= self.head_wait_s:
                    outcome = Outcome(
                        "FAILED",
                        f"the Ray head answered, but not {what}, for {self.head_wait_s:.0f} s "
                        f"({exc})",
                    )
                if outcome is not None:
                    raise GiveUp(outcome) from None

    def _last_attempt(self) -> tuple[int, str | None, str | None]:
        """The newest attempt the head knows of this run, its status (None: none) and
        the supervision that submitted it: a supervisor started again (its pod replaced)
        carries on from there. A head that does not answer is waited for: taken for one
        with no jobs, it would be given the attempt it runs again."""
        jobs = self._until_answered(lambda api: api.list_jobs(), "listing the Ray head's jobs")
        newest, status, supervision = 0, None, None
        for job in jobs:
            metadata = getattr(job, "metadata", None) or {}
            if metadata.get(RUN_METADATA) != self.run_name:
                continue
            found = re.fullmatch(rf"uerl-{re.escape(self.run_name)}-(\d+)", job.submission_id or "")
            if found and int(found.group(1)) > newest:
                newest, status = int(found.group(1)), status_name(job.status)
                supervision = metadata.get(SUPERVISION_METADATA)
        return newest, status, supervision

    def _stored_attempt(self) -> int:
        """The newest attempt in the run's stored record (0: none yet), read by a short
        job on the head (training.supervise.record). A record that cannot be read (a
        store down, the job's log lost) is read again every RECORD_RETRY_S for up to
        head_wait_s, then the supervisor gives up (GiveUp, exit 1): numbering the
        attempts from 1 again would write a number twice."""
        since = self.clock()
        while True:
            job_id = f"uerl-{self.run_name}-record-{uuid.uuid4().hex[:8]}"

            def submit(api: JobClient, job_id: str = job_id) -> None:
                try:
                    api.submit_job(
                        entrypoint=shlex.join(["python", "-m", record.MODULE, self.run_name]),
                        submission_id=job_id,
                        metadata={RECORD_METADATA: self.run_name},
                    )
                except Exception as exc:
                    if not already_exists(exc):  # made by a try whose answer was lost
                        raise

            self._until_answered(submit, "reading the run's record")
            outcome = self._follow(job_id, out=lambda text: None)
            if outcome.status == "GONE":
                raise GiveUp(outcome)
            if outcome.status == "LOST":  # the head lost meanwhile: read again on the next
                continue
            why = outcome.why
            if outcome.status == "SUCCEEDED":
                try:
                    logs = self._call(lambda api, job_id=job_id: api.get_job_logs(job_id))
                    last = record.parse(logs)
                except Exception as exc:
                    last, why = None, f"its log could not be read: {exc}"
                if last is not None:
                    return last
                why = why if why != outcome.why else "its log said no attempt"
            waited = self.clock() - since
            if waited >= self.head_wait_s:
                raise GiveUp(
                    Outcome(
                        "FAILED",
                        f"the run's record could not be read for {waited:.0f} s (job {job_id} "
                        f"{why}); a new attempt would number the run's attempts again",
                    )
                )
            self.log(
                f"the run's record could not be read (job {job_id} {why}); again in "
                f"{RECORD_RETRY_S:.0f} s"
            )
            self.sleep(RECORD_RETRY_S)

    def run(self) -> int:
        while True:
            try:
                return self._run()
            except GiveUp as exc:
                return self._give_up(exc.outcome)
            except TokenRefused as exc:
                if self._token_rotated():  # the head has the new one, and now so do we
                    self.log(
                        f"run {self.run_name}: the stack's Ray token was rotated; going on "
                        "with the new one"
                    )
                    continue
                self.log(
                    f"run {self.run_name}: the Ray head's job API refused this supervisor's "
                    f"token (RAY_AUTH_TOKEN, from the stack's ray.token_secret): {exc}"
                )
                return BAD_INPUT

    def _token_rotated(self) -> bool:
        """After a refusal: whether the token changed from the one the refused call sent,
        waiting up to token_wait_s for the mounted Secret to follow a rotation (the
        kubelet refreshes it within a minute or two)."""
        if self.token is None:
            return False
        since = self.clock()
        while True:
            if self.token() != self._connected_token:
                self._client = None
                return True
            if self.clock() - since >= self.token_wait_s:
                return False
            self.sleep(self.poll_s)

    def _run(self) -> int:
        attempt, status, supervision = self._last_attempt()
        # Attempts in a row that stored no checkpoint: a long run whose head is replaced
        # now and then never runs out, a run that cannot get anywhere soon does.
        restarts = 0
        reason = "the run starts"
        job_id: str | None = None
        if status in ("PENDING", "RUNNING"):
            job_id = self.job_id(attempt)
            self.log(f"following attempt {attempt} (job {job_id}), already {status}")
            self.log(events.line(events.ATTEMPT, attempt=attempt, job=job_id, following=True))
        elif status in ("SUCCEEDED", "STOPPED") and supervision == self.supervision:
            # This supervision's own attempt (its pod replaced after the run ended).
            self.log(f"run {self.run_name}: attempt {attempt} already ended {status}")
            return exit_status.OK
        elif status in ("SUCCEEDED", "STOPPED"):
            # A new supervised Job of a run that ended (more --iterations, or after a
            # person's `ray job stop`): it carries the run on from its last checkpoint.
            reason = f"a new supervision of the run (attempt {attempt} had ended {status})"
        elif status == "FAILED":
            reason = f"attempt {attempt} (job {self.job_id(attempt)}) had FAILED"
        else:
            # A new head, or a new run: the stored record numbers the attempts, so a run
            # whose head and supervisor were lost together goes on counting.
            stored = self._stored_attempt()
            if stored:
                attempt = stored
                reason = (
                    f"the Ray head has no job of the run (a new head): attempt {stored} "
                    "was lost with it"
                )
        refused_since: float | None = None  # submits failing while the head answers
        while True:
            if job_id is None:
                attempt += 1
                try:
                    job_id = self._submit(attempt, reason)
                    refused_since = None
                except Exception as exc:
                    outcome = self._wait_for_head(f"submitting attempt {attempt}: {exc}")
                    if outcome is not None:
                        return self._give_up(outcome)
                    # The head answers but takes no job (a 5xx, its job agent not up):
                    # tried again for as long as a head is waited for, not for ever.
                    refused_since = self.clock() if refused_since is None else refused_since
                    if self.clock() - refused_since >= self.head_wait_s:
                        return self._give_up(
                            Outcome(
                                "FAILED",
                                f"the Ray head took no job for {self.head_wait_s:.0f} s "
                                f"(submitting attempt {attempt}: {exc})",
                            )
                        )
                    attempt -= 1
                    continue
            outcome = self._follow(job_id)
            if outcome.status in ("SUCCEEDED", "STOPPED"):
                self.log(f"run {self.run_name}: job {job_id} {outcome.status}; done")
                return exit_status.OK
            if outcome.status == "GONE":
                return self._give_up(outcome)
            if outcome.status == "FAILED" and exit_code(outcome.why) == BAD_INPUT:
                self.log(f"run {self.run_name}: job {job_id} failed on bad input: {outcome.why}")
                return BAD_INPUT
            restarts = 0 if outcome.progressed else restarts + 1
            if restarts > self.max_restarts:
                self.log(
                    f"run {self.run_name}: {outcome.why}; {self.max_restarts} restarts in a row "
                    "without a new checkpoint, giving up"
                )
                return exit_status.FAILED
            reason = outcome.why
            self.log(f"run {self.run_name}: {reason}; resuming from its last checkpoint")
            job_id = None
            self.sleep(self.restart_delay_s)

    def _give_up(self, outcome: Outcome) -> int:
        self.log(f"run {self.run_name}: {outcome.why}; giving up")
        return exit_status.FAILED

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

    def _follow(self, job_id: str, out: Callable[[str], None] | None = None) -> Outcome:
        shown, checkpoints = out or self.out, _CheckpointLines()

        def passed(text: str) -> None:
            shown(text)
            checkpoints.read(text)

        # The log streams beside the polls of the status (each part fetched once).
        tail = self.tail_logs(self._api, job_id, passed)
        try:
            outcome = self._poll(job_id, tail)
        finally:
            tail.stop()
        if outcome.status == "STOPPED" and checkpoints.head_stopping:
            # Its head stopped its jobs (a drain, an eviction, a replacing `pulumi up`):
            # lost with its head, not ended by a person.
            why = f"job {job_id} was stopped by its Ray head's own stop (its pod deleted)"
            return Outcome("LOST", why, checkpoints.seen)
        return Outcome(outcome.status, outcome.why, checkpoints.seen)

    def _poll(self, job_id: str, tail: JobLog) -> Outcome:
        watched = job_watch.watch(
            lambda: self._call(lambda api: api.get_job_status(job_id)),
            poll_s=self.poll_s,
            no_answer_s=self.head_wait_s,
            clock=self.clock,
            sleep=self.sleep,
            say=self.log,
            finish=lambda: tail.finish(lambda: self._call(lambda api: api.get_job_logs(job_id))),
        )
        if watched.status == job_watch.GONE:
            away = (
                f" (its job API unreachable for {watched.unanswered_s:.0f} s)"
                if watched.unanswered_s is not None
                else ""
            )
            return Outcome("LOST", f"the Ray head was lost{away}: job {job_id} is gone")
        if watched.status == job_watch.UNANSWERED:
            return Outcome("GONE", self._no_head())
        return Outcome(watched.status, self._why(job_id, watched.status))

    def _why(self, job_id: str, status: str) -> str:
        if status != "FAILED":
            return status
        message = ""
        with contextlib.suppress(Exception):  # best effort: the log says why too
            message = failure_message(self._call(lambda api: api.get_job_info(job_id)))
        return f"job {job_id} FAILED" + (f": {message}" if message else "")
