"""The RLlib algorithm config: endpoints + discovered game + hyperparameters.

`build_ppo_config` wires the env runners (one per game, each routed to its own game)
and the policies of the game's configuration (one per agent type by default). A game
with one agent per environment trains on RLlib's single-agent runner and episodes
(`training.rllib.single_agent`), faster; other games on the multi-agent ones. `build_algo_config`
adds what the topology decides (env-runner CPUs, X learners with their
CPUs/GPUs) and the algorithm choice: APPO and IMPALA reuse the same env runner,
everything but PPO's own training settings is carried over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import gymnasium as gym

from infra.endpoints import Endpoints
from training.policies.configurations import (
    PolicyConfigurationError,
    PolicyMapping,
    check_fits,
)
from training.policies.game_spec import GameSpec
from training.policies.outcomes import SelfPlayOutcomes
from training.policies.self_play import LEARNER, SelfPlayMapping, SelfPlaySettings
from training.rllib import hparams as hp
from training.rllib.env_runner import (
    ENV_CONFIG_KEY,
    LOCKSTEP_AGENTS_KEY,
    UEConnection,
    UEEnvRunner,
)
from training.rllib.single_agent import SINGLE_AGENT_POLICY_KEY, UESingleAgentEnvRunner

if TYPE_CHECKING:
    from ray.rllib.algorithms.ppo import PPOConfig

RUNNER_RESTART_DELAY_S = 2.0
RUNNER_PROBE_TIMEOUT_S = 10.0

# `config.env` is only a label: UEEnvRunner builds its env from env_config["ue"].
ENV_LABEL = "uerl-ue-game"

EnvRunnerPath = Literal["single_agent", "multi_agent"]
EnvRunnerChoice = hp.EnvRunnerChoice


def env_runner_path(game: GameSpec, choice: EnvRunnerChoice = "auto") -> EnvRunnerPath:
    """The path `choice` means for `game`; a clear error when it cannot take it."""
    if choice == "multi_agent":
        return "multi_agent"
    if game.single_agent_policy() is not None:
        return "single_agent"
    if choice == "single_agent":
        raise PolicyConfigurationError(
            f"--env-runner single_agent takes games with one agent per environment; this "
            f"game has agents {sorted(game.agents)}: use --env-runner multi_agent or auto"
        )
    return "multi_agent"


def path_of(config: Any) -> EnvRunnerPath:
    """The path an algorithm config samples with (a checkpoint records it)."""
    return "single_agent" if SINGLE_AGENT_POLICY_KEY in config.env_config else "multi_agent"


def policy_names(config: Any) -> dict[str, str]:
    """RLlib module id -> the game's policy id, where they differ: the single-agent path's
    `default_policy` is the game's one policy."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    policy_id = config.env_config.get(SINGLE_AGENT_POLICY_KEY)
    return {DEFAULT_MODULE_ID: policy_id} if policy_id else {}


def build_ppo_config(
    game: GameSpec,
    connection: UEConnection,
    *,
    num_env_runners: int,
    custom_resource: str | None = None,
    num_learners: int = 0,
    train_batch_size: int = 4000,
    minibatch_size: int = 128,
    num_epochs: int = 10,
    seed: int | None = None,
    self_play: SelfPlaySettings | None = None,
    env_runner: EnvRunnerChoice = "auto",
) -> PPOConfig:
    """PPO over `num_env_runners` games (one env runner each), with the policies of the
    game spec's policy configuration (one per agent type by default)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    config = (
        PPOConfig()
        .api_stack(
            enable_rl_module_and_learner=True,
            enable_env_runner_and_connector_v2=True,
        )
        .environment(
            env=ENV_LABEL,
            env_config={ENV_CONFIG_KEY: connection.model_dump()},
            # The checker would call reset/step on sub-env views; the game is checked by
            # UEVectorEnv's own validation instead.
            disable_env_checking=True,
        )
        .env_runners(
            num_env_runners=num_env_runners,
            # One runner steps all environments of its game in one RPC.
            num_envs_per_env_runner=game.num_envs,
            custom_resources_per_env_runner=({custom_resource: 1} if custom_resource else {}),
        )
        .learners(num_learners=num_learners)
        .training(
            train_batch_size_per_learner=train_batch_size,
            minibatch_size=minibatch_size,
            num_epochs=num_epochs,
        )
    )
    if env_runner_path(game, env_runner) == "single_agent":
        config = _single_agent(config, game)
    else:
        config = _multi_agent(config, game, self_play)
    if seed is not None:
        config = config.debugging(seed=seed)
    return config


def _single_agent(config: PPOConfig, game: GameSpec) -> PPOConfig:
    """A game with one agent per environment: RLlib's single-agent runner, episodes and
    module. The module is RLlib's `default_policy`; env_config names the game's policy
    it stands for."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    ((obs, act),) = game.policy_spaces().values()
    env_config = {**config.env_config, SINGLE_AGENT_POLICY_KEY: game.single_agent_policy()}
    return (
        config.environment(env_config=env_config, observation_space=obs, action_space=act)
        .env_runners(env_runner_cls=UESingleAgentEnvRunner)
        # Spaces come from discovery, so the driver and learners need no game.
        .rl_module(rl_module_spec=RLModuleSpec(observation_space=obs, action_space=act))
    )


