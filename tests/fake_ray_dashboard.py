"""A stand-in for a Ray head's job API over HTTP, for Ray's real JobSubmissionClient:
one job whose log grows a line at a time, then ends SUCCEEDED; its log served both ways
Ray serves it (the whole log from `/logs`, new lines over the `/logs/tail` websocket),
counting the characters of log each way sends (`served`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from aiohttp import web


class FakeDashboard:
    def __init__(self, job_id: str, *, preamble: str, lines: int, line_every_s: float) -> None:
        self.job_id = job_id
        self.preamble = preamble  # the log at the start (a long run's log so far)
        self.lines = lines
        self.line_every_s = line_every_s
        self.served = {"logs": 0, "tail": 0}
        self.started: float | None = None
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def log(self) -> tuple[str, bool]:
        """The log so far, and whether the job has ended (once its last line is out)."""
        if self.started is None:
            self.started = time.monotonic()
        written = min(self.lines, int((time.monotonic() - self.started) / self.line_every_s))
        body = "".join(f"iter {n:4d} | env steps {n * 4000:>9,}\n" for n in range(1, written + 1))
        return self.preamble + body, written == self.lines

    async def _version(self, _request: web.Request) -> web.Response:
        return web.json_response({"ray_version": "2.60.0"})

    async def _info(self, request: web.Request) -> web.Response:
        if request.match_info["job"] != self.job_id:
            return web.Response(status=404, text=f"Job {request.match_info['job']} does not exist")
        _, ended = self.log()
        return web.json_response({
            "type": "SUBMISSION", "submission_id": self.job_id, "entrypoint": "uerl train",
            "status": "SUCCEEDED" if ended else "RUNNING",
        })  # fmt: skip

    async def _logs(self, _request: web.Request) -> web.Response:
        text, _ = self.log()
        self.served["logs"] += len(text)
        return web.json_response({"logs": text})

    async def _tail(self, request: web.Request) -> web.StreamResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        sent = 0
        while True:  # as Ray's: new lines as they come, closed once the job has ended
            text, ended = self.log()
            if len(text) > sent:
                await socket.send_str(text[sent:])
                self.served["tail"] += len(text) - sent
                sent = len(text)
            if ended:
                await socket.close()
                return socket
            await asyncio.sleep(self.line_every_s / 2)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/api/version", self._version)
        app.router.add_get("/api/jobs/{job}", self._info)
        app.router.add_get("/api/jobs/{job}/logs", self._logs)
        app.router.add_get("/api/jobs/{job}/logs/tail", self._tail)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> FakeDashboard:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
