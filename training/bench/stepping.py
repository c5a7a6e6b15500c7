"""`uerl bench`: env-steps/s stepping a mock game over gRPC vs the same envs in-process.

The mock game runs in its own process (as a UE game would), on loopback, served by
uerl's compiled server so that what differs between the gRPC paths is the client.
Figures for the same N environments and the same pre-drawn random actions:
  in-process            gymnasium sync vector env, no networking at all;
  UEVectorEnv python    the RLlib vector env on gRPC Python and the Python codec;
  UEVectorEnv native    the same env on the compiled client (`native/`), when built.
The UEVectorEnv paths are what training uses: each step returns RLlib's
per-environment agent dicts.

Wall-clock rates depend on whatever else runs on the machine, so each figure also
comes with the CPU time one step of all N environments costs the client process
and the mock game process (user + system, all threads), which varies far less.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from training.bench.measure import process_cpu_s
from training.commands.arg_types import non_negative_int, positive_float, positive_int
from training.local.games import start_mock_at


@dataclass
class PathFigures:
    name: str
    steps_per_s: float
    # CPU microseconds per step of all `num_envs` environments (None: not measurable here).
    cpu_us: float | None = None
    server_cpu_us: float | None = None


@dataclass
class BenchResult:
    env: str
    num_envs: int
    paths: dict[str, PathFigures]

    def ratio(self, name: str) -> float:
        return self.paths[name].steps_per_s / self.paths["in_process"].steps_per_s


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uerl bench",
        description="Benchmark gRPC stepping of a mock UE game against in-process stepping.",
    )
    parser.add_argument("--envs", type=positive_int, default=16, help="environments (default 16)")
    parser.add_argument("--env", default="CartPole-v1", help="single-agent gymnasium id")
    parser.add_argument(
        "--seconds", type=positive_float, default=5.0, help="time per measurement (default 5)"
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=5,
        help="alternating slices per measurement (default 5)",
    )
    parser.add_argument(
        "--e2e-envs",
        type=positive_int,
        nargs="*",
        default=[1, 16],
        help="end to end: environments per game, one PPO comparison each (default 1 16)",
    )
    parser.add_argument(
        "--e2e-iterations",
        type=non_negative_int,
        default=5,
        help="end to end: timed PPO iterations per path (default 5; 0 skips end to end)",
    )
    parser.add_argument(
        "--e2e-batch-size",
        type=positive_int,
        default=4000,
        help="end to end: env steps per PPO iteration (default 4000, PPO's)",
    )
    parser.add_argument(
        "--metrics-cost",
        action="store_true",
        help="end to end: also uerl's first path twice more, publishing again (how far "
        "two identical paths differ) and with its env runners publishing no metrics "
        "(what publishing costs)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def _actions(space: Any, num_envs: int, count: int, seed: int = 0) -> list[np.ndarray]:
    space.seed(seed)
    return [np.stack([space.sample() for _ in range(num_envs)]) for _ in range(count)]


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
def vector_env_stepper(
    endpoint: str, num_envs: int, actions: list[np.ndarray], client: str
) -> Iterator[Callable[[int], Any]]:
    from training.rllib.vector_env import UEVectorEnv

    env = UEVectorEnv(endpoint, startup_timeout_s=30, client=client)
    try:
        (aid,) = env.possible_agents
        env.reset(seed=0)
        # RLlib hands the env one {agent: action} dict per environment.
        per_env = [[{aid: a} for a in batch] for batch in actions]
        yield lambda k: env.step(per_env[k])
    finally:
        env.close()


def start_mock(
    env_id: str, num_envs: int, transport: str = "native"
) -> tuple[subprocess.Popen[str], str]:
    proc = start_mock_at(env_id, num_envs, 0, transport)
    assert proc.stdout is not None
    return proc, proc.address  # type: ignore[attr-defined]


def client_paths() -> list[str]:
    """The clients to measure: gRPC Python always, the compiled one when it is built."""
    from training.clients import native

    return ["python", "native"] if native.available() else ["python"]


def run(
    env_id: str = "CartPole-v1", num_envs: int = 16, seconds: float = 5.0, rounds: int = 5
) -> BenchResult:
    """Alternate short slices of the measurements so that all see the same machine load
    (other processes share the CPUs); report the median slice of each, and the CPU time
    per step over all slices."""
    import gymnasium as gym

    from training.clients import native

    probe = gym.make(env_id)
    actions = _actions(probe.action_space, num_envs, 256)
    probe.close()
    clients = client_paths()
    server = "native" if native.available() else "grpcio"
    names = ["in_process", *clients]
    tallies = {name: _Tally() for name in names}
    procs = []
    try:
        with ExitStack() as stack:
            steppers = {
                "in_process": stack.enter_context(in_process_stepper(env_id, num_envs, actions))
            }
            server_pids: dict[str, int | None] = {"in_process": None}
            for client in clients:  # one mock game per client: a game serves one session
                proc, address = start_mock(env_id, num_envs, server)
                procs.append(proc)
                server_pids[client] = proc.pid
                steppers[client] = stack.enter_context(
                    vector_env_stepper(address, num_envs, actions, client)
                )
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
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
    paths = {
        name: PathFigures(
            name,
            statistics.median(t.rates),
            cpu_us=t.cpu_us(t.cpu_s),
            server_cpu_us=t.cpu_us(t.server_cpu_s) if name != "in_process" else None,
        )
        for name, t in tallies.items()
    }
    return BenchResult(env_id, num_envs, paths)


def _cpu(client_us: float | None, server_us: float | None = None) -> str:
    def us(value: float | None) -> str:
        return "   n/a" if value is None else f"{value:6.0f}"

    text = f"  CPU/step: client {us(client_us)} us"
    if server_us is not None:
        text += f" + mock-ue {us(server_us)} us"
    return text


LABELS = {
    "in_process": "in-process  gymnasium sync vector env   ",
    "python": "gRPC        UEVectorEnv python client   ",
    "native": "gRPC        UEVectorEnv native client   ",
}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from training.clients.grpc_tuning import apply_low_latency_defaults

    apply_low_latency_defaults()  # as the mock server and the env runners do
    result = run(args.env, args.envs, args.seconds, args.rounds)
    e2e = []
    if args.e2e_iterations > 0:
        from training.bench import end_to_end

        for envs in args.e2e_envs:
            e2e += end_to_end.run(
                args.env,
                envs,
                args.e2e_iterations,
                client_paths(),
                train_batch_size=args.e2e_batch_size,
                metrics_cost=args.metrics_cost,
            )
    if args.json:
        data = {
            "env": result.env,
            "num_envs": result.num_envs,
            "paths": {
                name: asdict(p) | {"ratio": result.ratio(name)} for name, p in result.paths.items()
            },
            "end_to_end": [asdict(f) for f in e2e],
        }
        print(json.dumps(data, indent=2))
        return 0
    label = f"{result.env} x{result.num_envs}"
    # One line per path; CPU/step = CPU time per step of all N environments.
    for name, path in result.paths.items():
        ratio = " " * 20 if name == "in_process" else f"  ({result.ratio(name):.2f}x in-process)"
        print(
            f"{LABELS[name]}{label}: {path.steps_per_s:>9,.0f} env-steps/s{ratio}"
            + _cpu(path.cpu_us, path.server_cpu_us)
        )
    _print_e2e(e2e)
    return 0


def _print_e2e(figures: list[Any]) -> None:
    """PPO per path: whole-iteration env-steps/s (what the progress line shows) and
    sampling env-steps/s, each as a fraction of RLlib's single-agent PPO in-process."""
    from training.bench.end_to_end import BASELINE

    baseline = {f.envs_per_game: f for f in figures if f.path == BASELINE}

    def ratio(path: str, value: float, base_value: float) -> str:
        return "" if path == BASELINE else f"({value / base_value:.2f}x)"

    width = max((len(E2E_LABELS[f.path]) for f in figures), default=0)
    for f in figures:
        base = baseline[f.envs_per_game]
        rss = "n/a" if f.runner_rss_mb is None else f"{f.runner_rss_mb:,.0f} MiB"
        print(
            f"PPO         {E2E_LABELS[f.path]:<{width}} x{f.envs_per_game:<2} per game: iterations "
            f"{f.iteration_steps_per_s:>7,.0f} env-steps/s "
            f"{ratio(f.path, f.iteration_steps_per_s, base.iteration_steps_per_s):8}  sampling "
            f"{f.sample_steps_per_s:>7,.0f} env-steps/s "
            f"{ratio(f.path, f.sample_steps_per_s, base.sample_steps_per_s):8}  "
            f"env runner RSS {rss}"
        )


E2E_LABELS = {
    "rllib": "RLlib single-agent",
    "multi_agent": "RLlib multi-agent",
    "rllib_trip": "RLlib single-agent, env behind a round trip",
    "python": "uerl python client",
    "native": "uerl native client",
    "native_multi_agent": "uerl native client, multi-agent runner",
    "metrics_on_again": "uerl, first client again (A/A)",
    "metrics_off": "uerl, first client, metrics off",
}
