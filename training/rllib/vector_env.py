"""RLlib multi-agent *vector* environment over one UE game instance hosting N environments.

One `UpdateState` RPC steps all N environments. The session uses Schola's NEXT_STEP
autoreset, which is exactly RLlib's vector-env convention: after an environment
reports done, the next step ignores its actions and answers the reset observation
(reward 0, not done). Agent ids are the game's strings; each agent's `agent_type`
is kept for policy mapping. Everything the game sends is validated, and errors
name the endpoint, environment, agent and field at fault.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.env.vector.vector_multi_agent_env import VectorMultiAgentEnv

from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.client import GymClient
from training.protocol.errors import UEProtocolError
from training.protocol.game_spec import GameSpec, game_spec_from_definition
from training.tls.config import TLSConfig

ALL = "__all__"


class UESubEnv(MultiAgentEnv):
    """Environment `index` of a game as RLlib sees it: agents and spaces only.

    RLlib's runner reads sub-env spaces through `env.envs[i]`; stepping goes through
    the vector env so that all environments share one RPC.
    """

    def __init__(self, game: GameSpec, index: int) -> None:
        self.possible_agents = sorted(game.agents)
        self.agents = list(self.possible_agents)
        super().__init__()
        self.index = index
        self.observation_spaces = {a: s.observation_space for a, s in game.agents.items()}
        self.action_spaces = {a: s.action_space for a, s in game.agents.items()}
        self.agent_types = {a: s.agent_type for a, s in game.agents.items()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        raise RuntimeError(
            "UESubEnv only describes spaces: reset the UEVectorEnv (one RPC resets all)"
        )

    def step(self, action_dict: dict):
        raise RuntimeError(
            "UESubEnv only describes spaces: step the UEVectorEnv (one RPC steps all)"
        )


class UEVectorEnv(VectorMultiAgentEnv):
    """N environments of one game, stepped together; RLlib's `VectorMultiAgentEnv` API."""

    def __init__(
        self,
        endpoint: str,
        *,
        startup_timeout_s: float = 45.0,
        request_timeout_s: float = 60.0,
        tls: TLSConfig | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.closed = False
        self.client = GymClient(
            endpoint,
            startup_timeout_s=startup_timeout_s,
            request_timeout_s=request_timeout_s,
            tls=tls,
        )
        try:
            self.client.connect(pb.NEXT_STEP)
            self.game = game_spec_from_definition(self.client.training_definition(), endpoint)
        except BaseException:
            self.client.close()
            raise
        game = self.game
        self.num_envs = game.num_envs
        self.metadata = {"autoreset_mode": "next_step"}
        self.possible_agents = sorted(game.agents)
        self.agent_types = {a: s.agent_type for a, s in game.agents.items()}
        self.envs = [UESubEnv(game, i) for i in range(self.num_envs)]
        self.single_observation_spaces = {
            a: game.agents[a].observation_space for a in self.possible_agents
        }
        self.single_action_spaces = {a: game.agents[a].action_space for a in self.possible_agents}
        self.single_observation_space = gym.spaces.Dict(self.single_observation_spaces)
        self.single_action_space = gym.spaces.Dict(self.single_action_spaces)
        n = self.num_envs
        # Per environment and episode: agents seen, agents done; and whether the game will
        # answer the next step with a restart (NEXT_STEP autoreset).
        self._seen: list[set[str]] = [set() for _ in range(n)]
        self._done: list[set[str]] = [set() for _ in range(n)]
        self._restarting = np.zeros(n, np.bool_)

    # ------------------------------------------------------------------ API

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[list[dict[str, Any]], list[dict[str, dict[str, str]]]]:
        super().reset(seed=seed if isinstance(seed, int) else None)
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, int | np.integer):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"{len(seeds)} seeds for {n} environments")
        str_options = {str(k): str(v) for k, v in (options or {}).items()}
        return self.decode_reset(self.client.reset(dict(enumerate(seeds)), str_options))

    def decode_reset(
        self, state: pb.State
    ) -> tuple[list[dict[str, Any]], list[dict[str, dict[str, str]]]]:
        """The reset reply as per-environment observations and infos (validated)."""
        n = self.num_envs
        op = "UpdateState(reset)"
        if not state.HasField("initial_state"):
            raise UEProtocolError(self.endpoint, op, "reply has no initial_state")
        initial = state.initial_state.environment_states
        observations, infos = [], []
        for i in range(n):
            if i not in initial:
                raise UEProtocolError(self.endpoint, op, f"no initial state for environment {i}")
            obs, info = self._decode_initial(initial[i].agent_states, i, op)
            if not obs:
                raise UEProtocolError(self.endpoint, op, f"environment {i}: no agent observed")
            observations.append(obs)
            infos.append(info)
            self._seen[i] = set(obs)
            self._done[i] = set()
        self._restarting[:] = False
        return observations, infos

    def step(self, actions: Sequence[Mapping[str, Any]]) -> tuple[list, list, list, list, list]:
        n = self.num_envs
        if len(actions) != n:
            raise ValueError(f"{len(actions)} action dicts for {n} environments")
        update = pb.StateUpdate()
        env_steps = update.step.environments
        # Gather each agent's actions across environments, then encode them as one batch.
        points: dict[str, list[pb.Point]] = {aid: [] for aid in self.possible_agents}
        values: dict[str, list[Any]] = {aid: [] for aid in self.possible_agents}
        for i, agent_actions in enumerate(actions):
            updates = env_steps.add().updates
            for aid, action in agent_actions.items():
                if aid not in points:
                    raise ValueError(f"environment {i}: action for unknown agent {aid!r}")
                points[aid].append(updates[aid])
                values[aid].append(action)
        for aid, agent_points in points.items():
            if agent_points:
                space = self.single_action_spaces[aid]
                batch = codec.stack_values(space, values[aid])
                codec.batch_to_points(space, batch, agent_points, f"action of {aid!r}")
        state = self.client.step(update)
        return self.decode_step(state)

    def close_extras(self, **kwargs: Any) -> None:
        self.client.close()

    # ------------------------------------------------------------------ decoding

    def decode_step(self, state: pb.State) -> tuple[list, list, list, list, list]:
        """The step reply as RLlib's five per-environment lists (validated)."""
        op = "UpdateState(step)"
        n = self.num_envs
        if not state.HasField("training_state"):
            raise UEProtocolError(self.endpoint, op, "reply has no training_state")
        env_states = state.training_state.environment_states
        if len(env_states) != n:
            raise UEProtocolError(
                self.endpoint, op, f"reply has {len(env_states)} environments, expected {n}"
            )
        observations: list[dict[str, Any]] = [{} for _ in range(n)]
        rewards: list[dict[str, float]] = [{} for _ in range(n)]
        terminateds: list[dict[str, bool]] = [{} for _ in range(n)]
        truncateds: list[dict[str, bool]] = [{} for _ in range(n)]
        infos: list[dict[str, dict[str, str]]] = [{} for _ in range(n)]
        # Group agent states by agent so each agent's observations decode as one batch.
        where: dict[str, list[int]] = {aid: [] for aid in self.possible_agents}
        states: dict[str, list[pb.AgentState]] = {aid: [] for aid in self.possible_agents}
        for i, env_state in enumerate(env_states):
            for aid, st in env_state.agent_states.items():
                if aid not in where:
                    raise UEProtocolError(
                        self.endpoint, op, f"environment {i}: unknown agent {aid!r}"
                    )
                where[aid].append(i)
                states[aid].append(st)
        for aid, indices in where.items():
            if not indices:
                continue
            sts = states[aid]
            obs = self._decode_observations(aid, indices, [st.observations for st in sts], op)
            reward = np.fromiter((st.reward for st in sts), np.float32, count=len(sts))
            if np.isnan(reward).any():
                bad = indices[int(np.flatnonzero(np.isnan(reward))[0])]
                raise UEProtocolError(
                    self.endpoint, op, f"environment {bad} agent {aid!r} reward is NaN"
                )
            for k, (i, st) in enumerate(zip(indices, sts, strict=True)):
                observations[i][aid] = obs[k]
                rewards[i][aid] = float(reward[k])
                terminateds[i][aid] = st.terminated
                truncateds[i][aid] = st.truncated
                infos[i][aid] = dict(st.info) if st.info else {}
        for i in range(n):
            obs_i, term, trunc = observations[i], terminateds[i], truncateds[i]
            if self._restarting[i]:
                # NEXT_STEP: this is the environment's reset observation.
                self._restarting[i] = False
                self._seen[i] = set(obs_i)
                self._done[i] = set()
                rewards[i] = dict.fromkeys(obs_i, 0.0)
                terminateds[i] = term = dict.fromkeys(obs_i, False)
                truncateds[i] = trunc = dict.fromkeys(obs_i, False)
                term[ALL] = trunc[ALL] = False
                continue
            seen, done = self._seen[i], self._done[i]
            seen.update(obs_i)
            done.update(a for a in obs_i if term[a] or trunc[a])
            finished = bool(seen) and done >= seen
            ended_by_termination = finished and not any(trunc.values())
            term[ALL] = ended_by_termination
            trunc[ALL] = finished and not ended_by_termination
            if finished:
                self._restarting[i] = True
        return observations, rewards, terminateds, truncateds, infos

    def _decode_observations(
        self, aid: str, indices: list[int], points: list[pb.Point], op: str
    ) -> list[Any]:
        space = self.single_observation_spaces[aid]
        try:
            batch = codec.points_to_batch(space, points)
        except codec.CodecError:
            # Slow path, errors only: find which environment sent the bad point.
            for i, point in zip(indices, points, strict=True):
                try:
                    codec.point_to_value(space, point)
                except codec.CodecError as exc:
                    raise UEProtocolError(
                        self.endpoint, op, f"environment {i} agent {aid!r} observations: {exc}"
                    ) from None
            raise
        return codec.batch_rows(space, batch, len(points))

    def _decode_initial(
        self, agent_states: Mapping[str, pb.InitialAgentState], i: int, op: str
    ) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
        obs: dict[str, Any] = {}
        info: dict[str, dict[str, str]] = {}
        for aid, st in agent_states.items():
            space = self.single_observation_spaces.get(aid)
            if space is None:
                raise UEProtocolError(self.endpoint, op, f"environment {i}: unknown agent {aid!r}")
            try:
                obs[aid] = codec.point_to_value(space, st.observations)
            except codec.CodecError as exc:
                raise UEProtocolError(
                    self.endpoint, op, f"environment {i} agent {aid!r} observations: {exc}"
                ) from None
            info[aid] = dict(st.info)
        return obs, info

    def __repr__(self) -> str:
        return f"UEVectorEnv({self.endpoint}, num_envs={self.num_envs})"
