"""Episode bookkeeping of N environments under NEXT_STEP autoreset, and the step reply in
RLlib's shape: five per-environment lists of agent dicts (with "__all__" in the
terminateds and truncateds).

Per environment and agent this episode: seen, and seen end. An environment is over
when every agent it has seen has ended: by termination, unless one of its agents was
truncated on that step. The next step is its restart (the game's NEXT_STEP autoreset):
reset observations, reward 0, nothing done. `PythonEpisodes` is the reference; the
compiled `uerl_native.Episodes` does the same per step without numpy round trips
(the tests run both on the same replies).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from training.protocol.step_layout import AgentColumns

ALL = "__all__"

StepReply = tuple[list, list, list, list, list]


class Episodes(Protocol):
    def reset(self, present: list[list[int]]) -> None:
        """After a reset: `present[i]` lists the agent indices environment i observed."""
        ...

    def step(self, columns: list[AgentColumns], rows: list[list[Any]]) -> list[list]: ...


class PythonEpisodes:
    def __init__(self, agents: list[str], num_envs: int) -> None:
        self.agents = agents
        self.num_envs = num_envs
        self._seen = np.zeros((num_envs, len(agents)), np.bool_)
        self._done = np.zeros_like(self._seen)
        self._restarting = np.zeros(num_envs, np.bool_)

    def reset(self, present: list[list[int]]) -> None:
        self._seen[:] = False
        self._done[:] = False
        self._restarting[:] = False
        for i, agents in enumerate(present):
            self._seen[i, agents] = True

    def step(self, columns: list[AgentColumns], rows: list[list[Any]]) -> list[list]:
        n = self.num_envs
        restarting = self._restarting
        present = np.zeros_like(self._seen)
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

        observations: list[dict[str, Any]] = [{} for _ in range(n)]
        rewards: list[dict[str, float]] = [{} for _ in range(n)]
        terminateds: list[dict[str, bool]] = [{} for _ in range(n)]
        truncateds: list[dict[str, bool]] = [{} for _ in range(n)]
        infos: list[dict[str, dict[str, str]]] = [{} for _ in range(n)]
        for k, col in enumerate(columns):
            aid, obs = self.agents[k], rows[k]
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
        return [observations, rewards, terminateds, truncateds, infos]


def open_episodes(agents: list[str], num_envs: int, choice: str | None = None) -> Episodes:
    """The compiled bookkeeping when built (and not `UERL_GAME_CLIENT=python`)."""
    from training.clients import native
    from training.clients.choice import client_choice

    choice = choice or client_choice()
    if choice == "python" or (choice == "auto" and not native.available()):
        return PythonEpisodes(agents, num_envs)
    import uerl_native

    return uerl_native.Episodes(agents, num_envs)
