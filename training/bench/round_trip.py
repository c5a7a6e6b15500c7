"""The benches' floor for an environment in another process: a gymnasium vector env whose
every step first waits for a blocking socket round trip to a process that works as long
as a game's step costs. RLlib's own runner on it shows what any out-of-process
environment costs, whatever its client."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

import gymnasium as gym

# The other process: answer each byte after `work` seconds of CPU, until EOF.
WORKER = """
import socket, sys, time
sock = socket.socket(fileno=int(sys.argv[1]))
work = float(sys.argv[2])
while sock.recv(1):
    start = time.perf_counter()
    while time.perf_counter() - start < work:
        pass
    sock.send(b"x")
"""


class RoundTrip(gym.vector.VectorWrapper):
    """`env`, each step behind one round trip to a worker process working `work_s`."""

    def __init__(self, env: gym.vector.VectorEnv, work_s: float) -> None:
        super().__init__(env)
        ours, theirs = socket.socketpair()
        self._sock = ours
        self._worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(theirs.fileno()), repr(work_s)],
            pass_fds=[theirs.fileno()],
        )
        theirs.close()

    def step(self, actions: Any) -> Any:
        self._sock.send(b"x")
        self._sock.recv(1)
        return self.env.step(actions)

    def close(self, **kwargs: Any) -> None:
        self._sock.close()  # the worker sees EOF and exits
        try:
            self._worker.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._worker.kill()
            self._worker.wait()
        super().close(**kwargs)


def round_trip_env(config: dict[str, Any]) -> gym.vector.VectorEnv:
    """RLlib env creator (vector entry point): `config["env_id"]` x `config["num_envs"]`,
    each step behind a round trip to a process working `config["work_s"]`."""
    env = gym.make_vec(config["env_id"], num_envs=int(config.get("num_envs", 1)))
    return RoundTrip(env, float(config["work_s"]))
