"""`--policies ctde`: per-agent actors, one centralised critic that sees every agent.

Centralised training, decentralised execution (MAPPO-style) on RLlib's new API stack:

- Each agent id has its own PPO actor (module id = agent id), acting on its own
  observation only: that actor is what env runners step, `uerl eval` plays and `uerl
  export` writes, so the game never needs another agent's observation.
- One value network is shared by all actors. Its input is the global observation: every
  agent's observation at the same step, flattened and concatenated in agent-id order.
  A learner connector piece (`AddGlobalObservations`) builds that column from the
  multi-agent episodes; only the learner computes values, so env runners never see it.
- `CTDEMultiRLModule` builds the critic once and hands it to every actor module; the
  learner (`CTDEPPOTorchLearner`) gives each parameter to exactly one optimizer, so the
  critic is stepped once per update with the gradient of every agent's value loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
    DefaultPPOTorchRLModule,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule, MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from training.policies.configurations import PolicyConfigurationError

# The train-batch column with the critic's input.
GLOBAL_OBS = "uerl_global_obs"
CRITIC_HIDDEN = (256, 256)


def flat_size(space: gym.Space) -> int:
    return int(gym.spaces.flatdim(space))


def flatten_batch(space: gym.Space, observations: Any, n: int) -> np.ndarray:
    """n observations of `space` as an (n, flatdim) float32 array."""
    if isinstance(space, gym.spaces.Box):
        return np.asarray(observations, np.float32).reshape(n, -1)
    from ray.rllib.utils.spaces.space_utils import unbatch

    items = unbatch(observations) if not isinstance(observations, list) else observations
    return np.stack([gym.spaces.flatten(space, item) for item in items]).astype(np.float32)


def lockstep_problem(ma_episode: Any, agents: Iterable[str]) -> str | None:
    """Why `ma_episode` (an episode or a chunk of one) cannot give one global observation
    per step, as one line, or None: every one of the game's `agents` must act at every
    step. Env runners check each episode they sample (`UEEnvRunner`), so a game whose
    agents act apart stops the run before the learner ever sees such an episode."""
    episodes = ma_episode.agent_episodes
    lengths = {aid: len(episodes[aid]) for aid in sorted(episodes)}
    if set(episodes) == set(agents) and len(set(lengths.values())) == 1:
        return None
    return (
        "--policies ctde needs every agent to act at every step of an episode, so "
        "each step has one global observation; this episode's agents and their "
        f"steps: {lengths} (game's agents: {sorted(agents)})"
    )


class AddGlobalObservations(ConnectorV2):
    """Learner connector: each agent's rows get every agent's observation at that step.

    Runs after PPO's own piece that extends each episode chunk by one bootstrap step, so
    its rows line up with the observation rows RLlib adds next."""

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        agent_spaces: Mapping[str, gym.Space],
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.agent_spaces = dict(sorted(agent_spaces.items()))

    def __call__(self, *, rl_module: Any, batch: dict, episodes: list, **kwargs: Any) -> Any:
        for ma_episode in episodes:
            if not isinstance(ma_episode, MultiAgentEpisode):
                raise PolicyConfigurationError("--policies ctde needs a multi-agent game")
            global_obs = self._global_observations(ma_episode)
            for sa_episode in ma_episode.agent_episodes.values():
                self.add_n_batch_items(
                    batch,
                    GLOBAL_OBS,
                    items_to_add=global_obs,
                    num_items=len(sa_episode),
                    single_agent_episode=sa_episode,
                )
        return batch

    def _global_observations(self, ma_episode: MultiAgentEpisode) -> np.ndarray:
        problem = lockstep_problem(ma_episode, self.agent_spaces)
        if problem is not None:
            raise PolicyConfigurationError(problem)
        episodes = ma_episode.agent_episodes
        lengths = {aid: len(episodes[aid]) for aid in episodes}
        n = next(iter(lengths.values()))
        return np.concatenate(
            [
                flatten_batch(space, episodes[aid].get_observations(slice(0, n)), n)
                for aid, space in self.agent_spaces.items()
            ],
            axis=1,
        )


class CentralCriticPPOModule(DefaultPPOTorchRLModule):
    """PPO's default actor; its values come from the shared critic on the global observation.

    The module's own critic (encoder and head) is dropped, so every parameter it keeps
    is trained and a distributed learner sees no unused parameter."""

    def setup(self) -> None:
        super().setup()
        self.encoder.critic_encoder = None
        self.vf = None
        self.central_critic: torch.nn.Module | None = None

    def get_non_inference_attributes(self) -> list[str]:
        return ["central_critic"]

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        encoder = self.encoder
        # With vf_share_layers the one encoder is the actor's; else its actor half.
        actor = encoder.encoder if encoder.config.shared else encoder.actor_encoder
        return {Columns.ACTION_DIST_INPUTS: self.pi(actor(batch)[ENCODER_OUT])}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward(batch)

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> Any:
        if self.central_critic is None:
            raise RuntimeError("an inference-only ctde actor has no critic")
        return self.central_critic(batch[GLOBAL_OBS]).squeeze(-1)


def central_critic(global_size: int, hidden: tuple[int, ...] = CRITIC_HIDDEN) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    size = global_size
    for width in hidden:
        layers += [torch.nn.Linear(size, width), torch.nn.Tanh()]
        size = width
    layers.append(torch.nn.Linear(size, 1))
    return torch.nn.Sequential(*layers)


class CTDEMultiRLModule(MultiRLModule):
    """The agents' actor modules, sharing one critic (built here, not per agent)."""

    def setup(self) -> None:
        super().setup()
        if self.inference_only:
            return
        critic = central_critic(int(self.model_config["global_obs_size"]))
        for module in self._rl_modules.values():
            module.central_critic = critic


class CTDEPPOTorchLearner(PPOTorchLearner):
    """PPO's learner, with each shared parameter in one optimizer only (else the critic
    would be stepped once per agent)."""

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        claimed: set[int] = self.__dict__.setdefault("_uerl_claimed_params", set())
        params = [p for p in self.get_parameters(self._module[module_id]) if id(p) not in claimed]
        claimed.update(id(p) for p in params)
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.Adam(params),
            params=params,
            lr_or_lr_schedule=config.lr,
        )


def ctde_module_spec(agent_spaces: Mapping[str, tuple[gym.Space, gym.Space]]) -> MultiRLModuleSpec:
    """One actor per agent id (with its spaces), and the shared critic's input size."""
    return MultiRLModuleSpec(
        multi_rl_module_class=CTDEMultiRLModule,
        model_config={"global_obs_size": sum(flat_size(obs) for obs, _ in agent_spaces.values())},
        rl_module_specs={
            aid: RLModuleSpec(
                module_class=CentralCriticPPOModule, observation_space=obs, action_space=act
            )
            for aid, (obs, act) in sorted(agent_spaces.items())
        },
    )
