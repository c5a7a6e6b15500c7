"""The driver's side of self-play: snapshots taken on the algorithm, opponents pushed to
the env runners, the learner rated after every iteration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from training.policies.outcomes import outcomes_from_result
from training.policies.self_play import LEARNER, League
from training.rllib.runner_registry import RunnerRegistry

Log = Callable[[str], None]


class LeagueDriver:
    def __init__(self, algo: Any, league: League, log: Log) -> None:
        self.algo = algo
        self.league = league
        self.log = log
        self.registry = RunnerRegistry.of_this_job()

    def start(self, iteration: int) -> None:
        """A new league's first snapshot is the untrained learner; a resumed one's
        snapshots came back with the checkpoint's modules."""
        if not self.league.slots:
            self.snapshot(iteration)
        else:
            self._push_opponents()

    def after_iteration(self, iteration: int, result: dict[str, Any]) -> float:
        """Rate the learner on this iteration's games; snapshot when due. Its rating."""
        self.league.record(outcomes_from_result(result))
        if self.league.due(iteration):
            self.snapshot(iteration)
        return self.league.rating

    def snapshot(self, iteration: int) -> None:
        slot = self.league.next_slot()

        def copy(learner: Any) -> None:
            learner.module[slot].set_state(learner.module[LEARNER].get_state())

        self.algo.learner_group.foreach_learner(copy)
        # The env runners act with the snapshot from now on (inference weights only).
        self.algo.env_runner_group.sync_weights(
            from_worker_or_learner_group=self.algo.learner_group,
            policies=[slot],
            inference_only=True,
        )
        snapshot = self.league.took(slot, iteration)
        self._push_opponents()
        self.log(
            f"self-play: snapshot {snapshot.number} of the learner at iteration {iteration} "
            f"(elo {snapshot.rating:.0f}) in {slot}; opponents from {len(self.league.slots)} "
            f"snapshot(s)"
        )

    def _push_opponents(self) -> None:
        opponents = list(self.league.opponents())
        self.registry.set_opponents(opponents)  # for runners started or restarted later
        self.algo.env_runner_group.foreach_env_runner(
            func=lambda env_runner: env_runner.follow_opponents(opponents),
            local_env_runner=False,
        )
