"""`uerl bench`: env-steps/s stepping a mock game over gRPC vs the same envs in-process.

The mock game runs in its own process (as a UE game would), on loopback. Three
figures for the same N environments and the same pre-drawn random actions:
  in-process  gymnasium sync vector env, no networking at all;
  GymClient   batched codec straight on the protocol messages;
  UEVectorEnv the RLlib vector env (per-environment agent dicts), what training uses.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class BenchResult:
    env: str
    num_envs: int
    in_process_steps_per_s: float
    client_steps_per_s: float
    vector_env_steps_per_s: float

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


def _timed(step: Callable[[int], Any], count: int, seconds: float, num_envs: int) -> float:
    """Call step(k) for k = 0, 1, ... (mod count) for `seconds`; return env-steps per second."""
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for k in range(count):
            step(k)
        calls += count
        now = time.perf_counter()
        if now >= deadline:
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
    from training.discovery import game_spec_from_definition
    from training.protocol import spaces as codec
    from training.protocol._generated import schola_gym_pb2 as pb
    from training.protocol.client import GymClient

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
    from training.ue_env import UEVectorEnv

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
    load (other processes share the CPUs); report the median slice of each."""
    import gymnasium as gym

    probe = gym.make(env_id)
    actions = _actions(probe.action_space, num_envs, 256)
    probe.close()
    rates: dict[str, list[float]] = {"in_process": [], "client": [], "vector_env": []}
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
            for step in steppers.values():  # warm-up
                _timed(step, 50, 0.0, num_envs)
            for _ in range(rounds):
                for name, step in steppers.items():
                    rates[name].append(_timed(step, len(actions), seconds / rounds, num_envs))
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(timeout=10)
    med = {name: statistics.median(values) for name, values in rates.items()}
    return BenchResult(env_id, num_envs, med["in_process"], med["client"], med["vector_env"])


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
    print(
        f"in-process  gymnasium sync vector env  {label}: "
        f"{result.in_process_steps_per_s:>9,.0f} env-steps/s"
    )
    print(
        f"gRPC        GymClient -> mock-ue       {label}: "
        f"{result.client_steps_per_s:>9,.0f} env-steps/s  "
        f"({result.client_ratio:.2f}x in-process)"
    )
    print(
        f"gRPC        UEVectorEnv -> mock-ue     {label}: "
        f"{result.vector_env_steps_per_s:>9,.0f} env-steps/s  "
        f"({result.vector_env_ratio:.2f}x in-process)"
    )
    return 0
