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
from training.protocol.step_codec import open_step_codec
from training.protocol.step_layout import AgentColumns, StepLayout, WireError
from training.tls.config import TLSConfig

ALL = "__all__"
STEP = "UpdateState(step)"


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
        self.layout = StepLayout(self.single_observation_spaces, self.single_action_spaces)
        self.codec = open_step_codec(self.layout)
        # Per environment (row) and agent (column, sorted ids) this episode: seen, and
        # seen end; and whether the game answers the next step with a restart (NEXT_STEP).
        n, agents = self.num_envs, len(self.possible_agents)
        self._seen = np.zeros((n, agents), np.bool_)
        self._done = np.zeros((n, agents), np.bool_)
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
            self._seen[i] = [aid in obs for aid in self.possible_agents]
        self._done[:] = False
        self._restarting[:] = False
        return observations, infos

    def step(self, actions: Sequence[Mapping[str, Any]]) -> tuple[list, list, list, list, list]:
        n = self.num_envs
        if len(actions) != n:
            raise ValueError(f"{len(actions)} action dicts for {n} environments")
        request = self.codec.encode(n, self.layout.gather(actions))
        return self.decode_step(self.client.update_bytes(request, STEP))

    def close_extras(self, **kwargs: Any) -> None:
        self.client.close()

    # ------------------------------------------------------------------ decoding

    def decode_step(self, data: bytes) -> tuple[list, list, list, list, list]:
        """The step reply's bytes as RLlib's five per-environment lists (validated)."""
        try:
            num_envs, columns = self.codec.decode(data)
        except WireError as exc:
            raise UEProtocolError(self.endpoint, STEP, str(exc)) from None
        n = self.num_envs
        if num_envs != n:
            raise UEProtocolError(
                self.endpoint, STEP, f"reply has {num_envs} environments, expected {n}"
            )
        # Episode bookkeeping for all environments at once: which agents each has seen
        # and seen end this episode, and which restart on this step (NEXT_STEP autoreset).
        restarting = self._restarting
        present = np.zeros((n, len(self.possible_agents)), np.bool_)
        ended = np.zeros_like(present)
        cut = np.zeros_like(present)
        for k, col in enumerate(columns):
            present[col.env, k] = True
            ended[col.env, k] = col.terminated | col.truncated
            cut[col.env, k] = col.truncated
        fresh = restarting[:, None]
        seen = np.where(fresh, present, self._seen | present)
        done = np.where(fresh, False, self._done | ended)
        finished = ~restarting & seen.any(1) & ~(seen & ~done).any(1)
        term_all = (finished & ~cut.any(1)).tolist()
        trunc_all = (finished & cut.any(1)).tolist()
        self._seen, self._done, self._restarting = seen, done, finished

        if len(columns) == 1 and len(columns[0].env) == n:
            return self._one_agent_everywhere(columns[0], restarting, term_all, trunc_all)
        observations: list[dict[str, Any]] = [{} for _ in range(n)]
        rewards: list[dict[str, float]] = [{} for _ in range(n)]
        terminateds: list[dict[str, bool]] = [{} for _ in range(n)]
        truncateds: list[dict[str, bool]] = [{} for _ in range(n)]
        infos: list[dict[str, dict[str, str]]] = [{} for _ in range(n)]
        for k, col in enumerate(columns):
            rows = len(col.env)
            if not rows:
                continue
            aid = self.possible_agents[k]
            obs = self._rows(k, col, rows)
            # NEXT_STEP: a restarting environment answers its reset observation,
            # with reward 0 and nothing done.
            again = restarting[col.env]
            reward = np.where(again, 0.0, col.reward).tolist()
            term = (col.terminated & ~again).tolist()
            trunc = (col.truncated & ~again).tolist()
            info_at = dict(col.infos)
            for row, i in enumerate(col.env.tolist()):
                observations[i][aid] = obs[row]
                rewards[i][aid] = reward[row]
                terminateds[i][aid] = term[row]
                truncateds[i][aid] = trunc[row]
                infos[i][aid] = info_at.get(row, {})
        for i in range(n):
            terminateds[i][ALL] = term_all[i]
            truncateds[i][ALL] = trunc_all[i]
        return observations, rewards, terminateds, truncateds, infos

    def _one_agent_everywhere(
        self, col: AgentColumns, restarting: np.ndarray, term_all: list, trunc_all: list
    ) -> tuple[list, list, list, list, list]:
        """The common case (one agent, in every environment) without per-row indexing."""
        n = self.num_envs
        (aid,) = self.possible_agents
        obs = self._rows(0, col, n)
        reward, term, trunc = col.reward, col.terminated, col.truncated
        if restarting.any():
            reward = np.where(restarting, 0.0, reward)
            term, trunc = term & ~restarting, trunc & ~restarting
        infos: list[dict[str, dict[str, str]]] = [{aid: {}} for _ in range(n)]
        for row, info in col.infos:
            infos[row][aid] = info
        return (
            [{aid: o} for o in obs],
            [{aid: r} for r in reward.tolist()],
            [{aid: t, ALL: a} for t, a in zip(term.tolist(), term_all, strict=True)],
            [{aid: t, ALL: a} for t, a in zip(trunc.tolist(), trunc_all, strict=True)],
            infos,
        )

    def _rows(self, k: int, col: AgentColumns, rows: int) -> list[Any]:
        batch = self.layout.observations(k, col.leaves, rows)
        return codec.batch_rows(self.layout.observation_spaces[k], batch, rows)

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
