"""RLlib (new API stack) env runner that connects each remote runner to its own UE game.

`config.env_config["ue"]` holds a `UEConnection` (plain dict). Remote env runners
serve game slots 1..Y; runner i talks to `UEConnection.endpoint_for(slot)`, i.e. the
URL template expanded with `{worker_index}` and the port offset by the slot in
`per_worker` mode. The slot is the runner's index unless the run's `RunnerRegistry`
assigns another (runners added by a live rescale, see `training.rescale`). The
local runner (index 0) creates no env when remote runners exist (RLlib only builds
it when `num_env_runners == 0` or `create_env_on_local_worker`).

A game that dies or hangs does not stop training: every call to it has a
deadline, the runner drops the episodes the failure cut (they never count as
finished), returns what it has, and on each later `sample()` spends at most
`fault_wait_s` trying a new session. When the game answers again (a restarted
pod or process republishes its definition) the runner samples again; RLlib
never sees an error, so no actor restart and no 60 s restart delay.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED

from infra.endpoints import worker_endpoint
from training.policies.self_play import SelfPlayMapping
from training.protocol.errors import UEError, UEGameRefused, UEProtocolError
from training.protocol.game_definition import same_agents
from training.rllib.game_health import GameHealth
from training.rllib.ray_output import retag_if_quiet
from training.rllib.runner_registry import RunnerRegistry
from training.rllib.shared_health import SharedGameHealth
from training.telemetry.ray_metrics import RunnerMetrics

if TYPE_CHECKING:
    from training.rllib.vector_env import UEVectorEnv
    from training.tls.config import TLSConfig

log = logging.getLogger(__name__)

ENV_CONFIG_KEY = "ue"
# --policies ctde: the game's agents, every one of which must act at every step.
LOCKSTEP_AGENTS_KEY = "uerl_lockstep_agents"


class UEConnection(BaseModel):
    """How env runners reach their games; lives in `env_config["ue"]` as a plain dict."""

    model_config = ConfigDict(extra="forbid")

    url_template: str = Field(description="game host for env runner i; may contain {worker_index}")
    port: int = Field(ge=1, le=65535)
    port_offset_mode: Literal["fixed", "per_worker"] = "fixed"
    startup_timeout_s: float = Field(default=45.0, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0)
    # While its game is down, each sample() call waits at most this long for it.
    fault_wait_s: float = Field(default=2.0, gt=0)
    # Once every runner's game has been down this long, each sample() outlasts RLlib's
    # sample timeout, so the iteration ends empty and the driver can give up.
    give_up_after_s: float = Field(default=300.0, gt=0)
    tls_ca_path: str | None = None
    tls_cert_path: str | None = None
    tls_key_path: str | None = None
    # The game client: "auto" (compiled when built and the game is plaintext), "native"
    # or "python" (training/clients). None: the runner's UERL_GAME_CLIENT.
    client: Literal["auto", "native", "python"] | None = None
    # Labels of the runner's metrics (training.telemetry): the stack's and the run's names.
    stack: str = ""
    run: str = ""
    # False: the runner publishes nothing (`uerl bench --metrics-cost` measures the cost).
    metrics: bool = True

    def endpoint_for(self, worker_index: int) -> str:
        """`host:port` of the game that env runner `worker_index` talks to."""
        if worker_index < 1 and "{worker_index}" in self.url_template:
            raise ValueError(
                f"env runner {worker_index} is the local runner, but url_template "
                f"{self.url_template!r} names one game per remote env runner (1..N): use "
                "num_env_runners >= 1 (the local runner then needs no game) or a template "
                "without {worker_index}"
            )
        return worker_endpoint(self.url_template, self.port, self.port_offset_mode, worker_index)

    def tls(self) -> TLSConfig | None:
        from training.tls.config import TLSConfig  # grpc: only where envs are built

        if not (self.tls_ca_path or self.tls_cert_path or self.tls_key_path):
            return None
        return TLSConfig(self.tls_ca_path, self.tls_cert_path, self.tls_key_path)

    @classmethod
    def from_env_config(cls, env_config: dict[str, Any]) -> UEConnection:
        if ENV_CONFIG_KEY not in env_config:
            raise ValueError(
                f"env_config has no {ENV_CONFIG_KEY!r} entry (a UEConnection dict); "
                f"keys present: {sorted(env_config)}"
            )
        return cls.model_validate(env_config[ENV_CONFIG_KEY])


class EvaluationRunnerRefused(ValueError):
    """RLlib's in-training evaluation runners would share the training runners' games."""


class GameChangedError(UEProtocolError):
    """After a reconnect the game defines other environments, agents or spaces."""


class UEGameRunner:
    """What every uerl env runner does with its game, whichever RLlib runner it extends
    (`UEEnvRunner`: multi-agent; `training.rllib.single_agent`: one-agent games).

    The game decides the number of environments: one runner steps all environments
    of its game with one RPC, so set `num_envs_per_env_runner` to the game's count
    (`build_ppo_config` does) to keep rollout fragment sizing right.
    """

    # Set by RLlib's EnvRunner classes, which come after this one in the MRO.
    config: Any
    env: Any
    num_envs: int
    worker_index: int | None
    metrics: Any
    module: Any
    _callbacks: Any
    _needs_initial_reset: bool

    def __init__(self, config: Any, **kwargs: Any) -> None:
        if getattr(config, "in_evaluation", False):
            # RLlib numbers evaluation runners 1..N too: {worker_index} routing would send
            # evaluation runner i to training runner i's game, which already has a client.
            raise EvaluationRunnerRefused(
                f"env runner {kwargs.get('worker_index', '?')} is an RLlib evaluation "
                "runner: it would share training game i with training runner i. "
                "Evaluate with `uerl eval` (its own run, on games no training run holds)."
            )
        self._health: GameHealth | None = None
        self._game_signature: dict[str, Any] | None = None
        self._shared_health: SharedGameHealth | None = None
        self._connection: UEConnection | None = None
        self._slot: int | None = None
        self._expected_game: dict[str, Any] | None = None
        # Set after a rescale: this runner's share of the train batch per environment.
        self._fragment_length: int | None = None
        self._telemetry: RunnerMetrics | None = None
        self._game_env: UEVectorEnv | None = None
        _quiet_rllib_about_game_faults()
        # RLlib's logger is created on import, after the job's worker setup hook ran.
        retag_if_quiet()
        super().__init__(config=config, **kwargs)

    @property
    def connection(self) -> UEConnection:
        if self._connection is None:
            self._connection = UEConnection.from_env_config(dict(self.config.env_config))
        return self._connection

    @property
    def slot(self) -> int:
        """The game slot this runner serves: its index unless the registry says otherwise."""
        if self._slot is None:
            index = self.worker_index or 0
            registry = _registry()
            self._slot = registry.slot_of(index) if registry is not None and index else index
            if registry is not None:
                self._expected_game = registry.game()
                self._fragment_length = registry.fragment_length(index)
                opponents = registry.opponents()
                if opponents is not None:
                    self.follow_opponents(opponents)
        return self._slot

    def follow_opponents(self, module_ids: list[str]) -> None:
        """Self-play: the snapshots new episodes draw opponents from."""
        mapping = self.config.policy_mapping_fn
        if isinstance(mapping, SelfPlayMapping):
            mapping.opponents = tuple(module_ids)

    def follow_fragment_lengths(self, lengths: dict[int, int]) -> None:
        """The driver's new split of the train batch after a rescale."""
        self._fragment_length = lengths.get(self.worker_index or 0)

    # ------------------------------------------------------------------ RLlib API

    def make_env(self) -> None:
        from training.clients.grpc_tuning import apply_low_latency_defaults

        apply_low_latency_defaults()  # no-op if grpc is already loaded in this worker
        self._open_game(startup_timeout_s=self.connection.startup_timeout_s)

    def sample(self, **kwargs: Any) -> list[Any]:
        if (
            self._fragment_length is not None
            and kwargs.get("num_timesteps") is None
            and kwargs.get("num_episodes") is None
            and self.config.batch_mode == "truncate_episodes"
        ):
            kwargs["num_timesteps"] = self._fragment_length * self.num_envs
        health = self.game_health_state()
        self.telemetry.refresh()  # up or down, the game's gauges stay in the scrapes
        if health.refused:  # the driver stops the run after this iteration
            return self._sampled_nothing()
        if not health.healthy:
            connection = self.connection
            budget = connection.fault_wait_s
            if self._shared.every_game_down_for(connection.give_up_after_s):
                # Every call returning at once would spin RLlib's sampling loop forever;
                # outlasting its sample timeout ends the iteration (empty), and the
                # driver then stops the run. Still ready to sample if the game returns.
                budget = self.config.sample_timeout_s + connection.fault_wait_s
            if not self._reconnect(budget):
                return self._sampled_nothing()
        try:
            episodes = super().sample(**kwargs)
        except Exception as exc:
            fault = _game_fault(exc)
            if fault is None:
                raise
            if isinstance(fault, UEGameRefused):
                # The game answers the same way after a reconnect: refuse the run, as
                # ctde's lockstep check does (the driver stops it with this line).
                health.refuse(str(fault))
                log.info("%s", fault)
                self._forget_episodes()
            else:
                self._lose_game(fault)
            return self._sampled_nothing()
        if health.first_sample_at is None:
            health.first_sample_at = time.time()
        self._publish_sampled(episodes)
        lockstep = self.config.env_config.get(LOCKSTEP_AGENTS_KEY)
        return self._in_lockstep(episodes, lockstep) if lockstep else episodes

    # ------------------------------------------------------------------ health

    def game_health_state(self) -> GameHealth:
        if self._health is None:
            index = self.worker_index or 0
            self._health = GameHealth(index, self.connection.endpoint_for(self.slot), self.slot)
        return self._health

    @property
    def _shared(self) -> SharedGameHealth:
        if self._shared_health is None:
            import ray

            run_id = ray.get_runtime_context().get_job_id()
            self._shared_health = SharedGameHealth(self.config.num_env_runners, run_id)
        return self._shared_health

    def _note_fault(self, message: str) -> None:
        health = self.game_health_state()
        was_healthy = health.healthy
        health.fault(message)
        if was_healthy:
            self._shared.publish(health.runner_index, health.down_since)
            self.telemetry.game_down(health.down_since or time.time())
        else:  # still down, as the runner keeps trying
            self.telemetry.refresh()

    def _note_recovery(self) -> None:
        health = self.game_health_state()
        health.recovered()
        self._shared.publish(health.runner_index, None)
        self.telemetry.game_back()

    @property
    def telemetry(self) -> RunnerMetrics:
        if self._telemetry is None:
            connection, health = self.connection, self.game_health_state()
            self._telemetry = RunnerMetrics(
                stack=connection.stack,
                run=connection.run,
                runner=health.runner_index,
                game=health.endpoint,
                enabled=connection.metrics,
            )
        return self._telemetry

    def _publish_sampled(self, episodes: list[Any]) -> None:
        """This sample's env steps and each step RPC's time, to the runner's metrics."""
        steps = sum(episode.env_steps() for episode in episodes)
        game = self._game_env
        self.telemetry.sampled(steps, game.drain_step_seconds() if game is not None else ())

    def game_health(self) -> dict[str, Any]:
        """The report the driver reads after each iteration (drains the events)."""
        return self.game_health_state().report()

    # ------------------------------------------------------------------ internals

    def _in_lockstep(self, episodes: list[Any], agents: list[str]) -> list[Any]:
        """`episodes` if every agent acted at every step of each; else none, now and from
        then on: the run is refused (the driver stops it with the reason, and the learner
        never gets an episode it cannot build the critic's input for)."""
        from training.policies.ctde import lockstep_problem

        health = self.game_health_state()
        for episode in episodes:
            if health.refused:
                break
            problem = lockstep_problem(episode, agents)
            if problem is not None:
                health.refuse(problem)
                log.info("game at %s: %s", health.endpoint, problem)
        return [] if health.refused else episodes

    def _sampled_nothing(self) -> list[Any]:
        # RLlib sums this over runners to decide when a batch is full; a stat left
        # empty since the last reduce reads as NaN there.
        self.metrics.log_value(NUM_ENV_STEPS_SAMPLED, 0, reduce="sum")
        return []

    def _open_game(self, *, startup_timeout_s: float) -> None:
        from training.rllib.vector_env import UEVectorEnv  # grpc only where envs are built

        connection = self.connection
        self._close_env()
        index = self.worker_index or 0
        endpoint = connection.endpoint_for(self.slot)
        env = UEVectorEnv(
            endpoint,
            startup_timeout_s=startup_timeout_s,
            request_timeout_s=connection.request_timeout_s,
            tls=connection.tls(),
            client=connection.client,
        )
        signature = env.game.signature()
        if self._game_signature is None and _other_game(signature, self._expected_game):
            env.close()
            # A game that joined a running training must host what discovery found.
            raise GameChangedError(
                endpoint,
                "RequestTrainingDefinition",
                "this game defines different agents or spaces than the game the run "
                "discovered; it cannot join this training",
            )
        if self._game_signature is not None and signature != self._game_signature:
            env.close()
            # Another build (or another game) answered: its policies would not fit.
            raise GameChangedError(
                endpoint,
                "RequestTrainingDefinition",
                "after reconnecting, the game defines different environments, agents or "
                "spaces than before; restart training for a different build",
            )
        self._game_signature = signature
        self._game_env = env
        try:
            self.env = self._env_view(env)
        except BaseException:
            env.close()
            raise
        self.num_envs = env.num_envs
        if self.num_envs != self.config.num_envs_per_env_runner:
            log.warning(
                "game at %s hosts %d environments but num_envs_per_env_runner=%d; "
                "rollout fragments are sized for the latter",
                endpoint,
                self.num_envs,
                self.config.num_envs_per_env_runner,
            )
        self._forget_episodes()
        env_ctx = EnvContext(
            dict(self.config.env_config),
            worker_index=index,
            num_workers=self.config.num_env_runners,
        )
        make_callback(
            "on_environment_created",
            callbacks_objects=self._callbacks,
            callbacks_functions=self.config.callbacks_on_environment_created,
            kwargs=dict(
                env_runner=self, metrics_logger=self.metrics, env=self.env, env_context=env_ctx
            ),
        )

    def _close_env(self) -> None:
        if self.env is None:
            return
        try:
            self.env.close()
        except Exception as exc:  # a dead game must not block building a new session
            log.debug("closing the previous UE env failed: %s", exc)
        self.env = None

    def _forget_episodes(self) -> None:
        """Drop episodes in progress: the next sample starts from a reset. Episodes
        cut this way never finish, so they never count as finished episodes."""
        self._needs_initial_reset = True
        if hasattr(self, "_ongoing_episodes"):  # not yet set during __init__
            self._ongoing_episodes = [None] * self.num_envs
            self._ongoing_episodes_for_metrics.clear()
            self._cached_to_module = None

    def _lose_game(self, fault: UEError) -> None:
        self._note_fault(str(fault))
        # The driver prints one line per fault from the health report; this is detail.
        log.info("%s; this env runner keeps trying to reconnect", fault)
        self._close_env()
        self._forget_episodes()

    def _reconnect(self, budget_s: float) -> bool:
        """Try for a new session within `budget_s`; True once the game answers."""
        deadline = time.monotonic() + budget_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                self._open_game(startup_timeout_s=max(remaining, 0.2))
            except GameChangedError:
                raise  # a different game answered: not something waiting fixes
            except UEError as exc:
                self._note_fault(str(exc))
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
                continue
            self._note_recovery()
            log.info("game at %s answers again; sampling", self.game_health_state().endpoint)
            return True

    # ------------------------------------------------------------------ per RLlib runner
    # Abstract: RLlib's env runner classes are ABCs, so a runner missing one cannot be built.

    @abstractmethod
    def _env_view(self, game: UEVectorEnv) -> Any:
        """The env RLlib's runner steps, over the game's `UEVectorEnv`."""
        ...

    @abstractmethod
    def policy_states(self) -> dict[str, Any]:
        """Inference weights by the game's policy ids (`uerl eval` checks them)."""
        ...

    @abstractmethod
    def set_policy_states(self, states: Mapping[str, Any]) -> None:
        """Load weights given by the game's policy ids (`uerl eval`)."""
        ...

    @abstractmethod
    def episode_summary(self, episode: Any) -> dict[str, tuple[float, int]]:
        """Per policy in one finished episode: (return, length)."""
        ...


