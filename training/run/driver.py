"""The `uerl train` code path: preflight, discovery, algorithm, training loop, artefacts.

`uerl local` calls exactly this against the endpoints of what it started.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infra.endpoints import Endpoints
from training.policies.game_spec import GameSpec
from training.policies.self_play import League, SelfPlaySettings
from training.rescale.endpoints_watch import EndpointsWatch
from training.rescale.rescaler import Rescaler
from training.rllib.ray_output import RayConsole
from training.run import checkpoints, metrics
from training.run.connect import connect
from training.run.iteration_sinks import Iteration, IterationSink, MetricsSink, TensorBoardSink
from training.run.league import LeagueDriver
from training.run.options import TrainOptions, run_env_runner, run_policies
from training.run.runner_health import RunnerHealthBoard
from training.run.stop import StopRequest
from training.runstore import events
from training.telemetry.ray_metrics import DriverMetrics

CSV_NAME = "metrics.csv"
PNG_NAME = "learning_curve.png"
EVENTS_NAME = "game_events.jsonl"
# Everything Ray and RLlib print (driver and actors), off the console unless --verbose.
RAY_LOG_NAME = Path("logs") / "ray.log"
# How long the driver waits for env runners' health reports after an iteration; a
# runner that does not answer in time (busy, dead) counts as unknown that iteration.
HEALTH_QUERY_TIMEOUT_S = 2.0
# With no game left after a rescale, how often the paused driver looks for one.
PAUSED_POLL_S = 1.0

Log = Callable[[str], None]


def print_line(line: str) -> None:
    """Print and flush: under `ray job submit` stdout is a file, and `ray job logs`
    shows only what was flushed, so unflushed progress lines would come at the end. An
    event line (training.runstore.events) is for readers of a log, not a terminal."""
    text = events.for_stream(line + "\n", sys.stdout)
    if text:
        print(text, end="", flush=True)


@dataclass
class TrainResult:
    rows: list[metrics.IterationRow] = field(default_factory=list)
    checkpoint: Path | None = None
    interrupted: bool = False
    csv_path: Path | None = None
    png_path: Path | None = None
    wall_s: float = 0.0
    # Why the run gave up (it then ends non-zero after its final checkpoint).
    failure: str | None = None

    @property
    def env_steps_total(self) -> int:
        return self.rows[-1].env_steps_total if self.rows else 0

    @property
    def best_return(self) -> float:
        finite = [r.episode_return_mean for r in self.rows if not math.isnan(r.episode_return_mean)]
        return max(finite, default=math.nan)


def _done(options: TrainOptions, rows: list[metrics.IterationRow]) -> bool:
    if not rows:
        return False
    last = rows[-1]
    if options.iterations is not None and last.iteration >= options.iterations:
        return True
    if options.timesteps is not None and last.env_steps_total >= options.timesteps:
        return True
    return options.stop_return is not None and last.episode_return_mean >= options.stop_return


def run_training(
    endpoints: Endpoints,
    options: TrainOptions,
    *,
    stop: StopRequest | None = None,
    log: Log = print_line,
    store: Callable[[], float | None] | None = None,
    fence: Callable[[], None] | None = None,
) -> TrainResult:
    """Train against `endpoints`; Ray is connected here and disconnected on return.
    Ray's and RLlib's own output goes to `<run_dir>/logs/ray.log` (and, with
    `options.verbose`, to the console as Ray prints it). `store` is called after each
    iteration's artefacts are written, and after the last ones; `fence` before each
    write of the run (the run's lease: LeaseLost once another writer holds it)."""
    store = store or _in_place
    fence = fence or _unfenced
    try:
        with RayConsole(options.run_dir / RAY_LOG_NAME, verbose=options.verbose) as console:
            return _run_training(
                endpoints, options, console, stop=stop, log=log, store=store, fence=fence
            )
    finally:
        store()


def _in_place() -> float | None:
    """No run store: the run directory is where the run is kept, whole at once."""
    return time.time()


def _unfenced() -> None:
    """No run store: no other writer to fence off."""


def _run_training(
    endpoints: Endpoints,
    options: TrainOptions,
    console: RayConsole,
    *,
    stop: StopRequest | None,
    log: Log,
    store: Callable[[], float | None],
    fence: Callable[[], None],
) -> TrainResult:
    import ray

    from training.preflight.discovery import discover_game
    from training.rllib.algorithm import build_algo_config

    console.quiet_driver_loggers()  # RLlib's logger exists once it is imported
    stop = stop or StopRequest()
    started = time.monotonic()
    try:
        report = connect(
            endpoints,
            console,
            timeout_s=options.preflight_timeout_s,
            ray_address=options.ray_address,
            nodes_wait_s=options.nodes_wait_s,
        )
        stop.reinstall()
        log(report.summary())
        game = discover_game(endpoints).with_policies(run_policies(options))
        log(
            f"game: {game.num_envs} env(s) per instance, agents {sorted(game.agents)}, "
            f"policies {game.policy_ids()} ({game.policies})"
        )
        config = build_algo_config(
            endpoints,
            game,
            algo=options.algo,
            hparams=options.hparams,
            seed=options.seed,
            request_timeout_s=options.request_timeout_s,
            fault_wait_s=options.fault_wait_s,
            give_up_after_s=options.game_down_limit_s,
            sample_timeout_s=options.sample_timeout_s,
            self_play=_league_settings(options),
            env_runner=run_env_runner(options),
            run_name=options.run_dir.name,
        )
        log(
            f"building {options.algo}: {endpoints.num_env_runners} env runner(s) "
            f"x 1 {endpoints.custom_resource}, {endpoints.num_learners} learner(s) "
            f"x ({endpoints.resources.cpus_per_learner:g} CPU, "
            f"{endpoints.resources.gpus_per_learner:g} GPU)"
        )
        with console.filtered_stderr():
            algo = _build_algo(config, endpoints.num_env_runners)
        console.quiet_driver_loggers()  # Ray loggers first created by the build
        board = RunnerHealthBoard(
            endpoints.num_env_runners, give_up_after_s=options.game_down_limit_s
        )
        published = _driver_metrics(endpoints, options)
        from training.rllib.algorithm import policy_names

        try:
            result = _loop(
                algo, options, stop, log, board, game,
                _rescaler(algo, endpoints, game, options, log), store,
                [MetricsSink(published, policy_names(algo.config))], fence,
            )  # fmt: skip
        finally:
            published.close()
            algo.stop()
            # RLlib's objects hold actor handles and in-flight object refs, some in
            # reference cycles: free them while Ray is connected, never in its teardown
            # (a driver once died of SIGSEGV in the moments after `ray.shutdown()`).
            del algo
            gc.collect()
        # Everything the run leaves is written before Ray is let go: teardown comes last.
        fence()
        result.csv_path, result.png_path = _write_artefacts(options, result.rows)
    finally:
        ray.shutdown()
    result.wall_s = time.monotonic() - started
    return result


def _rescaler(
    algo: Any, endpoints: Endpoints, game: GameSpec, options: TrainOptions, log: Log
) -> Rescaler:
    """Follows `options.endpoints_file` (rewritten on a rescale) when there is one."""
    return Rescaler(
        algo,
        endpoints,
        game,
        watch=(
            EndpointsWatch(options.endpoints_file, endpoints)
            if options.endpoints_file is not None
            else None
        ),
        admission_timeout_s=options.preflight_timeout_s,
        log=log,
        events_path=options.run_dir / EVENTS_NAME,
    )


def _league_settings(options: TrainOptions) -> SelfPlaySettings:
    """A resumed league keeps its settings (its snapshot modules are the checkpoint's)."""
    if options.resume is not None:
        league = checkpoints.read_league(
            checkpoints.resolve(options.resume, options.checkpoint_dir)
        )
        if league is not None:
            return league.settings
    return options.self_play


class EnvRunnersDidNotStart(RuntimeError):
    """Every remote env runner died before it ran; RLlib itself fails obscurely then."""


def _no_env_runner_started(exc: BaseException) -> bool:
    """RLlib's failure when every remote env runner died before it ran: it logs the
    actors' deaths, then fails inferring spaces from no runner at all."""
    frames = [frame.f_code.co_name for frame, _ in traceback.walk_tb(exc.__traceback__)]
    return isinstance(exc, IndexError) and "get_spaces" in frames


def _build_algo(config: Any, num_env_runners: int) -> Any:
    try:
        return config.build_algo()
    except Exception as exc:
        if _no_env_runner_started(exc):
            raise EnvRunnersDidNotStart(
                f"none of the {num_env_runners} env runner(s) started: Ray cancelled or "
                "killed their actors (see the errors above). Check that this driver's "
                "RAY_AUTH_MODE matches the cluster's and that the worker nodes are alive."
            ) from exc
        raise


def _check_runners(
    algo: Any,
    board: RunnerHealthBoard,
    stop: StopRequest,
    log: Log,
    events_path: Path,
    rescaler: Rescaler | None = None,
) -> None:
    """Print what happened to the games since the last iteration; give up if all are gone.
    Every event also goes to `events_path` (JSON lines, wall-clock times)."""
    reports = algo.env_runner_group.foreach_env_runner(
        "game_health",
        local_env_runner=False,
        # Also runners RLlib took out of service: alive ones still know their game.
        healthy_only=False,
        timeout_seconds=HEALTH_QUERY_TIMEOUT_S,
    )
    for line in board.update(reports):
        log(line)
    if rescaler is not None:
        rescaler.note_reports(reports)
    events = [
        {"runner_index": r["runner_index"], "endpoint": r["endpoint"], **e}
        for r in reports
        for e in r["events"]
    ]
    if events:
        events_path.parent.mkdir(parents=True, exist_ok=True)
        with events_path.open("a") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in events)
    reason = board.give_up_reason()
    if reason is not None:
        stop.fail(reason)


