"""Each finished self-play episode's result for the learner, logged per opponent.

Runs in the env runners (an RLlib callback); the driver reads the per-iteration sums
from the training result (`outcomes_from_result`) to rate the learner.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from training.policies.self_play import LEARNER, Outcomes

# Where the counts go in the training result: env_runners/uerl_league/<opponent>/<kind>.
RESULT_KEY = "uerl_league"
KINDS = ("wins", "draws", "losses")


def learner_result(returns: dict[str, float], modules: dict[str, str]) -> tuple[str, str] | None:
    """(opponent module, "wins"|"draws"|"losses") of one episode, or None when the learner
    played only itself (such games say nothing about its strength)."""
    mine = sum(r for aid, r in returns.items() if modules[aid] == LEARNER)
    others = {aid: r for aid, r in returns.items() if modules[aid] != LEARNER}
    if not others or len(others) == len(returns):
        return None
    opponent = modules[sorted(others)[0]]
    theirs = sum(others.values())
    kind = "wins" if mine > theirs else ("losses" if mine < theirs else "draws")
    return opponent, kind


class SelfPlayOutcomes(RLlibCallback):
    def on_episode_end(
        self,
        *,
        episode: Any,
        prev_episode_chunks: list[Any] | None = None,
        metrics_logger: Any = None,
        **kwargs: Any,
    ) -> None:
        chunks = [*(prev_episode_chunks or []), episode]
        returns: dict[str, float] = {}
        for chunk in chunks:
            for aid, agent_episode in chunk.agent_episodes.items():
                returns[str(aid)] = returns.get(str(aid), 0.0) + agent_episode.get_return()
        modules = {aid: episode.module_for(aid) for aid in returns}
        result = learner_result(returns, modules)
        if result is None or metrics_logger is None:
            return
        opponent, kind = result
        for each in KINDS:
            # Per iteration ("sum" resets at every reduce): the driver rates each batch once.
            metrics_logger.log_value((RESULT_KEY, opponent, each), int(each == kind), reduce="sum")


def outcomes_from_result(result: dict[str, Any]) -> dict[str, Outcomes]:
    """This iteration's results per opponent, from `algo.train()`'s result."""
    league = result.get("env_runners", {}).get(RESULT_KEY, {})
    return {
        opponent: Outcomes(**{kind: _count(counts.get(kind)) for kind in KINDS})
        for opponent, counts in league.items()
    }


def _count(value: Any) -> int:
    # An opponent not met this iteration reads as NaN (an empty sum), not 0.
    return 0 if value is None or value != value else int(value)
