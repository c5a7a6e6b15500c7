"""uerl's own figures as Prometheus metrics, published through Ray's metrics pipeline
(`ray.util.metrics`): each Ray node's metrics agent serves them beside Ray's own, on
the node's metrics export port, so they appear wherever Ray's metrics are scraped.

Ray prefixes every name with `ray_` on the way out (`uerl_env_steps_total` is scraped
as `ray_uerl_env_steps_total`) and adds its own labels (the node, the worker, Ray's
session). Names follow Prometheus' conventions: base units (`_seconds`), `_total` for
counters. Label values are bounded: the stack's and the run's names, an env runner's
index, its game's `host:port`, a policy's id, a loss's name (the algorithm's fixed set);
all of them as many as the topology and the game have.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

# One game step, one RPC: from well under a millisecond (a game on the same host) to
# seconds (a hung game, up to the request timeout).
STEP_SECONDS_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip

Kind = Literal["counter", "gauge", "histogram"]
RUNNER_TAGS = ("stack", "run", "runner", "game")
DRIVER_TAGS = ("stack", "run")


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as published; scraped with Ray's `ray_` prefix
    kind: Kind
    tags: tuple[str, ...]
    description: str


ENV_STEPS = MetricSpec(
    "uerl_env_steps_total", "counter", RUNNER_TAGS,
    "Environment steps an env runner sampled from its game (every environment of the "
    "game counts one per step).",
)  # fmt: skip
STEP_SECONDS = MetricSpec(
    "uerl_game_step_seconds", "histogram", RUNNER_TAGS,
    "Time of one step RPC to the game: every environment of the game stepped at once.",
)  # fmt: skip
GAME_UP = MetricSpec(
    "uerl_game_up", "gauge", RUNNER_TAGS,
    "1 while the env runner's game answers, 0 while it is down.",
)  # fmt: skip
GAME_DOWN_SINCE = MetricSpec(
    "uerl_game_down_since_timestamp_seconds", "gauge", RUNNER_TAGS,
    "When the game stopped answering (Unix time), 0 while it answers.",
)  # fmt: skip
GAME_FAULTS = MetricSpec(
    "uerl_game_faults_total", "counter", RUNNER_TAGS,
    "Times the game stopped answering (died, hung past the request timeout, refused).",
)  # fmt: skip
RECONNECTS = MetricSpec(
    "uerl_game_reconnects_total", "counter", RUNNER_TAGS,
    "New sessions the env runner opened with its game after a fault.",
)  # fmt: skip
ITERATIONS = MetricSpec(
    "uerl_training_iterations_total", "counter", DRIVER_TAGS,
    "Training iterations the run has finished (counted from this attempt's start).",
)  # fmt: skip
ITERATION = MetricSpec(
    "uerl_training_iteration", "gauge", DRIVER_TAGS,
    "The run's last finished iteration (counted across resumes, as metrics.csv does).",
)  # fmt: skip
RUN_ENV_STEPS = MetricSpec(
    "uerl_training_env_steps", "gauge", DRIVER_TAGS,
    "Environment steps the run has trained on, across resumes (metrics.csv's "
    "env_steps_total).",
)  # fmt: skip
RUN_STEPS_PER_S = MetricSpec(
    "uerl_training_env_steps_per_second", "gauge", DRIVER_TAGS,
    "Environment steps per second over the last iteration (sampling and learning).",
)  # fmt: skip
LEARNER_STEPS_PER_S = MetricSpec(
    "uerl_learner_env_steps_per_second", "gauge", DRIVER_TAGS,
    "Environment steps per second the learners trained on in the last iteration.",
)  # fmt: skip
EPISODE_RETURN = MetricSpec(
    "uerl_episode_return_mean", "gauge", DRIVER_TAGS,
    "Mean return of the episodes finished in the last iterations (RLlib's window); "
    "absent until an episode has finished.",
)  # fmt: skip
EPISODE_LENGTH = MetricSpec(
    "uerl_episode_length_mean", "gauge", DRIVER_TAGS,
    "Mean length, in steps, of the episodes finished in the last iterations.",
)  # fmt: skip
RUNNERS_HEALTHY = MetricSpec(
    "uerl_env_runners_healthy", "gauge", DRIVER_TAGS,
    "Env runners whose game answered at the end of the last iteration.",
)  # fmt: skip
RUNNERS = MetricSpec(
    "uerl_env_runners", "gauge", DRIVER_TAGS,
    "Env runners the run has (follows a rescale).",
)  # fmt: skip
CHECKPOINT_TIME = MetricSpec(
    "uerl_checkpoint_last_timestamp_seconds", "gauge", DRIVER_TAGS,
    "When the run's newest checkpoint was written (Unix time); age: time() - this.",
)  # fmt: skip

STORED_THROUGH = MetricSpec(
    "uerl_run_stored_through_timestamp_seconds", "gauge", DRIVER_TAGS,
    "Up to when the run store holds what the run wrote (Unix time); the store's lag: "
    "time() - this. A claim holds it at once; a bucket, after the mirror's next round.",
)  # fmt: skip
LOSS_TAGS = (*DRIVER_TAGS, "policy", "loss")
LEARNER_LOSS = MetricSpec(
    "uerl_learner_loss", "gauge", LOSS_TAGS,
    "Each loss the learner reported for a policy in the last iteration (RLlib's names: "
    "total_loss, policy_loss, vf_loss, mean_kl_loss, ...).",
)  # fmt: skip
RESCALES = MetricSpec(
    "uerl_rescales_total", "counter", DRIVER_TAGS,
    "Times the run followed a rescale: env runners joined or left (counted from this "
    "attempt's start).",
)  # fmt: skip
ATTEMPT = MetricSpec(
    "uerl_run_attempt", "gauge", DRIVER_TAGS,
    "The run's attempt: 1, or the supervisor's count once `uerl supervise` started it "
    "again after a lost head.",
)  # fmt: skip

RUNNER_METRICS = (ENV_STEPS, STEP_SECONDS, GAME_UP, GAME_DOWN_SINCE, GAME_FAULTS, RECONNECTS)
DRIVER_METRICS = (
    ITERATIONS, ITERATION, RUN_ENV_STEPS, RUN_STEPS_PER_S, LEARNER_STEPS_PER_S,
    EPISODE_RETURN, EPISODE_LENGTH, RUNNERS_HEALTHY, RUNNERS, CHECKPOINT_TIME,
    LEARNER_LOSS, RESCALES, ATTEMPT, STORED_THROUGH,
)  # fmt: skip
ALL_METRICS = RUNNER_METRICS + DRIVER_METRICS


def _make(spec: MetricSpec, default_tags: Mapping[str, str]) -> Any:
    from ray.util import metrics

    if spec.kind == "counter":
        metric: Any = metrics.Counter(spec.name, spec.description, tag_keys=spec.tags)
    elif spec.kind == "gauge":
        metric = metrics.Gauge(spec.name, spec.description, tag_keys=spec.tags)
    else:
        metric = metrics.Histogram(
            spec.name, spec.description, list(STEP_SECONDS_BUCKETS), tag_keys=spec.tags
        )
    metric.set_default_tags(dict(default_tags))
    return metric


class RunnerMetrics:
    """One env runner's figures (made in its Ray worker process, lazily: Ray's metric
    objects need the worker connected).

    Ray's metrics agent drops a gauge not set again within two report intervals (20 s by
    default), so the game's state is set again by `refresh()`, which the runner calls on
    every sample and while it waits for its game: a game up (or down) for minutes stays
    in the scrapes."""

    def __init__(
        self, *, stack: str, run: str, runner: int, game: str, enabled: bool = True
    ) -> None:
        self.tags = {"stack": stack, "run": run, "runner": str(runner), "game": game}
        self.enabled = enabled
        self._metrics: dict[str, Any] | None = None
        self._down_since = 0.0  # 0 while the game answers

    def _get(self) -> dict[str, Any]:
        if self._metrics is None:
            self._metrics = {spec.name: _make(spec, self.tags) for spec in RUNNER_METRICS}
            self._set_state(self._metrics)
        return self._metrics

    def _set_state(self, metrics: dict[str, Any]) -> None:
        metrics[GAME_UP.name].set(0 if self._down_since else 1)
        metrics[GAME_DOWN_SINCE.name].set(self._down_since)

    def refresh(self) -> None:
        """The game's state set again, as it is (Ray forgets a gauge left unset)."""
        if self.enabled:
            self._set_state(self._get())

    def sampled(self, env_steps: int, step_seconds: Iterable[float]) -> None:
        if not self.enabled:
            return
        metrics = self._get()
        if env_steps > 0:
            metrics[ENV_STEPS.name].inc(env_steps)
        histogram = metrics[STEP_SECONDS.name]
        for seconds in step_seconds:
            histogram.observe(seconds)

    def game_down(self, since: float) -> None:
        if not self.enabled:
            return
        metrics = self._get()
        self._down_since = since or time.time()  # never 0: 0 says it answers
        self._set_state(metrics)
        metrics[GAME_FAULTS.name].inc(1)

    def game_back(self) -> None:
        if not self.enabled:
            return
        metrics = self._get()
        self._down_since = 0.0
        self._set_state(metrics)
        metrics[RECONNECTS.name].inc(1)