def _loop(
    algo: Any,
    options: TrainOptions,
    stop: StopRequest,
    log: Log,
    board: RunnerHealthBoard,
    game: GameSpec | None = None,
    rescaler: Rescaler | None = None,
    store: Callable[[], float | None] = _in_place,
    sinks: Sequence[IterationSink] = (),
    fence: Callable[[], None] = _unfenced,
) -> TrainResult:
    """Train until done or stopped: each iteration's row logged, fenced and written to
    `metrics.csv` and TensorBoard, then told to `sinks`; checkpoints as options say."""
    result = TrainResult()
    rows, previous = _resume(algo, options, log)
    last_saved = rows[-1].iteration if rows else -1
    result.rows = rows
    league = _start_league(algo, options, game, log, rows)
    stop.begin_graceful()
    from training.rllib.algorithm import policy_names

    tensorboard = TensorBoardSink(
        options.run_dir,
        policy_names(algo.config),
        resumed_at=previous if options.resume is not None else None,
    )
    every = [tensorboard, *sinks]
    pause = _Pause(options.game_down_limit_s, log)
    try:
        while not _done(options, rows) and not stop.requested:
            if rescaler is not None and not _follow_rescale(rescaler, board, pause, stop):
                continue
            row, train_result = _iterate(
                algo, options, stop, log, board, rescaler, league, previous
            )
            previous = row.env_steps_total
            rows.append(row)
            log(metrics.progress_line(row))
            log(_iteration_event(row))
            fence()  # the run still this writer's: nothing is written otherwise
            # Each iteration's row is stored as it is made: a lost head keeps them all.
            metrics.write_csv(options.run_dir / CSV_NAME, rows)
            done = Iteration(
                row,
                train_result,
                board.fresh_reports(),
                rescales=rescaler.rescales if rescaler is not None else 0,
            )
            for sink in every:
                sink.iteration(done)
            if row.iteration % options.checkpoint_every == 0:
                timings: dict[str, float] = {}
                result.checkpoint = _save(algo, options, row, game, league, timings, fence)
                last_saved = row.iteration
                for line in _saved_lines(result.checkpoint, timings):
                    log(line)
                for sink in every:
                    sink.checkpoint_written()
            stored_through = store()
            if stored_through is not None:
                for sink in every:
                    sink.stored_through(stored_through)
        result.interrupted = stop.requested and stop.failure is None
        result.failure = stop.failure
        newest = result.checkpoint
        result.checkpoint = _final_checkpoint(
            algo, options, rows, last_saved, result.checkpoint, game, league, fence
        )
        if result.checkpoint != newest:
            for sink in every:
                sink.checkpoint_written()
    finally:
        stop.graceful = False
        for sink in every:
            sink.close()
    if result.checkpoint is not None:
        log(f"checkpoint: {result.checkpoint}")
    return result


