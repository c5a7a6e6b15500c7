"""`uerl bench`'s end-to-end part: PPO stepping the environments in-process vs in games.

One PPO config (uerl's `build_ppo_config`: same runners, environments per runner and
hyperparameters), four places for the environments:
  rllib        what a user compares with: RLlib's own single-agent PPO on the gymnasium
               environment (`SingleAgentEnvRunner`), the baseline of every ratio;
  multi_agent  the scenario as a one-agent MultiAgentEnv in RLlib's MultiAgentEnvRunner;
  rllib_trip   the baseline with each env step behind a blocking round trip to a process
               that works as long as a mock game's step costs (`round_trip`): the floor
               for any environment in another process, whatever its client;
  python       mock games (one per env runner) reached with the gRPC Python client;
  native       the same, with the compiled client (one-agent games sample on RLlib's
               single-agent runner, as `uerl local` does);
  native_multi_agent
               the same on RLlib's multi-agent runner (`--env-runner multi_agent`, the
               path of games with more agents, and of every game before uerl had both).
All train on one local cluster of raylets, as `uerl local` runs them (head without CPUs,
worker nodes advertising `ue_worker`), one iteration each per round, so all see the same
machine load. Per path: env steps per second of whole iterations (what a user sees in
the progress line, learner included), of sampling (what the client changes: PPO's
`synchronous_parallel_sample`, timed per iteration), and the env runners' resident memory.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from training.bench.measure import game_cpu_s, single_agent_config

if TYPE_CHECKING:
    from training.local.ray_cluster import NodeSpec
    from training.policies.game_spec import GameSpec

AGENT = "agent_0"  # what the mock game calls its one agent


class InProcessGame(MultiAgentEnv):
    """The mock game's single-agent scenario, in-process, under the agent id the game uses."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.env = gym.make((config or {}).get("env_id", "CartPole-v1"))
        self.possible_agents = [AGENT]
        self.agents = [AGENT]
        self.observation_spaces = {AGENT: self.env.observation_space}
        self.action_spaces = {AGENT: self.env.action_space}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return {AGENT: obs}, {AGENT: info}

    def step(self, action_dict: dict[str, Any]):
        obs, reward, term, trunc, info = self.env.step(action_dict[AGENT])
        return (
            {AGENT: obs},
            {AGENT: reward},
            {AGENT: term, "__all__": term},
            {AGENT: trunc, "__all__": trunc},
            {AGENT: info},
        )


@dataclass
class E2EFigures:
    path: str
    envs_per_game: int
    sample_rates: list[float] = field(default_factory=list)
    iteration_rates: list[float] = field(default_factory=list)
    runner_rss_mb: float | None = None

    @property
    def sample_steps_per_s(self) -> float:
        return statistics.median(self.sample_rates)

    @property
    def iteration_steps_per_s(self) -> float:
        return statistics.median(self.iteration_rates)


def _runner_rss_mb(algo: Any) -> float | None:
    def rss(_runner: Any) -> int:
        import psutil

        return psutil.Process().memory_info().rss

    sizes = algo.env_runner_group.foreach_env_runner(rss, local_env_runner=False)
    return statistics.mean(sizes) / 2**20 if sizes else None


def _games(
    env_id: str, envs: int, count: int, server: str
) -> tuple[list[subprocess.Popen[str]], int]:
    """`count` mock games on consecutive ports base+1..base+count (`per_worker` offsets)."""
    from training.local.games import start_mock_at
    from training.local.processes import free_port

    for _attempt in range(20):
        base = free_port()
        procs: list[subprocess.Popen[str]] = []
        try:
            for k in range(1, count + 1):
                procs.append(start_mock_at(env_id, envs, base + k, server))
            return procs, base
        except RuntimeError:
            _stop(procs)
    raise RuntimeError("no run of free consecutive ports for the mock games")