class UEEnvRunner(UEGameRunner, MultiAgentEnvRunner):
    """RLlib's `MultiAgentEnvRunner` on this runner's game (a `UEVectorEnv`)."""

    def _env_view(self, game: UEVectorEnv) -> UEVectorEnv:
        return game

    def policy_states(self) -> dict[str, Any]:
        return dict(self.module.get_state(inference_only=True))

    def set_policy_states(self, states: Mapping[str, Any]) -> None:
        self.module.set_state(dict(states))

    def episode_summary(self, episode: Any) -> dict[str, tuple[float, int]]:
        return multi_agent_episode_summary(episode)


def multi_agent_episode_summary(episode: Any) -> dict[str, tuple[float, int]]:
    """Per policy in one finished multi-agent episode: (return, length). A policy's return
    is the sum over its agents (RLlib's per-module return); its length the longest of its
    agents' (agents of one episode may finish early)."""
    out: dict[str, tuple[float, int]] = {}
    for aid, agent_episode in episode.agent_episodes.items():
        pid = episode.module_for(aid)
        ret, length = out.get(pid, (0.0, 0))
        out[pid] = (ret + float(agent_episode.get_return()), max(length, len(agent_episode)))
    return out


def _registry() -> RunnerRegistry | None:
    """The run's registry; None outside Ray (a runner built in-process by a test)."""
    import ray

    return RunnerRegistry.of_this_job() if ray.is_initialized() else None


def _other_game(signature: dict[str, Any], expected: dict[str, Any] | None) -> bool:
    """Whether a game's definition differs from the run's in agents or spaces."""
    return expected is not None and not same_agents(signature, expected)


def _game_fault(exc: BaseException) -> UEError | None:
    """The UEError behind an exception RLlib may have wrapped (e.g. RuntimeError from e)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, UEError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class _DropGameFaultTracebacks(logging.Filter):
    """RLlib logs a failed env step with its traceback; a game fault is reported once, in
    one line, by the driver instead (and kept in game_events.jsonl)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or _game_fault(exc) is None


def _quiet_rllib_about_game_faults() -> None:
    rllib_logger = logging.getLogger("ray.rllib")  # the logger RLlib's env runners use
    if not any(isinstance(f, _DropGameFaultTracebacks) for f in rllib_logger.filters):
        rllib_logger.addFilter(_DropGameFaultTracebacks())