def _driver_metrics(endpoints: Endpoints, options: TrainOptions) -> DriverMetrics:
    from training.runstore import attempts

    started = attempts.from_environment()  # a supervisor's attempt; else the first
    return DriverMetrics(
        stack=endpoints.cluster_name,
        run=options.run_dir.name,
        attempt=started[0] if started is not None else 1,
    )


def _resume(algo: Any, options: TrainOptions, log: Log) -> tuple[list[metrics.IterationRow], int]:
    """With --resume: restore the checkpoint into `algo`; the run's earlier rows and its
    env steps so far. Without: no rows, no steps."""
    if options.resume is None:
        return [], 0
    path = checkpoints.resolve(options.resume, options.checkpoint_dir)
    meta = checkpoints.read_meta(path)
    if meta.algo != options.algo:
        raise checkpoints.CheckpointError(
            f"--resume {path}: checkpoint is {meta.algo}, this run is --algo {options.algo}"
        )
    algo.restore_from_path(str(path.resolve()))
    # Keep the earlier rows of the same run so the CSV and curve are continuous.
    rows = [
        r for r in metrics.read_csv(options.run_dir / CSV_NAME) if r.iteration <= meta.iteration
    ]
    log(f"resumed from {path}: iteration {meta.iteration}, {meta.env_steps_total:,} env steps")
    return rows, meta.env_steps_total


