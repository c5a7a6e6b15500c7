"""RLlib multi-agent *vector* environment over one UE game instance hosting N environments.

One `UpdateState` RPC steps all N environments. The session uses Schola's NEXT_STEP
autoreset, which is exactly RLlib's vector-env convention: after an environment
reports done, the next step ignores its actions and answers the reset observation
(reward 0, not done). Agent ids are the game's strings; each agent's `agent_type`
is kept for policy mapping. Everything the game sends is validated, and errors
name the endpoint, environment, agent and field at fault.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.env.vector.vector_multi_agent_env import VectorMultiAgentEnv

from training.clients import native
from training.clients.choice import open_step_codec
from training.clients.game_client import GymClient
from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.errors import UEProtocolError
from training.protocol.game_definition import GameDefinition, game_definition_from_proto
from training.protocol.step_layout import AgentColumns, StepLayout, WireError
from training.protocol.transport import RESET, STEP
from training.rllib.episodes import open_episodes
from training.tls.config import TLSConfig

# Step times a runner that never drains them keeps (a bench, a test): the newest.
STEP_TIMES_KEPT = 4096


class UESubEnv(MultiAgentEnv):
    """Environment `index` of a game as RLlib sees it: agents and spaces only.

    RLlib's runner reads sub-env spaces through `env.envs[i]`; stepping goes through
    the vector env so that all environments share one RPC.
    """

    def __init__(self, game: GameDefinition, index: int) -> None:
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
        client: str | None = None,
    ) -> None:
        """`client`: "native", "python" or "auto"; None: the `UERL_GAME_CLIENT` setting."""
        self.endpoint = endpoint
        self.closed = False
        self.client = GymClient(
            endpoint,
            startup_timeout_s=startup_timeout_s,
            request_timeout_s=request_timeout_s,
            tls=tls,
            transport=client,
        )
        try:
            self.client.connect(pb.NEXT_STEP)
            self.game = game_definition_from_proto(self.client.training_definition(), endpoint)
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
        self.codec = open_step_codec(self.layout, client)
        self.episodes = open_episodes(self.possible_agents, self.num_envs, client)
        # Each step's time until the env runner drains them; bounded if none does.
        self.step_seconds: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        # Everything compiled: one call per step (see training/clients/native_vector_step.py).
        self._fast_step = None
        if native.available():
            from training.clients.native_vector_step import NativeVectorStep

            if NativeVectorStep.fits(self.client, self.codec, self.episodes):
                self._fast_step = NativeVectorStep(
                    self.client, self.codec, self.episodes, self.num_envs, self._rows_of
                )

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
        op = RESET
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
        agents = self.possible_agents
        self.episodes.reset([[k for k, a in enumerate(agents) if a in obs] for obs in observations])
        return observations, infos

    def step(self, actions: Sequence[Mapping[str, Any]]) -> tuple[list, list, list, list, list]:
        n = self.num_envs
        if len(actions) != n:
            raise ValueError(f"{len(actions)} action dicts for {n} environments")
        started = time.perf_counter()
        if self._fast_step is not None:
            reply = self._fast_step(actions)
            if reply is not None:
                self.step_seconds.append(time.perf_counter() - started)
                observations, rewards, terminateds, truncateds, infos = reply
                return observations, rewards, terminateds, truncateds, infos
        request = self.codec.encode(n, self.layout.gather(actions))
        reply_bytes = self.client.update_bytes(request, STEP)
        self.step_seconds.append(time.perf_counter() - started)
        return self.decode_step(reply_bytes)

    def drain_step_seconds(self) -> list[float]:
        """Each step RPC's time (encode, round trip, decode where compiled) since the last
        call; the env runner publishes them (training.telemetry)."""
        out = list(self.step_seconds)
        self.step_seconds.clear()
        return out

    def close_extras(self, **kwargs: Any) -> None:
        self.client.close()

    # ------------------------------------------------------------------ decoding

    def decode_step(self, data: bytes) -> tuple[list, list, list, list, list]:
        """The step reply's bytes as RLlib's five per-environment lists (validated)."""
        columns = self.decode_columns(data)
        rows = [self._rows(k, col, len(col.env)) for k, col in enumerate(columns)]
        observations, rewards, terminateds, truncateds, infos = self.episodes.step(columns, rows)
        return observations, rewards, terminateds, truncateds, infos

    def decode_columns(self, data: bytes) -> list[AgentColumns]:
        """The step reply's bytes as one column batch per agent, checked: the wire format,
        and one row set for each of this game's environments."""
        try:
            num_envs, columns = self.codec.decode(data)
        except WireError as exc:
            raise UEProtocolError(self.endpoint, STEP, str(exc)) from None
        if num_envs != self.num_envs:
            raise UEProtocolError(
                self.endpoint, STEP, f"reply has {num_envs} environments, expected {self.num_envs}"
            )
        return columns

    def _rows(self, k: int, col: AgentColumns, rows: int) -> list[Any]:
        return self._rows_of(k, col.leaves, rows)

    def _rows_of(self, k: int, leaves: list[np.ndarray], rows: int) -> list[Any]:
        batch = self.layout.observations(k, leaves, rows)
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