@dataclass(frozen=True)
class IterationFigures:
    """What the driver publishes after each iteration (metrics.csv's row, in short)."""

    iteration: int
    env_steps_total: int
    env_steps_per_s: float
    learner_steps_per_s: float
    episode_return_mean: float
    episode_len_mean: float
    runners_healthy: int
    runners_total: int


def losses(learners: Mapping[str, Any], names: Mapping[str, str]) -> dict[tuple[str, str], float]:
    """(policy, loss) -> value from an iteration's `learners` result: each module's keys
    that name a loss (a fixed set per algorithm, so the label stays bounded). `names`:
    RLlib's module id -> the game's policy id where they differ."""
    out: dict[tuple[str, str], float] = {}
    for module, stats in learners.items():
        if module.startswith("__") or not isinstance(stats, Mapping):
            continue
        for key, value in stats.items():
            if not key.endswith("loss") or isinstance(value, bool):
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                out[(names.get(module, module), key)] = number
    return out


class DriverMetrics:
    """The run's figures, from the driver (one per run).

    Ray's metrics agent drops a gauge not set again within two report intervals (20 s by
    default): an iteration or the time between checkpoints is often longer. A heartbeat
    thread sets every gauge again, as last set, every `REFRESH_S`; `close()` ends it
    (before Ray is let go)."""

    REFRESH_S = 5.0

    def __init__(self, *, stack: str, run: str, attempt: int = 1) -> None:
        self.tags = {"stack": stack, "run": run}
        self.attempt = attempt
        self._metrics: dict[str, Any] | None = None
        self._rescales = 0
        # (name, extra tags) -> (value, extra tags): each gauge as last set.
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, dict]] = {}
        self._lock = threading.Lock()  # an iteration's gauges change together
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _get(self) -> dict[str, Any]:
        if self._metrics is None:
            self._metrics = {spec.name: _make(spec, self.tags) for spec in DRIVER_METRICS}
            self._set(ATTEMPT, self.attempt)
            self._heartbeat = threading.Thread(
                target=self._beat, name="uerl-metrics-heartbeat", daemon=True
            )
            self._heartbeat.start()
        return self._metrics

    def _set(self, spec: MetricSpec, value: float, tags: dict[str, str] | None = None) -> None:
        extra = dict(tags or {})
        self._gauges[(spec.name, tuple(sorted(extra.items())))] = (value, extra)
        self._get()[spec.name].set(value, tags=extra or None)

    def _beat(self) -> None:
        while not self._closed.wait(self.REFRESH_S):
            with self._lock:
                if self._closed.is_set():
                    return
                self.refresh()

    def refresh(self) -> None:
        """Every gauge set again, as last set."""
        metrics = self._get()
        for (name, _), (value, extra) in list(self._gauges.items()):
            metrics[name].set(value, tags=extra or None)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=self.REFRESH_S)

    def iteration(
        self,
        figures: IterationFigures,
        *,
        losses: Mapping[tuple[str, str], float] | None = None,
        rescales: int = 0,
    ) -> None:
        """`rescales`: the rescales the run has followed so far in this attempt."""
        with self._lock:
            metrics = self._get()
            for (policy, loss), value in (losses or {}).items():
                self._set(LEARNER_LOSS, value, {"policy": policy, "loss": loss})
            if rescales > self._rescales:
                metrics[RESCALES.name].inc(rescales - self._rescales)
                self._rescales = rescales
            metrics[ITERATIONS.name].inc(1)
            self._set(ITERATION, figures.iteration)
            self._set(RUN_ENV_STEPS, figures.env_steps_total)
            self._set(RUNNERS_HEALTHY, figures.runners_healthy)
            self._set(RUNNERS, figures.runners_total)
            # NaN is no figure (no episode finished yet): such a gauge stays unset.
            for spec, value in (
                (RUN_STEPS_PER_S, figures.env_steps_per_s),
                (LEARNER_STEPS_PER_S, figures.learner_steps_per_s),
                (EPISODE_RETURN, figures.episode_return_mean),
                (EPISODE_LENGTH, figures.episode_len_mean),
            ):
                if not math.isnan(value):
                    self._set(spec, value)

    def stored_through(self, at: float) -> None:
        with self._lock:
            self._set(STORED_THROUGH, at)

    def checkpoint_written(self, at: float | None = None) -> None:
        with self._lock:
            self._set(CHECKPOINT_TIME, time.time() if at is None else at)