class SamplingClock:
    """Wall time of each iteration's sampling, exactly what RLlib's sampling timer times.

    That timer (`result["timers"]["env_runner_sampling_timer"]`) is an exponential
    moving average with coefficient 0.01: after a few iterations it still reads the
    first (warm-up) one. So the bench times the same call itself, by wrapping the
    function PPO samples with for as long as it runs.
    """

    def __init__(self) -> None:
        self.last_s = 0.0

    def __enter__(self) -> SamplingClock:
        from ray.rllib.algorithms.ppo import ppo

        self._module = ppo
        self._sample = sample = ppo.synchronous_parallel_sample

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return sample(*args, **kwargs)
            finally:
                self.last_s = time.perf_counter() - start

        ppo.synchronous_parallel_sample = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self._module.synchronous_parallel_sample = self._sample


BASELINE = "rllib"
MULTI_AGENT_RUNNER = "native_multi_agent"
# `--metrics-cost`: uerl's first path again, publishing as it does (A/A: how far two
# identical paths differ here), then with its env runners publishing no metrics (A/B).
METRICS_ON_AGAIN = "metrics_on_again"
METRICS_OFF = "metrics_off"
ROUND_TRIP = "rllib_trip"
ROUND_TRIP_ENV = "uerl-bench-round-trip"
# Where the env runners reach the games.
GAME_HOST = "127.0.0.1"


def game_cpu_per_step(endpoint: str, pid: int, steps: int = 500) -> float:
    """CPU seconds a mock game spends per vector step (random actions, one session)."""
    from training.rllib.single_agent import UESingleAgentVectorEnv
    from training.rllib.vector_env import UEVectorEnv

    env = UESingleAgentVectorEnv(UEVectorEnv(endpoint))
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        actions = [env.action_space.sample() for _ in range(steps)]
        before = game_cpu_s(pid)
        for action in actions:
            env.step(action)
        return (game_cpu_s(pid) - before) / steps
    finally:
        env.close()


def run(
    env_id: str,
    envs_per_game: int,
    iterations: int,
    clients: list[str],
    runners: int = 2,
    train_batch_size: int = 4000,
    metrics_cost: bool = False,
) -> list[E2EFigures]:
    import ray
    from ray.tune.registry import register_env

    from training.bench.round_trip import round_trip_env
    from training.clients import native
    from training.local.ray_cluster import NODE_IP, LocalRayCluster

    server = "native" if native.available() else "grpcio"
    uerl = _uerl_paths(clients, metrics_cost)
    paths = [BASELINE, "multi_agent", ROUND_TRIP, *uerl]
    figures = {p: E2EFigures(p, envs_per_game) for p in paths}
    procs: list[subprocess.Popen[str]] = []
    try:
        with ExitStack() as stack:
            cluster = stack.enter_context(LocalRayCluster(_nodes(len(paths), runners)))
            bases = _start_games(uerl, env_id, envs_per_game, runners, server, procs)
            first = next(iter(uerl))
            game = _probe_game(f"{GAME_HOST}:{bases[first] + 1}")
            # The round trip's worker works as long as a game's step costs (games of the
            # first uerl path: their procs come first).
            work_s = game_cpu_per_step(f"{GAME_HOST}:{bases[first] + 1}", procs[0].pid)
            ray.init(address=cluster.address, _node_ip_address=NODE_IP, log_to_driver=False)
            stack.callback(ray.shutdown)
            register_env(ROUND_TRIP_ENV, round_trip_env)  # in the cluster: runners find it
            algos = {}
            for path in paths:
                client, env_runner = uerl.get(path, (None, "multi_agent"))
                config = _uerl_config(
                    game,
                    client,
                    env_runner,
                    port=bases.get(path, bases[first]),
                    runners=runners,
                    train_batch_size=train_batch_size,
                    metrics=path != METRICS_OFF,
                )
                algos[path] = _config_for_path(config, path, env_id, work_s).build_algo()
                stack.callback(algos[path].stop)
            sampling = stack.enter_context(SamplingClock())
            _measure(algos, figures, iterations, sampling)
    finally:
        _stop(procs)
    return list(figures.values())


