"""Agent id -> policy id for each policy configuration, and the checks each needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from training.policies.self_play import LEARNER

if TYPE_CHECKING:
    from training.protocol.game_definition import AgentSpec

PolicyConfiguration = Literal["by_type", "shared", "independent", "self_play", "ctde"]
CONFIGURATIONS: tuple[str, ...] = get_args(PolicyConfiguration)
DEFAULT: PolicyConfiguration = "by_type"
# The one policy of `shared`.
SHARED_POLICY_ID = "shared"


class PolicyConfigurationError(ValueError):
    """The game's agents cannot be trained with this configuration; the message says why."""


def check_configuration(name: str) -> PolicyConfiguration:
    if name not in CONFIGURATIONS:
        raise PolicyConfigurationError(f"policies {name!r}: use one of {', '.join(CONFIGURATIONS)}")
    return name  # type: ignore[return-value]


def policy_mapping(
    agents: Mapping[str, AgentSpec], configuration: PolicyConfiguration
) -> dict[str, str]:
    """Agent id -> policy id, agents sorted.

    by_type: one policy per Schola agent type (an agent without a type gets its own);
    shared: one policy for every agent; independent: one policy per agent id; self_play:
    every agent plays the learning policy (the one exported and evaluated; during
    training opponents also play its snapshots, see `training.policies.self_play`);
    ctde: one actor per agent id, sharing one centralised critic (`training.policies.ctde`)."""
    if configuration == "shared":
        _check_one_space(agents, configuration)
        return {aid: SHARED_POLICY_ID for aid in sorted(agents)}
    if configuration == "self_play":
        _check_one_space(agents, configuration)
        if len(agents) < 2:
            raise PolicyConfigurationError(
                f"--policies self_play needs at least two agents to play each other; the "
                f"game has {sorted(agents)}"
            )
        return {aid: LEARNER for aid in sorted(agents)}
    if configuration == "ctde" and len(agents) < 2:
        raise PolicyConfigurationError(
            f"--policies ctde needs at least two agents to share a critic; the game has "
            f"{sorted(agents)}"
        )
    if configuration in ("independent", "ctde"):
        return {aid: aid for aid in sorted(agents)}
    return {aid: spec.policy_id(aid) for aid, spec in sorted(agents.items())}


def check_fits(configuration: PolicyConfiguration, *, algo: str, num_learners: int) -> None:
    """What a configuration asks of the algorithm and the learners, known from the run's
    arguments before anything starts."""
    if configuration == "ctde" and algo != "PPO":
        raise PolicyConfigurationError(
            f"--policies ctde trains with PPO (its learner builds the shared critic); "
            f"--algo {algo} is not supported with it"
        )
    if configuration == "ctde" and num_learners > 1:
        raise PolicyConfigurationError(
            f"--policies ctde trains on one learner (its actors share one critic, which "
            f"distributed data-parallel learners would each step); the topology has "
            f"{num_learners} learners: set topology.learners.replicas to 0 or 1"
        )


def _check_one_space(agents: Mapping[str, AgentSpec], configuration: str) -> None:
    from training.protocol.spaces import space_to_json

    groups: dict[str, list[str]] = {}
    described: dict[str, str] = {}
    for aid, spec in sorted(agents.items()):
        key = repr((space_to_json(spec.observation_space), space_to_json(spec.action_space)))
        groups.setdefault(key, []).append(aid)
        described[key] = f"observe {spec.observation_space} and act {spec.action_space}"
    if len(groups) > 1:
        parts = "; ".join(f"{', '.join(ids)} {described[key]}" for key, ids in groups.items())
        raise PolicyConfigurationError(
            f"--policies {configuration} needs one observation and one action space for every "
            "agent, "
            f"but the game's agents differ: {parts}. Use --policies by_type or independent."
        )


@dataclass(frozen=True)
class PolicyMapping:
    """RLlib's policy_mapping_fn: agent id -> policy id. Picklable, unlike a lambda."""

    mapping: dict[str, str]

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        try:
            return self.mapping[str(agent_id)]
        except KeyError:
            raise KeyError(
                f"agent {agent_id!r} is not in the game's definition "
                f"(known agents: {sorted(self.mapping)})"
            ) from None
