"""A stand-in for the Kubernetes API, enough for `uerl submit`: a namespace's pod list, and
a pod's port-forward as the API server and kubelet serve it to the official client (a
websocket, `v4.channel.k8s.io`: per port a data and an error channel, each opened with a
frame naming the port). The "pod's port" is a TCP port on 127.0.0.1; plain HTTP, aiohttp
(which `ray[default]` brings), in a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web


@dataclass
class FakeKubeAPI:
    pods: list[dict[str, Any]]  # what the pod list answers, as the API's JSON
    pod_ports: dict[str, int]  # pod name -> the local TCP port its port-forward reaches
    asked: list[str] = field(default_factory=list)  # request paths, in order
    url: str = ""
    # Secret name -> its `data` (values base64), as the API serves them; a name missing
    # is a 404. `secrets_status`: answer every Secret read with this status instead (403:
    # the caller may not read secrets).
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets_status: int = 200
    # Called (on a thread) while a port-forward's websocket is being opened, before the
    # API answers it: another call of the client's process made at that moment.
    on_portforward: Callable[[], None] | None = None

    async def _read_secret(self, request: web.Request) -> web.Response:
        self.asked.append(str(request.rel_url))
        name = request.match_info["name"]
        status = self.secrets_status if self.secrets_status != 200 else None
        if status is None and name not in self.secrets:
            status = 404
        if status is not None:
            message = f'secrets "{name}" is forbidden' if status == 403 else f'"{name}" not found'
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                 "message": message, "code": status},
                status=status,
            )  # fmt: skip
        return web.json_response(
            {"kind": "Secret", "apiVersion": "v1",
             "metadata": {"name": name, "namespace": request.match_info["ns"]},
             "data": self.secrets[name]}
        )  # fmt: skip

    async def _list_pods(self, request: web.Request) -> web.Response:
        self.asked.append(str(request.rel_url))
        return web.json_response(
            {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self.pods}
        )

    async def _portforward(self, request: web.Request) -> web.WebSocketResponse:
        self.asked.append(str(request.rel_url))
        port = int(request.query["ports"])
        if self.on_portforward is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.on_portforward)
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        opening = bytes([port & 0xFF, port >> 8])
        await ws.send_bytes(b"\x00" + opening)  # the data channel
        await ws.send_bytes(b"\x01" + opening)  # the error channel
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", self.pod_ports[request.match_info["name"]]
            )
        except OSError as exc:  # as the kubelet says it: on the error channel, then closes
            await ws.send_bytes(b"\x01" + f"error forwarding port {port}: {exc}".encode())
            await ws.close()
            return ws

        async def from_pod() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(b"\x00" + data)
            await ws.close()

        answering = asyncio.create_task(from_pod())
        async for message in ws:
            if message.type == WSMsgType.BINARY and message.data[:1] == b"\x00":
                writer.write(message.data[1:])
                await writer.drain()
        writer.close()
        answering.cancel()
        return ws


@contextlib.contextmanager
def serving(api: FakeKubeAPI) -> Iterator[FakeKubeAPI]:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods", api._list_pods)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/portforward", api._portforward)
    app.router.add_get("/api/v1/namespaces/{ns}/secrets/{name}", api._read_secret)
    runner = web.AppRunner(app)
    listener = socket.create_server(("127.0.0.1", 0))
    api.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    loop = asyncio.new_event_loop()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.SockSite(runner, listener).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()