def _uerl_paths(clients: list[str], metrics_cost: bool = False) -> dict[str, tuple[str, str]]:
    """uerl's paths: which client each uses, on which env runner."""
    uerl = {client: (client, "auto") for client in clients}
    if "native" in clients:
        uerl[MULTI_AGENT_RUNNER] = ("native", "multi_agent")
    if metrics_cost:
        # The first client's path twice more, side by side with it: publishing (the A/A
        # control: two identical paths differed by 10 % in sampling, more than the 2 %
        # to be told apart), and not.
        uerl[METRICS_ON_AGAIN] = (clients[0], "auto")
        uerl[METRICS_OFF] = (clients[0], "auto")
    return uerl


def _nodes(num_paths: int, runners: int) -> list[NodeSpec]:
    """A head without CPUs and `runners` worker nodes, each with room for one env runner
    of every path (as `uerl local` runs them: `ue_worker` on the workers only)."""
    from training.local.ray_cluster import NodeSpec

    return [NodeSpec("head", "head", 0)] + [
        NodeSpec(f"worker{i}", "worker", num_paths, 0, {"ue_worker": float(num_paths)})
        for i in range(1, runners + 1)
    ]


def _start_games(
    uerl: dict[str, tuple[str, str]],
    env_id: str,
    envs_per_game: int,
    runners: int,
    server: str,
    procs: list[subprocess.Popen[str]],
) -> dict[str, int]:
    """Per uerl path the base port of its games; their processes are added to `procs` as
    they start, so that the caller stops them whatever fails next."""
    bases = {}
    for path in uerl:  # each path gets games of its own: a game serves one session
        games, bases[path] = _games(env_id, envs_per_game, runners, server)
        procs += games
    return bases


def _probe_game(endpoint: str) -> GameSpec:
    from training.clients.game_client import GymClient
    from training.policies.game_spec import game_spec_from_definition

    with GymClient(endpoint) as probe:
        probe.connect()
        return game_spec_from_definition(probe.training_definition(), "bench")


def _uerl_config(
    game: GameSpec,
    client: str | None,
    env_runner: str,
    *,
    port: int,
    runners: int,
    train_batch_size: int,
    metrics: bool = True,
) -> Any:
    """uerl's PPO config on the games at `port` (+1, +2, ... per env runner)."""
    from training.rllib.algorithm import build_ppo_config
    from training.rllib.env_runner import UEConnection

    connection = UEConnection(
        url_template=GAME_HOST,
        port=port,
        port_offset_mode="per_worker",
        client=client,
        metrics=metrics,
    )
    return build_ppo_config(
        game,
        connection,
        num_env_runners=runners,
        custom_resource="ue_worker",
        seed=0,
        env_runner=env_runner,
        train_batch_size=train_batch_size,
        minibatch_size=min(128, train_batch_size),
    )


def _config_for_path(config: Any, path: str, env_id: str, work_s: float) -> Any:
    """uerl's config, moved to where `path` steps the environments (uerl's paths keep it)."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    if path == BASELINE:
        config = single_agent_config(config, env_id)
    elif path == ROUND_TRIP:
        config = single_agent_config(config, env_id)
        config.env_runners(gym_env_vectorize_mode="vector_entry_point")
        config.environment(env=ROUND_TRIP_ENV)
        config.env_config = {"env_id": env_id, "work_s": work_s}
    elif path == "multi_agent":
        config = config.environment(env=InProcessGame, env_config={"env_id": env_id}).env_runners(
            env_runner_cls=MultiAgentEnvRunner
        )
    return config


def _measure(
    algos: dict[str, Any],
    figures: dict[str, E2EFigures],
    iterations: int,
    sampling: SamplingClock,
) -> None:
    """One iteration of each path per round, so that all see the same machine load."""
    for algo in algos.values():
        algo.train()  # warm-up: first iterations build connectors and compile
    for _ in range(iterations):
        for path, algo in algos.items():
            start = time.perf_counter()
            result = algo.train()
            elapsed = time.perf_counter() - start
            steps = result["env_runners"]["num_env_steps_sampled"]
            figures[path].sample_rates.append(steps / sampling.last_s)
            figures[path].iteration_rates.append(steps / elapsed)
    for path, algo in algos.items():
        figures[path].runner_rss_mb = _runner_rss_mb(algo)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)