def _multi_agent(
    config: PPOConfig, game: GameSpec, self_play: SelfPlaySettings | None
) -> PPOConfig:
    """RLlib's multi-agent runner, episodes and modules, one per policy."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    policy_spaces = game.policy_spaces()
    policies: Any = set(game.policy_ids())
    mapping: Any = PolicyMapping(game.policy_mapping())
    if game.policies == "self_play":
        # The learner and a ring of frozen snapshots, all alike; opponents come from the
        # window once the driver has taken the first snapshot.
        settings = self_play or SelfPlaySettings()
        spaces = policy_spaces[LEARNER]
        policy_spaces = {module_id: spaces for module_id in settings.module_ids()}
        policies = set(policy_spaces)
        mapping = SelfPlayMapping(tuple(sorted(game.agents)), (), settings.p_current)
    config = (
        config.environment(
            # Agent-keyed spaces let a runner without a game (the local one) build its
            # connectors; remote runners report the same spaces from their games.
            observation_space=gym.spaces.Dict(
                {aid: spec.observation_space for aid, spec in sorted(game.agents.items())}
            ),
            action_space=gym.spaces.Dict(
                {aid: spec.action_space for aid, spec in sorted(game.agents.items())}
            ),
        )
        .env_runners(env_runner_cls=UEEnvRunner)
        .multi_agent(
            policies=policies,
            policy_mapping_fn=mapping,
            # Snapshots are frozen: only the learner trains under self-play.
            policies_to_train=[LEARNER] if game.policies == "self_play" else None,
        )
        .rl_module(
            # Spaces come from discovery, so the driver and learners need no game.
            rl_module_spec=MultiRLModuleSpec(
                rl_module_specs={
                    pid: RLModuleSpec(observation_space=obs, action_space=act)
                    for pid, (obs, act) in policy_spaces.items()
                }
            )
        )
    )
    if game.policies == "self_play":
        config = config.callbacks(SelfPlayOutcomes)
    if game.policies == "ctde":
        config = _centralised_critic(config, game)
    return config


def _centralised_critic(config: PPOConfig, game: GameSpec) -> PPOConfig:
    """--policies ctde: the actors' module spec, the learner that builds the critic's input
    and steps the shared critic once (training.policies.ctde)."""
    from functools import partial

    from training.policies.ctde import CTDEPPOTorchLearner, ctde_module_spec

    agent_spaces = {aid: spec.observation_space for aid, spec in game.agents.items()}
    # Env runners check every episode for the lockstep the critic's input needs, against
    # the game's definition, so a game whose agents act apart stops the run there.
    env_config = {**config.env_config, LOCKSTEP_AGENTS_KEY: sorted(game.agents)}
    return (
        config.environment(env_config=env_config)
        .rl_module(rl_module_spec=ctde_module_spec(game.policy_spaces()))
        .training(learner_class=CTDEPPOTorchLearner)
        .learners(learner_connector=partial(_global_observations, agent_spaces=agent_spaces))
    )


def _global_observations(obs_space: Any, act_space: Any, *, agent_spaces: dict) -> Any:
    from training.policies.ctde import AddGlobalObservations

    return AddGlobalObservations(obs_space, act_space, agent_spaces=agent_spaces)


def connection_for(
    endpoints: Endpoints,
    *,
    request_timeout_s: float = 60.0,
    fault_wait_s: float = 2.0,
    give_up_after_s: float = 300.0,
    run_name: str = "",
) -> UEConnection:
    return UEConnection(
        url_template=endpoints.worker_url_template,
        port=endpoints.port,
        port_offset_mode=endpoints.port_offset_mode,
        startup_timeout_s=endpoints.simulator_startup_timeout_s,
        request_timeout_s=request_timeout_s,
        fault_wait_s=fault_wait_s,
        give_up_after_s=give_up_after_s,
        tls_ca_path=endpoints.tls.ca_path if endpoints.tls else None,
        tls_cert_path=endpoints.tls.cert_path if endpoints.tls else None,
        tls_key_path=endpoints.tls.key_path if endpoints.tls else None,
        stack=endpoints.cluster_name,
        run=run_name,
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


def learner_resources(endpoints: Endpoints) -> dict[str, float]:
    """What each remote learner asks Ray for besides CPUs and GPUs."""
    resource = endpoints.learner_custom_resource
    return {resource: 1.0} if resource and endpoints.num_learners > 0 else {}


def build_algo_config(
    endpoints: Endpoints,
    game: GameSpec,
    *,
    algo: hp.Algo = "PPO",
    hparams: dict[str, Any] | None = None,
    seed: int | None = None,
    request_timeout_s: float = 60.0,
    fault_wait_s: float = 2.0,
    give_up_after_s: float = 300.0,
    sample_timeout_s: float = 60.0,
    self_play: SelfPlaySettings | None = None,
    env_runner: EnvRunnerChoice = "auto",
    run_name: str = "",
) -> Any:
    """The AlgorithmConfig (PPO, APPO or IMPALA) to `build_algo()`; `run_name` labels
    the env runners' metrics."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    check_fits(game.policies, algo=algo, num_learners=endpoints.num_learners)
    values = hparams if hparams is not None else hp.merge(algo)
    training, model = hp.split(values)
    res = endpoints.resources
    config = build_ppo_config(
        game,
        connection_for(
            endpoints,
            request_timeout_s=request_timeout_s,
            fault_wait_s=fault_wait_s,
            give_up_after_s=give_up_after_s,
            run_name=run_name,
        ),
        num_env_runners=endpoints.num_env_runners,
        custom_resource=endpoints.custom_resource,
        num_learners=endpoints.num_learners,
        seed=seed,
        self_play=self_play,
        env_runner=env_runner,
    )
    config = _switch_algo(config, algo)
    config = (
        config.env_runners(
            num_cpus_per_env_runner=res.cpus_per_env_runner, sample_timeout_s=sample_timeout_s
        )
        .learners(
            num_learners=endpoints.num_learners,
            num_cpus_per_learner=res.cpus_per_learner,
            num_gpus_per_learner=res.gpus_per_learner,
            # One unit each of what only learner nodes advertise: a learner never lands
            # on a worker node, whose pod a shrink may delete (and the learner with it).
            custom_resources_per_learner=learner_resources(endpoints),
        )
        .training(**training)
        # Game faults never reach RLlib (UEEnvRunner reconnects by itself); these cover
        # a runner actor that dies with its node: restart it in seconds, not 60.
        .fault_tolerance(
            restart_failed_env_runners=True,
            delay_between_env_runner_restarts_s=RUNNER_RESTART_DELAY_S,
            env_runner_health_probe_timeout_s=RUNNER_PROBE_TIMEOUT_S,
        )
        # No CPU/GPU utilisation monitor thread: uerl reports none of it (and it warns
        # on every build where GPUtil is not installed).
        .debugging(log_sys_usage=False)
    )
    if model:
        config = config.rl_module(model_config=DefaultModelConfig(**model))
    return config