def _start_league(
    algo: Any,
    options: TrainOptions,
    game: GameSpec | None,
    log: Log,
    rows: list[metrics.IterationRow],
) -> LeagueDriver | None:
    """Self-play: the league (the resumed checkpoint's, or a new one), started after the
    last iteration so far. None for the other policy configurations."""
    if game is None or game.policies != "self_play":
        return None
    resumed = (
        checkpoints.read_league(checkpoints.resolve(options.resume, options.checkpoint_dir))
        if options.resume is not None
        else None
    )
    league = LeagueDriver(algo, resumed or League(options.self_play), log)
    league.start(rows[-1].iteration if rows else 0)
    return league


def _follow_rescale(
    rescaler: Rescaler, board: RunnerHealthBoard, pause: _Pause, stop: StopRequest
) -> bool:
    """Follow a rescale between iterations; False when no env runner is left to sample
    with (the run waits for a game, see _Pause)."""
    rescaler.between_iterations()
    board.follow(rescaler.worker_indices())
    if rescaler.runners == 0:
        pause.wait(stop)
        return False
    pause.over()
    return True


def _iterate(
    algo: Any,
    options: TrainOptions,
    stop: StopRequest,
    log: Log,
    board: RunnerHealthBoard,
    rescaler: Rescaler | None,
    league: LeagueDriver | None,
    previous: int,
) -> tuple[metrics.IterationRow, dict[str, Any]]:
    """One training iteration: its row (with the runners' health and, in self-play, the
    ratings) and RLlib's result."""
    train_result = algo.train()
    row = metrics.row_from_result(train_result, previous_steps=previous)
    _check_runners(algo, board, stop, log, options.run_dir / EVENTS_NAME, rescaler)
    row = replace(
        row,
        runners_healthy=board.healthy,
        runners_total=board.total,
        runners_unknown=board.unknown,
    )
    if league is not None:
        row = replace(row, elo=league.after_iteration(row.iteration, train_result))
    return row, train_result


