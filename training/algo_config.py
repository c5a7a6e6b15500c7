"""The RLlib algorithm config for a deployment: endpoints + discovered game + hyperparameters.

Wraps `training.rllib_config.build_ppo_config` (env runners, one policy per
agent type) and adds what the topology decides: env-runner CPUs, X learners
with their CPUs/GPUs, and the algorithm choice. APPO and IMPALA reuse the same
env runner: everything but PPO's own training settings is carried over.
"""

from __future__ import annotations

from typing import Any

from infra.endpoints import Endpoints
from training import hparams as hp
from training.discovery import GameSpec
from training.env_runner import UEConnection
from training.rllib_config import build_ppo_config


def connection_for(endpoints: Endpoints, *, request_timeout_s: float = 60.0) -> UEConnection:
    return UEConnection(
        url_template=endpoints.worker_url_template,
        port=endpoints.port,
        port_offset_mode=endpoints.port_offset_mode,
        startup_timeout_s=endpoints.simulator_startup_timeout_s,
        request_timeout_s=request_timeout_s,
    )


def _switch_algo(config: Any, algo: hp.Algo) -> Any:
    if algo == "PPO":
        return config
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig

    cls = {"APPO": APPOConfig, "IMPALA": IMPALAConfig}[algo]
    # PPO's training settings (all levels of its training()) stay behind: the
    # target algorithm keeps its own defaults, then gets the hyperparameters.
    skip = set(hp.training_options("PPO"))
    carried = {k: v for k, v in config.to_dict().items() if k not in skip}
    return cls().update_from_dict(carried)


def build_algo_config(
    endpoints: Endpoints,
    game: GameSpec,
    *,
    algo: hp.Algo = "PPO",
    hparams: dict[str, Any] | None = None,
    seed: int | None = None,
    request_timeout_s: float = 60.0,
) -> Any:
    """The AlgorithmConfig (PPO, APPO or IMPALA) to `build_algo()`."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    values = hparams if hparams is not None else hp.merge(algo)
    training, model = hp.split(values)
    res = endpoints.resources
    config = build_ppo_config(
        game,
        connection_for(endpoints, request_timeout_s=request_timeout_s),
        num_env_runners=endpoints.num_env_runners,
        custom_resource=endpoints.custom_resource,
        num_learners=endpoints.num_learners,
        seed=seed,
    )
    config = _switch_algo(config, algo)
    config = (
        config.env_runners(num_cpus_per_env_runner=res.cpus_per_env_runner)
        .learners(
            num_learners=endpoints.num_learners,
            num_cpus_per_learner=res.cpus_per_learner,
            num_gpus_per_learner=res.gpus_per_learner,
        )
        .training(**training)
    )
    if model:
        config = config.rl_module(model_config=DefaultModelConfig(**model))
    return config
