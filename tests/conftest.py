"""Shared fixtures. Protocol/mock-UE fixtures first; others may append theirs below."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Each test starts from the same environment variables.

    An in-process `ray.init` may set e.g. RAY_AUTH_MODE in os.environ; later
    subprocesses (`uerl local`) would inherit it.
    """
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def mock_ue() -> Iterator[Callable[..., Any]]:
    """Factory: `mock_ue(env_id="CartPole-v1", num_envs=1, **kw)` -> started MockUEServer
    on a free loopback port; every server is stopped at teardown."""
    from training.mock_ue import MockUEServer

    servers: list[MockUEServer] = []

    def start(env_id: str = "CartPole-v1", num_envs: int = 1, **kwargs: Any) -> MockUEServer:
        server = MockUEServer("127.0.0.1", kwargs.pop("port", 0), env_id, num_envs, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(grace=0)


@pytest.fixture
def mock_ue_row(mock_ue: Callable[..., Any]) -> Callable[..., list[Any]]:
    """Factory: `mock_ue_row(count, env_id, num_envs)` -> servers on consecutive ports
    (base+1 .. base+count), as `per_worker` port offsets address them."""

    def start(count: int, env_id: str = "CartPole-v1", num_envs: int = 1) -> list[Any]:
        for _attempt in range(50):
            first = mock_ue(env_id, num_envs)
            row = [first]
            try:
                for k in range(1, count):
                    row.append(mock_ue(env_id, num_envs, port=first.port + k))
            except OSError:
                for server in row:
                    server.stop(grace=0)
                continue
            return row
        raise RuntimeError("no run of consecutive free ports found")

    return start


@pytest.fixture
def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
