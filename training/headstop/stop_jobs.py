"""`python -m training.headstop.stop_jobs`: the head pod's preStop hook. A head deleted
gracefully (a node drained, an eviction, a `pulumi up` that replaces it) gets SIGTERM on
its container, whose `ray start` takes Ray down at once: the driver of a running
`uerl train` would die without its final checkpoint and upload. Here, first, each
running job is stopped through the head's own job API (Ray sends its driver SIGTERM,
then SIGKILL RAY_JOB_STOP_WAIT_TIME_S later), and this waits until they have ended, at
most that long. The pod's terminationGracePeriodSeconds covers this wait and Ray's stop
after it (infra.manifests.raycluster)."""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infra.contract import DASHBOARD_PORT, JOB_STOP_GRACE_S
from training import exit_status
from training.runstore.events import HEAD_STOPPING_MARKER

RUNNING = ("PENDING", "RUNNING")
POLL_S = 1.0
CONNECT_WAIT_S = 15  # the job API's first answer, at most


def stop_running_jobs(
    client: Any,
    *,
    wait_s: float = JOB_STOP_GRACE_S,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    answered: Callable[[], object] = lambda: None,
) -> list[str]:
    """Stops every running job of `client` (Ray's JobSubmissionClient) and waits up to
    `wait_s` for them to end; the ids of those still running then. `answered` is called
    once the job API has answered (its first listing)."""

    def running() -> list[str]:
        return [
            job.submission_id
            for job in client.list_jobs()
            if job.submission_id and str(getattr(job.status, "value", job.status)) in RUNNING
        ]

    jobs = running()
    answered()
    for job_id in jobs:
        log(f"the head is stopping: stopping job {job_id} (its driver gets SIGTERM)")
        client.stop_job(job_id)
    since = clock()
    left = jobs
    while left and clock() - since < wait_s:
        sleep(POLL_S)
        left = [job_id for job_id in running() if job_id in jobs]
    if left:
        log(f"still running after {wait_s:.0f} s: {', '.join(left)}")
    return left


def _no_answer(_signum: int, _frame: object) -> None:
    raise TimeoutError(f"the head's job API did not answer within {CONNECT_WAIT_S} s")


def main(argv: Sequence[str]) -> int:
    from ray.job_submission import JobSubmissionClient

    from training.ray_auth import token_client

    del argv
    # First the mark its jobs' drivers read when they are stopped (events.HEAD_STOPPING).
    (Path(tempfile.gettempdir()) / HEAD_STOPPING_MARKER).touch()
    # A head whose Ray is already gone must not hold its pod's deletion for the whole
    # grace: the job API answers within this, or the hook ends.
    signal.signal(signal.SIGALRM, _no_answer)
    signal.alarm(CONNECT_WAIT_S)
    try:
        client = JobSubmissionClient(
            f"http://127.0.0.1:{DASHBOARD_PORT}",
            headers=token_client.headers(token_client.token_from_env()),
        )
        stop_running_jobs(client, answered=lambda: signal.alarm(0))
    except Exception as exc:  # the pod stops all the same: said, in its events
        print(f"the head's jobs were not stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exit_status.FAILED
    return exit_status.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
