"""The game-port forwarder (`infra/forwarder.py`) on an event loop in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading

from infra import forwarder


def start_forwarder(
    upstream_port: int, tls: ssl.SSLContext | None = None
) -> tuple[int, asyncio.AbstractEventLoop, asyncio.Task]:
    """(bound port, loop, task) of a forwarder on 127.0.0.1; cancel the task to stop it."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    bound: list[int] = []

    def on_ready(port: int) -> None:
        bound.append(port)
        ready.set()

    task_box: list[asyncio.Task] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        task = loop.create_task(
            forwarder.serve(0, "127.0.0.1", upstream_port, on_ready, "127.0.0.1", tls=tls)
        )
        task_box.append(task)
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        # Connections still being relayed end with the forwarder, as in the pod.
        pending = asyncio.all_tasks(loop)
        for relay in pending:
            relay.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10), "forwarder did not start"
    return bound[0], loop, task_box[0]


def stop_forwarder(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
    loop.call_soon_threadsafe(task.cancel)