def _final_checkpoint(
    algo: Any,
    options: TrainOptions,
    rows: list[metrics.IterationRow],
    last_saved: int,
    checkpoint: Path | None,
    game: GameSpec | None,
    league: LeagueDriver | None,
    fence: Callable[[], None] = _unfenced,
) -> Path | None:
    """After the loop: save the last iteration unless it is saved already; a resumed run
    that had no iteration left to train reports the newest checkpoint."""
    if rows and rows[-1].iteration != last_saved:
        return _save(algo, options, rows[-1], game, league, fence=fence)
    if rows and checkpoint is None:
        return checkpoints.resolve(checkpoints.LATEST, options.checkpoint_dir)
    return checkpoint


class _Pause:
    """No game left after a rescale: no sampling (no runner to sample with) until one
    joins, for at most the game-down limit."""

    def __init__(self, limit_s: float, log: Log) -> None:
        self.limit_s = limit_s
        self.log = log
        self.since: float | None = None

    def wait(self, stop: StopRequest) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self.log(
                "rescale: no game left (0 env runners): sampling paused until a game "
                f"joins; the run stops after {self.limit_s:g} s without one (--game-down-limit)"
            )
        elif now - self.since >= self.limit_s:
            stop.fail(
                f"no game joined within {self.limit_s:g} s of the rescale to 0 games "
                "(--game-down-limit)"
            )
            return
        time.sleep(PAUSED_POLL_S)

    def over(self) -> None:
        if self.since is not None:
            self.log(f"rescale: sampling again after {time.monotonic() - self.since:.1f} s paused")
            self.since = None


def _saved_lines(path: Path, timings: dict[str, float]) -> tuple[str, str]:
    """`checkpoint_000004 written: 3.1 MiB in 0.42 s (RLlib's state 0.40 s, storing
    0.02 s)`, what a checkpoint costs and how much of it is the run storage's, and its
    `checkpoint_written` event."""
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    total, state = timings["total_s"], timings["state_s"]
    return (
        f"{path.name} written: {size / 2**20:.1f} MiB in {total:.2f} s "
        f"(RLlib's state {state:.2f} s, storing {total - state:.2f} s)",
        events.checkpoint_written(
            path.name, mib=size / 2**20, seconds=total, storing_s=total - state
        ),
    )


def _iteration_event(row: metrics.IterationRow) -> str:
    """The `iteration` event of `row`: the progress line's figures, for a log's readers."""
    return events.line(
        events.ITERATION,
        iteration=row.iteration,
        env_steps=row.env_steps_total,
        steps_per_s=round(row.env_steps_per_s, 3),
        return_mean=round(row.episode_return_mean, 4),
        time_s=round(row.time_s, 3),
        runners=[row.runners_healthy, row.runners_total] if row.runners_total else None,
        unknown=row.runners_unknown,
    )


def _save(
    algo: Any,
    options: TrainOptions,
    row: metrics.IterationRow,
    game: GameSpec | None,
    league: LeagueDriver | None = None,
    timings: dict[str, float] | None = None,
    fence: Callable[[], None] = _unfenced,
) -> Path:
    from training.rllib.algorithm import path_of

    meta = checkpoints.CheckpointMeta(
        row.iteration,
        row.env_steps_total,
        options.algo,
        normalize_actions=bool(algo.config.normalize_actions),
        clip_actions=bool(algo.config.clip_actions),
        env_runner=path_of(algo.config),
    )
    return checkpoints.save(
        algo,
        options.checkpoint_dir,
        meta,
        game=game,
        league=league.league if league else None,
        timings=timings,
        fence=fence,
    )


def _write_artefacts(
    options: TrainOptions, rows: list[metrics.IterationRow]
) -> tuple[Path | None, Path | None]:
    if not rows:
        return None, None
    csv_path = options.run_dir / CSV_NAME
    png_path = options.run_dir / PNG_NAME
    metrics.write_csv(csv_path, rows)
    metrics.plot_learning_curve(png_path, rows, title=f"uerl {options.algo}")
    return csv_path, png_path
