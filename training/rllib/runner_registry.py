"""Which env runners belong to a run, which game each one serves, and the game they expect.

Kept in Ray's GCS so the driver writes it and every runner (also one Ray restarts)
reads it. RLlib numbers the runners it builds 1..N, and `EnvRunnerGroup.add_workers`
numbers new ones from the current count, which collides with live runners after a
removal. A rescaled run therefore numbers its new runners itself, never reusing a
number, and assigns each a game slot here before the runner starts. A runner with no
assignment (one RLlib built) serves the game of its own index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

NAMESPACE = "uerl"


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


class RunnerRegistry:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    @classmethod
    def of_this_job(cls) -> RunnerRegistry:
        """The registry of the Ray job this process belongs to (driver or its actors)."""
        import ray

        return cls(ray.get_runtime_context().get_job_id())

    def _put(self, key: str, value: Any) -> None:
        data = json.dumps(value).encode()
        _kv()._internal_kv_put(f"{self.run_id}/{key}", data, namespace=NAMESPACE)

    def _get(self, key: str) -> Any:
        raw = _kv()._internal_kv_get(f"{self.run_id}/{key}", namespace=NAMESPACE)
        return None if raw is None else json.loads(raw)

    # -- game slots ------------------------------------------------------------

    def assign(self, worker_index: int, slot: int) -> None:
        self._put(f"slot/{worker_index}", slot)

    def slot_of(self, worker_index: int) -> int:
        slot = self._get(f"slot/{worker_index}")
        return worker_index if slot is None else int(slot)

    # -- members ---------------------------------------------------------------

    def set_members(self, worker_indices: Iterable[int]) -> None:
        self._put("members", sorted(worker_indices))

    def members(self) -> list[int] | None:
        """The runners in the run now; None until the driver first rescaled."""
        value = self._get("members")
        return None if value is None else [int(i) for i in value]

    # -- rollout fragments -----------------------------------------------------

    def set_fragment_lengths(self, lengths: dict[int, int]) -> None:
        """Steps per environment each runner samples per call, so that the runners of
        the run add up to the train batch whatever their number (RLlib's "auto"
        divides by the runner count the algorithm was built with)."""
        self._put("fragments", {str(k): v for k, v in lengths.items()})

    def fragment_length(self, worker_index: int) -> int | None:
        value = self._get("fragments") or {}
        length = value.get(str(worker_index))
        return None if length is None else int(length)

    # -- self-play opponents ---------------------------------------------------

    def set_opponents(self, module_ids: list[str]) -> None:
        """The snapshots opponents are drawn from (training.policies.self_play)."""
        self._put("opponents", list(module_ids))

    def opponents(self) -> list[str] | None:
        value = self._get("opponents")
        return None if value is None else [str(m) for m in value]

    # -- the game every runner must find ---------------------------------------

    def set_game(self, signature: dict[str, Any]) -> None:
        self._put("game", signature)

    def game(self) -> dict[str, Any] | None:
        value = self._get("game")
        return None if value is None else dict(value)
