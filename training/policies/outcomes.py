"""Each finished self-play episode's result for the learner, logged per opponent.

Runs in the env runners (an RLlib callback); the driver reads the per-iteration sums
from the training result (`outcomes_from_result`) to rate the learner.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from training.policies.self_play import LEARNER, Outcomes, SelfPlayMapping

# Where the counts go in the training result: env_runners/uerl_league/<opponent>/<kind>.
RESULT_KEY = "uerl_league"
KINDS = ("wins", "draws", "losses")


def learner_results(
    returns: dict[str, float], modules: dict[str, str], learner_seat: str
) -> list[tuple[str, str]]:
    """(snapshot, "wins"|"draws"|"losses") of one episode for each seat a snapshot played:
    the learner's seat's return against that seat's. Seats that played the current learner
    are not rated (the learner against itself says nothing of its strength), nor is an
    episode the learner's seat did not finish."""
    if learner_seat not in returns:
        return []
    mine = returns[learner_seat]
    results = []
    for aid, theirs in sorted(returns.items()):
        if aid == learner_seat or modules[aid] == LEARNER:
            continue
        kind = "wins" if mine > theirs else ("losses" if mine < theirs else "draws")
        results.append((modules[aid], kind))
    return results


class SelfPlayOutcomes(RLlibCallback):
    def on_episode_end(
        self,
        *,
        episode: Any,
        prev_episode_chunks: list[Any] | None = None,
        env_runner: Any = None,
        metrics_logger: Any = None,
        **kwargs: Any,
    ) -> None:
        mapping = getattr(getattr(env_runner, "config", None), "policy_mapping_fn", None)
        if metrics_logger is None or not isinstance(mapping, SelfPlayMapping):
            return
        chunks = [*(prev_episode_chunks or []), episode]
        returns: dict[str, float] = {}
        for chunk in chunks:
            for aid, agent_episode in chunk.agent_episodes.items():
                returns[str(aid)] = returns.get(str(aid), 0.0) + agent_episode.get_return()
        modules = {aid: episode.module_for(aid) for aid in returns}
        counts = Counter(learner_results(returns, modules, mapping.learner_seat(episode)))
        for opponent in sorted({opponent for opponent, _ in counts}):
            for kind in KINDS:
                # Per iteration ("sum" resets at every reduce): the driver rates each batch once.
                metrics_logger.log_value(
                    (RESULT_KEY, opponent, kind), counts[(opponent, kind)], reduce="sum"
                )


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
