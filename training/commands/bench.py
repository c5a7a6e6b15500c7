"""`uerl bench`: env-steps/s stepping a mock game over gRPC vs the same envs in-process.

The mock game runs in its own process (as a UE game would), on loopback. Three
figures for the same N environments and the same pre-drawn random actions:
  in-process  gymnasium sync vector env, no networking at all;
  GymClient   batched codec straight on the protocol messages;
  UEVectorEnv the RLlib vector env (per-environment agent dicts), what training uses.

Wall-clock rates depend on whatever else runs on the machine, so each figure also
comes with the CPU time one step of all N environments costs the client process
and the mock game process (user + system, all threads), which varies far less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class BenchResult:
    env: str
    num_envs: int
    in_process_steps_per_s: float
    client_steps_per_s: float
    vector_env_steps_per_s: float
    # CPU microseconds per step of all `num_envs` environments (None: not measurable here).
    in_process_cpu_us: float | None = None
    client_cpu_us: float | None = None
    client_server_cpu_us: float | None = None
    vector_env_cpu_us: float | None = None
    vector_env_server_cpu_us: float | None = None

    @property
    def client_ratio(self) -> float:
        return self.client_steps_per_s / self.in_process_steps_per_s

    @property
    def vector_env_ratio(self) -> float:
        return self.vector_env_steps_per_s / self.in_process_steps_per_s


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uerl bench",
        description="Benchmark gRPC stepping of a mock UE game against in-process stepping.",
    )
    parser.add_argument("--envs", type=int, default=16, help="environments (default 16)")
    parser.add_argument("--env", default="CartPole-v1", help="single-agent gymnasium id")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="time per measurement (default 5)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternating slices per measurement (default 5)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def _actions(space: Any, num_envs: int, count: int, seed: int = 0) -> list[np.ndarray]:
    space.seed(seed)
    return [np.stack([space.sample() for _ in range(num_envs)]) for _ in range(count)]


def process_cpu_s(pid: int | None = None) -> float | None:
    """User + system CPU seconds of a process (all threads); this one if pid is None."""
    if pid is None:
        return time.process_time()
    try:  # Linux; fields 14 and 15 after the parenthesised command name
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class _Tally:
    """Accumulated over all timed slices of one stepper."""

    rates: list[float] = field(default_factory=list)
    calls: int = 0
    cpu_s: float = 0.0
    server_cpu_s: float | None = 0.0

    def cpu_us(self, seconds: float | None) -> float | None:
        return None if seconds is None or not self.calls else seconds / self.calls * 1e6


def _timed(
    step: Callable[[int], Any],
    count: int,
    seconds: float,
    num_envs: int,
    tally: _Tally | None = None,
    server_pid: int | None = None,
) -> float:
    """Call step(k) for k = 0, 1, ... (mod count) for `seconds`; return env-steps per second.
    With a tally, add the calls and the CPU time of this process (and of the server) to it."""
    calls = 0
    cpu0, server0 = process_cpu_s(), process_cpu_s(server_pid) if server_pid else None
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for k in range(count):
            step(k)
        calls += count
        now = time.perf_counter()
        if now >= deadline:
            break
    if tally is not None:
        tally.calls += calls
        tally.cpu_s += time.process_time() - cpu0
        server1 = process_cpu_s(server_pid) if server_pid else None
        if server0 is None or server1 is None or tally.server_cpu_s is None:
            tally.server_cpu_s = None
        else:
            tally.server_cpu_s += server1 - server0
    return calls * num_envs / (now - start)


@contextmanager
def in_process_stepper(
    env_id: str, num_envs: int, actions: list[np.ndarray]
) -> Iterator[Callable[[int], Any]]:
    import gymnasium as gym

    vec = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    vec.reset(seed=0)
    try:
        yield lambda k: vec.step(actions[k])
    finally:
        vec.close()


@contextmanager
def client_stepper(
    endpoint: str, num_envs: int, actions: list[np.ndarray]
) -> Iterator[Callable[[int], Any]]:
    from training.protocol import spaces as codec
    from training.protocol._generated import schola_gym_pb2 as pb
    from training.protocol.client import GymClient
    from training.protocol.game_spec import game_spec_from_definition

    with GymClient(endpoint, startup_timeout_s=30) as client:
        client.connect(pb.NEXT_STEP)
        game = game_spec_from_definition(client.training_definition(), endpoint)
        ((aid, spec),) = game.agents.items()
        client.reset(dict.fromkeys(range(num_envs)))

        def step(k: int) -> None:
            update = pb.StateUpdate()
            envs = update.step.environments
            points = [envs.add().updates[aid] for _ in range(num_envs)]
            codec.batch_to_points(spec.action_space, actions[k], points)
            states = client.step(update).training_state.environment_states
            agents = [s.agent_states[aid] for s in states]
            codec.points_to_batch(spec.observation_space, [a.observations for a in agents])
            np.fromiter((a.reward for a in agents), np.float32, count=num_envs)

        yield step


@contextmanager
def vector_env_stepper(
    endpoint: str, num_envs: int, actions: list[np.ndarray]
) -> Iterator[Callable[[int], Any]]:
    from training.rllib.vector_env import UEVectorEnv

    env = UEVectorEnv(endpoint, startup_timeout_s=30)
    try:
        (aid,) = env.possible_agents
        env.reset(seed=0)
        # RLlib hands the env one {agent: action} dict per environment.
        per_env = [[{aid: a} for a in batch] for batch in actions]
        yield lambda k: env.step(per_env[k])
    finally:
        env.close()


def start_mock(env_id: str, num_envs: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.cli",
            "mock-ue",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--envs",
            str(num_envs),
            "--env",
            env_id,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"mock-ue did not start: {line!r}")
    address = line.split("listening on ", 1)[1].split()[0]
    return proc, address


def run(
    env_id: str = "CartPole-v1", num_envs: int = 16, seconds: float = 5.0, rounds: int = 5
) -> BenchResult:
    """Alternate short slices of the three measurements so that all see the same machine
    load (other processes share the CPUs); report the median slice of each, and the CPU
    time per step over all slices."""
    import gymnasium as gym

    probe = gym.make(env_id)
    actions = _actions(probe.action_space, num_envs, 256)
    probe.close()
    tallies = {"in_process": _Tally(), "client": _Tally(), "vector_env": _Tally()}
    procs = []
    try:
        with ExitStack() as stack:
            for _ in range(2):  # one mock game per client: a game serves one session
                procs.append(start_mock(env_id, num_envs))
            steppers = {
                "in_process": stack.enter_context(in_process_stepper(env_id, num_envs, actions)),
                "client": stack.enter_context(client_stepper(procs[0][1], num_envs, actions)),
                "vector_env": stack.enter_context(
                    vector_env_stepper(procs[1][1], num_envs, actions)
                ),
            }
            server_pids = {"in_process": None, "client": procs[0][0].pid}
            server_pids["vector_env"] = procs[1][0].pid
            for step in steppers.values():  # warm-up
                _timed(step, 50, 0.0, num_envs)
            for _ in range(rounds):
                for name, step in steppers.items():
                    tally = tallies[name]
                    rate = _timed(
                        step, len(actions), seconds / rounds, num_envs, tally, server_pids[name]
                    )
                    tally.rates.append(rate)
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(timeout=10)
    med = {name: statistics.median(t.rates) for name, t in tallies.items()}
    local, client, vector = tallies["in_process"], tallies["client"], tallies["vector_env"]
    return BenchResult(
        env_id,
        num_envs,
        med["in_process"],
        med["client"],
        med["vector_env"],
        in_process_cpu_us=local.cpu_us(local.cpu_s),
        client_cpu_us=client.cpu_us(client.cpu_s),
        client_server_cpu_us=client.cpu_us(client.server_cpu_s),
        vector_env_cpu_us=vector.cpu_us(vector.cpu_s),
        vector_env_server_cpu_us=vector.cpu_us(vector.server_cpu_s),
    )


def _cpu(client_us: float | None, server_us: float | None = None) -> str:
    def us(value: float | None) -> str:
        return "   n/a" if value is None else f"{value:6.0f}"

    text = f"  CPU/step: client {us(client_us)} us"
    if server_us is not None:
        text += f" + mock-ue {us(server_us)} us"
    return text


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from training.protocol.grpc_tuning import apply_low_latency_defaults

    apply_low_latency_defaults()  # as the mock server and the env runners do
    result = run(args.env, args.envs, args.seconds, args.rounds)
    if args.json:
        data = asdict(result) | {
            "client_ratio": result.client_ratio,
            "vector_env_ratio": result.vector_env_ratio,
        }
        print(json.dumps(data, indent=2))
        return 0
    label = f"{result.env} x{result.num_envs}"
    # One line per path; CPU/step = CPU time per step of all N environments.
    print(
        f"in-process  gymnasium sync vector env  {label}: "
        f"{result.in_process_steps_per_s:>9,.0f} env-steps/s                    "
        + _cpu(result.in_process_cpu_us)
    )
    print(
        f"gRPC        GymClient -> mock-ue       {label}: "
        f"{result.client_steps_per_s:>9,.0f} env-steps/s  "
        f"({result.client_ratio:.2f}x in-process)"
        + _cpu(result.client_cpu_us, result.client_server_cpu_us)
    )
    print(
        f"gRPC        UEVectorEnv -> mock-ue     {label}: "
        f"{result.vector_env_steps_per_s:>9,.0f} env-steps/s  "
        f"({result.vector_env_ratio:.2f}x in-process)"
        + _cpu(result.vector_env_cpu_us, result.vector_env_server_cpu_us)
    )
    return 0
