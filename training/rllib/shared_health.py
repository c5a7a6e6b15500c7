"""Every env runner's game state where the other runners can read it: Ray's GCS store.

Runners share nothing else, yet one decision needs all of them: whether *every*
game has been down past the limit (then sampling must end the iteration instead
of spinning, see `UEEnvRunner.sample`). Each runner writes its own key when its
game goes down or comes back; reads are one small GCS call per runner, made only
while the reader's own game is down. Which runners count comes from the run's
`RunnerRegistry` once a rescale changed them, else 1..num_runners.
"""

from __future__ import annotations

import json
import time

from ray.experimental import internal_kv

from training.rllib.runner_registry import NAMESPACE, RunnerRegistry


class SharedGameHealth:
    def __init__(self, num_runners: int, run_id: str) -> None:
        self.num_runners = num_runners
        self.run_id = run_id
        self.registry = RunnerRegistry(run_id)

    def _key(self, runner_index: int) -> str:
        return f"{self.run_id}/runner/{runner_index}"

    def publish(self, runner_index: int, down_since: float | None) -> None:
        value = json.dumps({"down_since": down_since}).encode()
        internal_kv._internal_kv_put(self._key(runner_index), value, namespace=NAMESPACE)

    def runner_indices(self) -> list[int]:
        members = self.registry.members()
        return members if members is not None else list(range(1, self.num_runners + 1))

    def every_game_down_for(self, limit_s: float, *, now: float | None = None) -> bool:
        """True when every runner has reported its game down for at least `limit_s`."""
        now = time.time() if now is None else now
        for index in self.runner_indices():
            raw = internal_kv._internal_kv_get(self._key(index), namespace=NAMESPACE)
            if raw is None:
                return False  # never reported: its game has not failed
            down_since = json.loads(raw)["down_since"]
            if down_since is None or now - down_since < limit_s:
                return False
        return True
