"""RLlib (new API stack) env runner that connects each remote runner to its own UE game.

`config.env_config["ue"]` holds a `UEConnection` (plain dict). Remote env runners
are numbered 1..N; runner i talks to `UEConnection.endpoint_for(i)`, i.e. the URL
template expanded with `{worker_index}` and the port offset by i in `per_worker`
mode. The local runner (index 0) creates no env when remote runners exist (RLlib
only builds it when `num_env_runners == 0` or `create_env_on_local_worker`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

from infra.endpoints import worker_endpoint

if TYPE_CHECKING:
    from training.protocol.client import TLSConfig

log = logging.getLogger(__name__)

ENV_CONFIG_KEY = "ue"


class UEConnection(BaseModel):
    """How env runners reach their games; lives in `env_config["ue"]` as a plain dict."""

    model_config = ConfigDict(extra="forbid")

    url_template: str = Field(description="game host for env runner i; may contain {worker_index}")
    port: int = Field(ge=1, le=65535)
    port_offset_mode: Literal["fixed", "per_worker"] = "fixed"
    startup_timeout_s: float = Field(default=45.0, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0)
    tls_ca_path: str | None = None
    tls_cert_path: str | None = None
    tls_key_path: str | None = None

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
        from training.protocol.client import TLSConfig  # grpc: only where envs are built

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


class UEEnvRunner(MultiAgentEnvRunner):
    """A `MultiAgentEnvRunner` whose env is a `UEVectorEnv` over this runner's game.

    The game decides the number of environments: one runner steps all environments
    of its game with one RPC, so set `num_envs_per_env_runner` to the game's count
    (`build_ppo_config` does) to keep rollout fragment sizing right.
    """

    def make_env(self) -> None:
        from training.protocol.grpc_tuning import apply_low_latency_defaults

        apply_low_latency_defaults()  # no-op if grpc is already loaded in this worker
        from training.rllib.vector_env import UEVectorEnv  # grpc only where envs are built

        if self.env is not None:
            try:
                self.env.close()
            except Exception as exc:  # a dead game must not block building a new session
                log.warning("closing the previous UE env failed: %s", exc)
            self.env = None
        connection = UEConnection.from_env_config(dict(self.config.env_config))
        index = self.worker_index or 0
        endpoint = connection.endpoint_for(index)
        self.env = UEVectorEnv(
            endpoint,
            startup_timeout_s=connection.startup_timeout_s,
            request_timeout_s=connection.request_timeout_s,
            tls=connection.tls(),
        )
        self.num_envs = self.env.num_envs
        if self.num_envs != self.config.num_envs_per_env_runner:
            log.warning(
                "game at %s hosts %d environments but num_envs_per_env_runner=%d; "
                "rollout fragments are sized for the latter",
                endpoint,
                self.num_envs,
                self.config.num_envs_per_env_runner,
            )
        self._needs_initial_reset = True
        if hasattr(self, "_ongoing_episodes"):  # re-created after a failure: resize
            self._ongoing_episodes = [None] * self.num_envs
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
