"""One-agent games on RLlib's single-agent path: a gymnasium vector env and its runner.

Most Schola games (and every single-agent gymnasium scenario) hold one agent per
environment. RLlib samples those faster with its `SingleAgentEnvRunner` and
`SingleAgentEpisode`s than with the multi-agent runner: no per-environment agent dicts,
no per-agent episodes, batched numpy end to end. `UESingleAgentVectorEnv` steps all of a
game's environments in one RPC as `UEVectorEnv` does, but decodes the reply straight
into batches; `UESingleAgentEnvRunner` is RLlib's runner with the same game handling
as `UEEnvRunner` (deadlines, reconnects, rescale, fragment sizing: `UEGameRunner`).

RLlib names a single-agent module `default_policy`; the run records which of the
game's policies it is (`env_config[SINGLE_AGENT_POLICY_KEY]`, the checkpoint's
`uerl.json`) so checkpoints, `uerl eval` and `uerl export` name the game's policy.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from training.protocol import spaces as codec
from training.protocol.errors import UEGameRefused
from training.protocol.step_layout import BOX, DISCRETE, ActionColumn
from training.protocol.transport import RESET, STEP
from training.rllib.env_runner import UEGameRunner

if TYPE_CHECKING:  # grpc only where envs are built, not on the driver
    from training.rllib.vector_env import UEVectorEnv

# env_config key: the game's policy id that RLlib's `default_policy` module is.
SINGLE_AGENT_POLICY_KEY = "uerl_single_agent_policy"


class UESingleAgentVectorEnv(gym.vector.VectorEnv):
    """A one-agent game's N environments as a gymnasium vector env (NEXT_STEP autoreset).

    Observations, rewards, terminations and truncations come back as batches, row i
    being environment i; infos as one dict per environment (RLlib's list form).
    """

    def __init__(self, game: UEVectorEnv) -> None:
        if len(game.possible_agents) != 1:
            self.closed = True  # nothing of ours to close: the caller keeps the game
            raise ValueError(
                f"game at {game.endpoint} has agents {game.possible_agents}: the single-agent "
                "path takes games with one agent per environment"
            )
        self.game = game
        (self.agent,) = game.possible_agents
        self.endpoint = game.endpoint
        self.num_envs = game.num_envs
        self.single_observation_space = game.single_observation_spaces[self.agent]
        self.single_action_space = game.single_action_spaces[self.agent]
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.closed = False
        self._layout = game.layout
        self._codec = game.codec
        self._client = game.client
        self._action_kind = game.layout.action_kinds[0]
        self._all_envs = np.arange(self.num_envs, dtype=np.int32)
        # Environments whose last step ended their episode: this step is their restart.
        self._restarting = np.zeros(self.num_envs, np.bool_)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[Any, list[dict[str, str]]]:
        observations, infos = self.game.reset(seed=seed, options=options)
        self._restarting[:] = False
        for i, obs in enumerate(observations):
            if self.agent not in obs:
                raise UEGameRefused(self.endpoint, RESET, self._missing_agent(i))
        values = [obs[self.agent] for obs in observations]
        return (
            codec.stack_values(self.single_observation_space, values),
            [info.get(self.agent, {}) for info in infos],
        )

    def step(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict[str, str]]]:
        n = self.num_envs
        started = time.perf_counter()
        request = self._codec.encode(n, [ActionColumn(0, self._all_envs, self._values(actions))])
        reply = self._client.update_bytes(request, STEP)
        self.game.step_seconds.append(time.perf_counter() - started)  # as the game's own step
        col = self.game.decode_columns(reply)[0]
        if len(col.env) != n:
            missing = sorted(set(range(n)).difference(col.env.tolist()))
            raise UEGameRefused(self.endpoint, STEP, self._missing_agent(missing[0]))
        restarting = self._restarting
        observations = self._layout.observations(0, col.leaves, n)
        rewards = np.where(restarting, np.float32(0), col.reward)
        terminated = col.terminated & ~restarting
        truncated = col.truncated & ~restarting
        self._restarting = terminated | truncated
        infos: list[dict[str, str]] = [{} for _ in range(n)]
        for row, info in col.infos:
            infos[row] = info
        return observations, rewards, terminated, truncated, infos

    def _missing_agent(self, env: int) -> str:
        return (
            f"environment {env}: no state for agent {self.agent!r} (the single-agent path "
            "needs the agent every step; train with --env-runner multi_agent)"
        )

    def close_extras(self, **kwargs: Any) -> None:
        self.game.close()

    def _values(self, actions: Any) -> Any:
        """The batch RLlib hands over as the codec's flat values, checked for size."""
        kind = self._action_kind
        if kind is None:  # a Dict action space: a dict of batches, as stack_values makes
            return _stacked(self.single_action_space, actions)
        flat = np.asarray(actions, np.float32 if kind[0] == BOX else np.int64).reshape(-1)
        per_env = 1 if kind[0] == DISCRETE else kind[1]
        if flat.size != self.num_envs * per_env:
            raise codec.CodecError(
                f"action of {self.agent!r}",
                f"expected {per_env} value(s) for each of {self.num_envs} environments, "
                f"got {flat.size} in all",
            )
        return flat

    def __repr__(self) -> str:
        return f"UESingleAgentVectorEnv({self.endpoint}, num_envs={self.num_envs})"


def _stacked(space: gym.Space, batch: Any) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {key: _stacked(sub, batch[key]) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Discrete):
        return np.asarray(batch, np.int64).reshape(-1)
    return np.asarray(batch)


class UESingleAgentEnvRunner(UEGameRunner, SingleAgentEnvRunner):
    """RLlib's `SingleAgentEnvRunner` on this runner's game (a one-agent game)."""

    def _env_view(self, game: UEVectorEnv) -> UESingleAgentVectorEnv:
        return UESingleAgentVectorEnv(game)

    @property
    def policy_id(self) -> str:
        """The game's policy RLlib's `default_policy` module is."""
        return str(self.config.env_config.get(SINGLE_AGENT_POLICY_KEY, DEFAULT_MODULE_ID))

    def policy_states(self) -> dict[str, Any]:
        return {self.policy_id: self.module.get_state(inference_only=True)}

    def set_policy_states(self, states: Mapping[str, Any]) -> None:
        self.module.set_state(states[self.policy_id])

    def episode_summary(self, episode: Any) -> dict[str, tuple[float, int]]:
        return {self.policy_id: (float(episode.get_return()), len(episode))}
