"""`uerl eval --opponent`: whom a self-play checkpoint's learner plays in an evaluation.

`random` (uniform random actions), `snapshot:N` (a snapshot the checkpoint holds) or a
checkpoint path (that run's learner). Each episode the learner takes one seat (drawn
per episode) and the opponent the others; the report counts the learner's wins. A
snapshot or checkpoint opponent samples its actions, as opponents do in the league
(`training.policies.sampled_module`), unless asked to play deterministically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.policies.self_play import LEARNER, League, Outcomes, SelfPlayMapping

# The module an outside opponent (random, another checkpoint) plays as.
OPPONENT = "opponent"


class OpponentError(ValueError):
    """The opponent cannot be played; the message names it."""


@dataclass(frozen=True)
class Opponent:
    label: str
    module_id: str
    random: bool = False
    state: dict[str, Any] | None = None  # weights of a checkpoint's learner


def resolve_opponent(text: str, league: League | None, checkpoint: Path) -> Opponent:
    from training.run import checkpoints

    if league is None:
        raise OpponentError(
            f"--opponent {text}: {checkpoint} was not trained with --policies self_play"
        )
    if text == "random":
        return Opponent("random", OPPONENT, random=True)
    if text.startswith("snapshot:"):
        number = text.removeprefix("snapshot:")
        slot = league.slot_of(int(number)) if number.isdigit() else None
        if slot is None:
            held = sorted(snap.number for snap in league.slots.values())
            raise OpponentError(f"--opponent {text}: {checkpoint} holds snapshots {held}")
        return Opponent(f"snapshot {number}", slot)
    try:
        other = checkpoints.resolve_checkpoint(Path(text), flag="--opponent")
    except checkpoints.CheckpointError as exc:
        raise OpponentError(
            f"--opponent {text}: not random, snapshot:N or a checkpoint ({exc})"
        ) from None
    modules = checkpoints.load_modules(other)
    if LEARNER not in modules:
        raise OpponentError(
            f"--opponent {text}: {other} has no self-play learner (policies "
            f"{sorted(modules.keys())})"
        )
    return Opponent(
        f"checkpoint {other}", OPPONENT, state=modules[LEARNER].get_state(inference_only=True)
    )


def with_opponent(
    config: Any, agents: list[str], opponent: Opponent, *, sampled: bool = True
) -> Any:
    """`config` (a self-play algorithm config) with the learner playing `opponent`, which
    samples its actions unless `sampled` is False (random always is random)."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from training.policies.random_module import RandomModule
    from training.policies.sampled_module import SampledPPOModule

    specs = dict(config.rl_module_spec.rl_module_specs)
    learner = specs[LEARNER]
    playing = RandomModule if opponent.random else (SampledPPOModule if sampled else None)
    specs[opponent.module_id] = RLModuleSpec(
        module_class=playing,
        observation_space=learner.observation_space,
        action_space=learner.action_space,
    )
    return config.multi_agent(
        policies=set(specs),
        policy_mapping_fn=SelfPlayMapping(tuple(sorted(agents)), (opponent.module_id,), 0.0),
        policies_to_train=[LEARNER],
    ).rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))


def learner_outcomes(summaries: list[dict[str, tuple[float, int]]], opponent: str) -> Outcomes:
    """Per episode (module -> (return, length)): the learner's result against `opponent`."""
    outcomes = Outcomes()
    for summary in summaries:
        if LEARNER not in summary or opponent not in summary:
            continue
        mine, theirs = summary[LEARNER][0], summary[opponent][0]
        if mine > theirs:
            outcomes.wins += 1
        elif mine < theirs:
            outcomes.losses += 1
        else:
            outcomes.draws += 1
    return outcomes
