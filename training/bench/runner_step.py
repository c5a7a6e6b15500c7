"""`uerl bench-runner`: one env runner's time per step, in-process, against the floor for
an environment in another process.

No Ray and no learner: each runner is built in this process and samples on its own, so
what differs is only where the environment is. Paths, all PPO from uerl's config:
  rllib           RLlib's single-agent runner on the gymnasium environment in-process;
  rllib+trip      the same, each env step behind a blocking socket round trip to a
                  process that works as long as a mock game's step costs (measured here):
                  the floor for any environment in another process;
  uerl            uerl's single-agent runner on a mock game (compiled client and server);
  uerl_multi      uerl's multi-agent runner on a mock game (`--env-runner multi_agent`).
Each path samples `--steps` env steps per round, `--rounds` rounds interleaved; the
median time per vector step is printed, and each path against `rllib`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from training import exit_status
from training.bench.measure import game_cpu_s, single_agent_config
from training.bench.round_trip import RoundTrip
from training.commands.arg_types import positive_int

LABELS = {
    "rllib": "RLlib single-agent runner, env in-process",
    "rllib+trip": "RLlib single-agent runner, env behind a round trip",
    "uerl": "uerl single-agent runner, mock game",
    "uerl_multi": "uerl multi-agent runner, mock game",
}


@dataclass
class RunnerFigures:
    path: str
    seconds_per_step: list[float] = field(default_factory=list)

    @property
    def us_per_step(self) -> float:
        return statistics.median(self.seconds_per_step) * 1e6


def run(env_id: str, envs: int, steps: int, rounds: int) -> tuple[list[RunnerFigures], float]:
    """Per path its seconds per vector step; and the mock game's CPU seconds per step."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from training.clients import native
    from training.clients.game_client import GymClient
    from training.local.games import start_mock_at
    from training.local.processes import free_port
    from training.policies.game_spec import game_spec_from_definition
    from training.rllib.algorithm import build_ppo_config
    from training.rllib.env_runner import UEConnection

    server = "native" if native.available() else "grpcio"
    with ExitStack() as stack:
        base = free_port()
        games = [start_mock_at(env_id, envs, base + k, server) for k in (1, 2)]
        for game_proc in games:
            stack.callback(game_proc.wait, 10)
            stack.callback(game_proc.terminate)
        with GymClient(f"127.0.0.1:{base + 1}") as probe:
            probe.connect()
            game = game_spec_from_definition(probe.training_definition(), "bench")
        runners: dict[str, Any] = {}
        for path, slot, env_runner in (("uerl", 1, "auto"), ("uerl_multi", 2, "multi_agent")):
            connection = UEConnection(
                url_template="127.0.0.1", port=base + slot - 1, port_offset_mode="per_worker"
            )
            config = build_ppo_config(
                game, connection, num_env_runners=1, seed=0, env_runner=env_runner
            )
            runners[path] = config.env_runner_cls(config=config, worker_index=1)
        baseline = single_agent_config(
            build_ppo_config(game, connection, num_env_runners=1, seed=0), env_id
        )
        for path in ("rllib", "rllib+trip"):
            runners[path] = SingleAgentEnvRunner(config=baseline, worker_index=1)
        for runner in runners.values():
            stack.callback(runner.stop)
            runner.sample(num_timesteps=steps // 4)  # warm-up: connectors, first episodes
        # The game's CPU per step, from the uerl path's sampling; the round trip's worker
        # then works as long.
        before = game_cpu_s(games[0].pid)
        runners["uerl"].sample(num_timesteps=steps)
        game_cpu = (game_cpu_s(games[0].pid) - before) / (steps / envs)
        runners["rllib+trip"].env = RoundTrip(runners["rllib+trip"].env, game_cpu)
        figures = {path: RunnerFigures(path) for path in LABELS}
        for _ in range(rounds):
            for path in LABELS:
                start = time.perf_counter()
                runners[path].sample(num_timesteps=steps)
                elapsed = time.perf_counter() - start
                figures[path].seconds_per_step.append(elapsed / (steps / envs))
                runners[path].get_metrics()  # as an iteration would: keeps its stats small
    return list(figures.values()), game_cpu


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uerl bench-runner",
        description="One env runner's time per step: in-process, behind a bare round trip, "
        "and on mock games (no Ray, no learner).",
    )
    parser.add_argument("--env", default="CartPole-v1", help="single-agent gymnasium id")
    parser.add_argument("--envs", type=positive_int, default=1, help="environments (default 1)")
    parser.add_argument(
        "--steps", type=positive_int, default=2000, help="env steps per round (default 2000)"
    )
    parser.add_argument("--rounds", type=positive_int, default=5, help="rounds (default 5)")
    return parser


def single_agent_env(env_id: str) -> str:
    """`env_id` if it is a one-agent gymnasium environment (the `rllib` paths step it
    in-process with RLlib's single-agent runner); ValueError naming it otherwise."""
    from training.mock_ue.scenarios import scenario_for

    scenario = scenario_for(env_id)  # ValueError for an unknown id, naming the known ones
    if len(scenario.slots) != 1 or scenario.joint is not None:
        agents = [slot.agent_id for slot in scenario.slots]
        raise ValueError(
            f"--env {env_id}: a game of {len(agents)} agents ({', '.join(agents)}); the bench "
            "compares RLlib's single-agent runner, so it takes a one-agent gymnasium id "
            "(e.g. CartPole-v1)"
        )
    return env_id


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        single_agent_env(args.env)  # before any game or runner starts
    except ValueError as exc:
        print(f"uerl bench-runner: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    figures, game_cpu = run(args.env, args.envs, args.steps, args.rounds)
    base = next(f for f in figures if f.path == "rllib").us_per_step
    width = max(len(label) for label in LABELS.values())
    print(f"mock game: {game_cpu * 1e6:.0f} us of CPU per step of {args.envs} environment(s)")
    for f in figures:
        ratio = "" if f.path == "rllib" else f"  ({f.us_per_step / base:.2f}x the time)"
        label = f"{LABELS[f.path]:<{width}} x{args.envs}"
        print(f"runner  {label}: {f.us_per_step:7.0f} us/step{ratio}")
    return exit_status.OK
