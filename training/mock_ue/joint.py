"""Games whose agents interact: one joint game per environment, a gym-like view per agent.

The mock session steps agents one by one (`env.step(action)` per agent and environment).
A joint game needs every agent's action before it can move, so the session first
`submit`s all actions of an environment to its joint game, which steps once; each
agent's view then hands out that agent's part of the result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gymnasium as gym

Result = tuple[Any, float, bool, bool]  # observation, reward, terminated, truncated


class JointGame(ABC):
    """A parallel multi-agent game (PettingZoo's parallel API, reduced)."""

    agent_ids: tuple[str, ...]
    observation_space: gym.Space
    action_space: gym.Space

    @abstractmethod
    def reset(self, seed: int | None) -> dict[str, Any]:
        """First observations, by agent."""

    @abstractmethod
    def step(self, actions: dict[str, Any]) -> dict[str, Result]:
        """One step with every agent's action; every agent's result."""


class AgentView(gym.Env):
    """One agent's seat at a joint game, with the per-agent env interface the session uses."""

    def __init__(self, game: JointGame, agent_id: str, seat: JointSeat) -> None:
        self.game = game
        self.agent_id = agent_id
        self.seat = seat
        self.observation_space = game.observation_space
        self.action_space = game.action_space

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        return self.seat.first_observation(self.agent_id, seed), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated = self.seat.result(self.agent_id)
        return obs, reward, terminated, truncated, {}


class JointSeat:
    """The joint game of one environment as its agents' views share it."""

    def __init__(self, game: JointGame) -> None:
        self.game = game
        self._first: dict[str, Any] | None = None
        self._results: dict[str, Result] = {}

    def views(self) -> dict[str, AgentView]:
        return {aid: AgentView(self.game, aid, self) for aid in self.game.agent_ids}

    def first_observation(self, agent_id: str, seed: int | None) -> Any:
        # The first agent to reset resets the game; the others read the same start.
        if self._first is None:
            self._first = self.game.reset(seed)
        return self._first[agent_id]

    def submit(self, actions: dict[str, Any]) -> None:
        self._first = None
        self._results = self.game.step(actions)

    def result(self, agent_id: str) -> Result:
        return self._results[agent_id]
