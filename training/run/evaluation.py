"""`uerl eval`: play a checkpoint's policies against the games, without training.

Evaluation is a run of its own, never env runners inside a training run. RLlib
numbers evaluation env runners 1..N like training ones, and `{worker_index}`
routing would send evaluation runner i to training game i, which already has a
client (a game serves one at a time). So:

- `UEEnvRunner` refuses to be an RLlib evaluation runner (`config.in_evaluation`);
- every env runner, training or evaluation, holds one unit of the custom
  resource for its life and there is one unit per game, so an evaluation run's
  preflight finds none free while a training run holds the games, and stops
  saying so (and the reverse). No two runs' runners can share a game.

The evaluation run builds the same env runners as training (same routing, one per
game), no learners, loads the checkpoint's modules on the driver, pushes their
weights to the runners and samples whole episodes (deterministic actions unless
`explore`).
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infra.endpoints import Endpoints
from training.policies.self_play import League, Outcomes
from training.rllib.ray_output import RayConsole
from training.run import checkpoints
from training.run.connect import connect
from training.run.opponents import (
    OPPONENT,
    Opponent,
    learner_outcomes,
    resolve_opponent,
    with_opponent,
)

if TYPE_CHECKING:
    from training.policies.game_spec import GameSpec

Log = Callable[[str], None]
REPORT_NAME = "eval.json"
# Each sampling round waits at most this long for the runners (RLlib's sample timeout).
ROUND_TIMEOUT_S = 300.0


class EvalError(RuntimeError):
    """Evaluation cannot run or finish; the message says which checkpoint/game/runner."""


class EvalOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: Path
    episodes: int = Field(default=10, ge=1)
    # Sample from the action distribution instead of its deterministic action.
    explore: bool = False
    report_path: Path
    preflight_timeout_s: float = Field(default=30.0, gt=0)
    request_timeout_s: float = Field(default=5.0, gt=0)
    fault_wait_s: float = Field(default=2.0, gt=0)
    # Stop (exit 1) when this many episodes have not finished in this long.
    timeout_s: float = Field(default=600.0, gt=0)
    ray_address: str | None = None
    seed: int | None = None
    # Ray's and RLlib's own output on the console too, as Ray prints it (--verbose).
    verbose: bool = False
    # Self-play checkpoints: whom the learner plays (random, snapshot:N, a checkpoint),
    # sampling its actions as in the league unless opponent_deterministic.
    opponent: str | None = None
    opponent_deterministic: bool = False

    @property
    def ray_log(self) -> Path:
        """Where Ray's and RLlib's output goes: beside the report (eval.json: eval-ray.log)."""
        return self.report_path.with_name(f"{self.report_path.stem}-ray.log")


class PolicyStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episodes: int
    return_mean: float
    return_std: float
    return_min: float
    return_max: float
    episode_len_mean: float


class EvalReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str
    iteration: int
    env_steps_trained: int
    explore: bool
    episodes: int
    env_runners: int
    games: list[str]
    wall_s: float
    policies: dict[str, PolicyStats]
    # With --opponent: whom the learner played, and its results.
    opponent: str | None = None
    learner_results: dict[str, float] | None = None

    def table(self) -> str:
        head = (
            f"eval of {self.checkpoint} (iteration {self.iteration}, "
            f"{self.env_steps_trained:,} env steps trained): {self.episodes} episode(s), "
            f"{'sampled' if self.explore else 'deterministic'} actions, "
            f"{self.env_runners} env runner(s), {self.wall_s:.1f}s"
        )
        lines = [
            head,
            f"  {'policy':<12} {'episodes':>8} {'return mean':>12} {'std':>9} "
            f"{'min':>9} {'max':>9} {'len mean':>9}",
        ]
        for pid, s in sorted(self.policies.items()):
            lines.append(
                f"  {pid:<12} {s.episodes:>8} {s.return_mean:>12.2f} {s.return_std:>9.2f} "
                f"{s.return_min:>9.2f} {s.return_max:>9.2f} {s.episode_len_mean:>9.1f}"
            )
        if self.opponent is not None and self.learner_results is not None:
            r = self.learner_results
            lines.append(
                f"  learner vs {self.opponent}: {r['wins']:.0f} won, {r['draws']:.0f} drawn, "
                f"{r['losses']:.0f} lost (win rate {r['win_rate']:.2f})"
            )
        return "\n".join(lines)


def policy_stats(samples: list[tuple[float, int]]) -> PolicyStats:
    """Stats over (return, length) of one policy, one pair per episode."""
    returns = np.array([r for r, _ in samples], dtype=np.float64)
    lengths = np.array([n for _, n in samples], dtype=np.float64)
    return PolicyStats(
        episodes=len(samples),
        return_mean=float(returns.mean()),
        return_std=float(returns.std()),
        return_min=float(returns.min()),
        return_max=float(returns.max()),
        episode_len_mean=float(lengths.mean()),
    )


def sample_summaries(runner: Any, *, num_episodes: int, explore: bool) -> dict[str, Any]:
    """Runs on an env runner: finished episodes, summarised (episodes stay on the runner)."""
    episodes = runner.sample(num_episodes=num_episodes, explore=explore)
    return {
        "runner_index": runner.worker_index,
        "endpoint": runner.game_health_state().endpoint,
        "episodes": [runner.episode_summary(e) for e in episodes if e.is_done],
    }


def weights_fingerprint(state: dict[str, Any]) -> dict[str, str]:
    """Per policy, a SHA-256 of its weights (each array's name, dtype, shape and bytes,
    in name order): equal on the driver and a runner exactly when the weights are."""
    out = {}
    for pid, module_state in state.items():
        digest = hashlib.sha256()
        for name in sorted(module_state):
            value = module_state[name]
            array = value.detach().cpu().numpy() if hasattr(value, "detach") else value
            if not isinstance(array, np.ndarray):
                continue
            array = np.ascontiguousarray(array)
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            digest.update(array.tobytes())
        out[pid] = digest.hexdigest()
    return out


def check_fingerprints(want: dict[str, str], got: list[dict[str, str]]) -> None:
    """Each runner's fingerprints (runner 1 first) against the checkpoint's."""
    for index, fingerprint in enumerate(got, start=1):
        for pid, value in want.items():
            if fingerprint.get(pid) != value:
                raise EvalError(
                    f"env runner {index}: policy {pid!r} did not take the checkpoint's weights "
                    f"(fingerprint {fingerprint.get(pid, 'missing')[:16]} != {value[:16]})"
                )


def set_module_state(runner: Any, *, state: dict[str, Any]) -> dict[str, str]:
    """Runs on an env runner: load the checkpoint's weights into its modules; returns
    the fingerprint of what the runner now holds."""
    runner.set_policy_states(state)
    return weights_fingerprint(runner.policy_states())


def check_policies(game_policies: list[str], checkpoint_policies: list[str], path: Path) -> None:
    if sorted(game_policies) != sorted(checkpoint_policies):
        raise EvalError(
            f"checkpoint {path} has policies {sorted(checkpoint_policies)}, the game "
            f"defines {sorted(game_policies)}: it was trained for another game"
        )


def collect(
    rounds: Callable[[int], list[dict[str, Any]]],
    *,
    episodes: int,
    num_runners: int,
    timeout_s: float,
    log: Log,
) -> tuple[list[dict[str, tuple[float, int]]], set[str]]:
    """Call `rounds(episodes per runner)` until `episodes` episodes finished."""
    done: list[dict[str, tuple[float, int]]] = []
    games: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(done) < episodes:
        if time.monotonic() > deadline:
            raise EvalError(
                f"only {len(done)} of {episodes} episode(s) finished within {timeout_s:g}s "
                f"(games: {sorted(games) or 'none answered'})"
            )
        per_runner = max(1, math.ceil((episodes - len(done)) / num_runners))
        for reply in rounds(per_runner):
            games.add(reply["endpoint"])
            done += reply["episodes"]
        log(f"eval: {min(len(done), episodes)}/{episodes} episode(s)")
    return done[:episodes], games


def run_eval(endpoints: Endpoints, options: EvalOptions, *, log: Log | None = None) -> EvalReport:
    """Evaluate against `endpoints`; Ray is connected here and disconnected on return.
    Ray's and RLlib's own output goes to `options.ray_log` (and, with
    `options.verbose`, to the console as Ray prints it)."""
    with RayConsole(options.ray_log, verbose=options.verbose) as console:
        return _run_eval(endpoints, options, console, log=log)


def _run_eval(
    endpoints: Endpoints, options: EvalOptions, console: RayConsole, *, log: Log | None
) -> EvalReport:
    import ray

    from training.run.driver import print_line

    console.quiet_driver_loggers()  # RLlib's logger exists once it is imported
    log = log or print_line
    started = time.monotonic()
    path = checkpoints.resolve_checkpoint(options.checkpoint)
    meta = checkpoints.read_meta(path)
    modules = checkpoints.load_modules(path)
    # No learners: nothing is trained. Everything else (runners, routing) as in training.
    endpoints = endpoints.model_copy(update={"num_learners": 0})
    try:
        _preflight(endpoints, options, console, log)
        game, league = _game_and_league(endpoints, path, modules)
        opponent = (
            resolve_opponent(options.opponent, league, path)
            if options.opponent is not None
            else None
        )
        config = _eval_config(endpoints, game, meta, league, opponent, options)
        summaries, games = _play(
            config,
            console,
            modules,
            opponent,
            num_runners=endpoints.num_env_runners,
            options=options,
            log=log,
        )
        # RLlib's reference cycles are freed while Ray is connected, and the report is
        # written before Ray is let go: its teardown comes last (see run.driver).
        gc.collect()
        result = _report(
            path,
            meta,
            options,
            summaries=summaries,
            games=games,
            num_runners=endpoints.num_env_runners,
            opponent=opponent,
            started=started,
        )
        options.report_path.parent.mkdir(parents=True, exist_ok=True)
        options.report_path.write_text(json.dumps(result.model_dump(), indent=2) + "\n")
    finally:
        ray.shutdown()
    return result


def _preflight(endpoints: Endpoints, options: EvalOptions, console: RayConsole, log: Log) -> None:
    """Connect to Ray and check the games are free (no training run holds them)."""
    report = connect(
        endpoints, console, timeout_s=options.preflight_timeout_s, ray_address=options.ray_address
    )
    log(report.summary())


def _game_and_league(
    endpoints: Endpoints, path: Path, modules: Any
) -> tuple[GameSpec, League | None]:
    """The game with the checkpoint's policies, and the checkpoint's league (self-play);
    EvalError if the checkpoint's modules are not the policies the game has."""
    from training.preflight.discovery import discover_game

    trained = checkpoints.read_game(path)
    # The policies act as they were trained: the checkpoint's configuration.
    game = discover_game(endpoints).with_policies(
        trained.policies if trained is not None else "by_type"
    )
    league = checkpoints.read_league(path)
    expected = league.settings.module_ids() if league is not None else game.policy_ids()
    check_policies(expected, list(modules.keys()), path)
    return game, league


