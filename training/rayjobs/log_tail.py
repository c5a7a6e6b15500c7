"""A Ray job's log as it grows, each part fetched once: Ray's job API streams it over a
websocket (`JobSubmissionClient.tail_job_logs`), while its logs endpoint serves the whole
log on every call (a follower polling it would download a long training's log again
every few seconds). Used by `uerl submit`'s follower and by `uerl supervise`.

The stream runs on a thread of its own (the client's tail is async). A stream cut short
(the port-forward, a head that does not answer) is opened again; Ray then sends the log
from its start, and what was passed on already is skipped. Once the job has ended,
`finish` stops the stream and takes what it had not passed on yet from the logs endpoint
once (Ray closes the stream only after it has read the log to its end; an EOF of the
connection looks the same, so the end is not taken on its word)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

RETRY_S = 1.0


class TailClient(Protocol):
    """What a LogTail calls of `ray.job_submission.JobSubmissionClient`."""

    def get_job_logs(self, job_id: str) -> str: ...
    def tail_job_logs(self, job_id: str) -> AsyncIterator[str]: ...


class LogTail:
    """Passes a job's log to `out` as it grows, each character once."""

    def __init__(
        self,
        client: Callable[[], TailClient],
        job_id: str,
        out: Callable[[str], None],
        *,
        retry_s: float = RETRY_S,
    ) -> None:
        self._client = client  # called for each stream: a new head behind the Service
        self.job_id = job_id
        self._out = out
        self.retry_s = retry_s
        self.passed = 0  # characters passed to `out`
        self.last_error: BaseException | None = None
        # `out` is called, and `passed` moved, only under it and before stop(): after
        # stop() returns, nothing more is passed on (no part twice with finish()).
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, name="uerl-job-log", daemon=True)
        self._thread.start()

    def _pass(self, text: str, offset: int, *, final: bool = False) -> None:
        """`text`, found at `offset` of the log, less what was passed on already."""
        with self._lock:
            new = text[max(0, self.passed - offset) :]
            if new and (final or not self._stopped.is_set()):
                self._out(new)
                self.passed += len(new)

    async def _stream(self) -> None:
        received = 0
        async for chunk in self._client().tail_job_logs(self.job_id):
            self._pass(chunk, received)
            received += len(chunk)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while not self._stopped.is_set():
                with self._lock:
                    if self._stopped.is_set():
                        break
                    self._loop, self._task = loop, loop.create_task(self._stream())
                try:
                    loop.run_until_complete(self._task)
                except asyncio.CancelledError:
                    break
                except Exception as exc:  # the connection, the head; opened again
                    self.last_error = exc
                self._stopped.wait(self.retry_s)
        finally:
            with self._lock:
                self._loop = self._task = None
            loop.close()

    def stop(self) -> None:
        """No more streaming; nothing more is passed on once this returns."""
        with self._lock:
            self._stopped.set()
            if self._loop is not None and self._task is not None:
                with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                    self._loop.call_soon_threadsafe(self._task.cancel)

    def finish(self, logs: Callable[[], Any] | None = None) -> None:
        """After the job ended: stops streaming and passes on the rest of the log, from
        one call of the logs endpoint (`logs`: how to make it; default the client's)."""
        self.stop()
        whole = logs() if logs is not None else self._client().get_job_logs(self.job_id)
        self._pass(str(whole), 0, final=True)
