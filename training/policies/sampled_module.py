"""An opponent that plays its policy as it played in the league: actions sampled from its
distribution, even in a deterministic evaluation (where the learner takes its best
action). An untrained snapshot's argmax is one fixed habit, not the policy it was."""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
    DefaultPPOTorchRLModule,
)
from ray.rllib.core.columns import Columns


class SampledPPOModule(DefaultPPOTorchRLModule):
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        out = self._forward(batch, **kwargs)
        dist = self.get_exploration_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        # Actions already in the output are taken as they are (RLlib's GetActions).
        out[Columns.ACTIONS] = dist.sample()
        return out