def _eval_config(
    endpoints: Endpoints,
    game: GameSpec,
    meta: checkpoints.CheckpointMeta,
    league: League | None,
    opponent: Opponent | None,
    options: EvalOptions,
) -> Any:
    """The algorithm config of the run that trained the checkpoint (no learners), with
    the opponent, if any, in the seats the learner does not take."""
    from training.rllib.algorithm import build_algo_config

    config = build_algo_config(
        endpoints,
        game,
        algo=meta.algo,  # type: ignore[arg-type]
        seed=options.seed,
        request_timeout_s=options.request_timeout_s,
        fault_wait_s=options.fault_wait_s,
        self_play=league.settings if league is not None else None,
        # Its modules are named for the path it trained on.
        env_runner=meta.env_runner,
    )
    if opponent is not None:
        config = with_opponent(
            config,
            sorted(game.agents),
            opponent,
            sampled=not options.opponent_deterministic,
        )
    # Same action handling as the run that trained the policy.
    return config.environment(
        normalize_actions=meta.normalize_actions, clip_actions=meta.clip_actions
    ).env_runners(sample_timeout_s=ROUND_TIMEOUT_S)


def _weights(modules: Any, opponent: Opponent | None) -> dict[str, Any]:
    """The checkpoint's inference weights, and a checkpoint opponent's under OPPONENT."""
    weights = modules.get_state(inference_only=True)
    if opponent is not None and opponent.state is not None:
        weights[OPPONENT] = opponent.state
    return weights


