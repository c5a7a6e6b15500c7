"""A policy that acts uniformly at random: the baseline opponent of `uerl eval --opponent
random`. Never trained; has no weights."""

from __future__ import annotations

from typing import Any

import tree
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module import RLModule
from ray.rllib.utils.spaces.space_utils import batch as batch_of


class RandomModule(RLModule):
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        size = len(tree.flatten(batch[Columns.OBS])[0])
        return {Columns.ACTIONS: batch_of([self.action_space.sample() for _ in range(size)])}

    def _forward_train(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError("the random opponent is never trained")

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        pass

    def compile(self, *args: Any, **kwargs: Any) -> None:
        pass