def _play(
    config: Any,
    console: RayConsole,
    modules: Any,
    opponent: Opponent | None,
    *,
    num_runners: int,
    options: EvalOptions,
    log: Log,
) -> tuple[list[dict[str, tuple[float, int]]], set[str]]:
    """Build the env runners, give them the checkpoint's (and opponent's) weights and
    sample `options.episodes` episodes: per episode its (return, length) by policy, and
    the games that served them."""
    with console.filtered_stderr():
        algo = config.build_algo()
    console.quiet_driver_loggers()  # Ray loggers first created by the build
    try:
        group = algo.env_runner_group
        _push_weights(group, _weights(modules, opponent))

        def one_round(per_runner: int) -> list[dict[str, Any]]:
            return group.foreach_env_runner(
                partial(sample_summaries, num_episodes=per_runner, explore=options.explore),
                local_env_runner=False,
            )

        return collect(
            one_round,
            episodes=options.episodes,
            num_runners=num_runners,
            timeout_s=options.timeout_s,
            log=log,
        )
    finally:
        algo.stop()


def _report(
    path: Path,
    meta: checkpoints.CheckpointMeta,
    options: EvalOptions,
    *,
    summaries: list[dict[str, tuple[float, int]]],
    games: set[str],
    num_runners: int,
    opponent: Opponent | None,
    started: float,
) -> EvalReport:
    per_policy: dict[str, list[tuple[float, int]]] = {}
    for summary in summaries:
        for pid, pair in summary.items():
            per_policy.setdefault(pid, []).append(pair)
    return EvalReport(
        checkpoint=str(path),
        iteration=meta.iteration,
        env_steps_trained=meta.env_steps_total,
        explore=options.explore,
        episodes=len(summaries),
        env_runners=num_runners,
        games=sorted(games),
        wall_s=time.monotonic() - started,
        policies={pid: policy_stats(pairs) for pid, pairs in sorted(per_policy.items())},
        opponent=_opponent_label(opponent, options) if opponent is not None else None,
        learner_results=(
            _results(learner_outcomes(summaries, opponent.module_id))
            if opponent is not None
            else None
        ),
    )


def _opponent_label(opponent: Opponent, options: EvalOptions) -> str:
    if opponent.random:
        return opponent.label
    how = "deterministic" if options.opponent_deterministic else "sampled actions"
    return f"{opponent.label} ({how})"


def _results(outcomes: Outcomes) -> dict[str, float]:
    return {
        "wins": outcomes.wins,
        "draws": outcomes.draws,
        "losses": outcomes.losses,
        "win_rate": outcomes.wins / outcomes.games if outcomes.games else math.nan,
    }


def _set_state_from_ref(runner: Any, *, state: Any) -> dict[str, str]:
    import ray

    return set_module_state(runner, state=ray.get(state))


def _push_weights(group: Any, weights: dict[str, Any]) -> None:
    """Every runner gets the checkpoint's weights, checked by fingerprint: evaluating
    untrained modules by mistake would look like a bad policy, not like an error."""
    import ray

    want = weights_fingerprint(weights)
    ref = ray.put(weights)
    got = group.foreach_env_runner(partial(_set_state_from_ref, state=ref), local_env_runner=False)
    check_fingerprints(want, got)
