"""A game as a run trains it: its definition plus the policy configuration.

`GameSpec` is what travels into the algorithm, the checkpoint (`game.json`), `uerl eval`
and `uerl export`, so a policy is always run the way it was trained. What the game
itself hosts is `training.protocol.game_definition.GameDefinition`; this adds which
policy each agent acts with (by default one per agent type, as in Schola).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

import gymnasium as gym

from training.policies.configurations import DEFAULT as DEFAULT_POLICIES
from training.policies.configurations import (
    PolicyConfiguration,
    check_configuration,
    policy_mapping,
)
from training.protocol.game_definition import GameDefinition, game_definition_from_proto


@dataclass(frozen=True, eq=False)
class GameSpec(GameDefinition):
    """A game's definition and the policy configuration a run trains it with."""

    # Which policy each agent acts with (training.policies); one per agent type by default.
    policies: PolicyConfiguration = DEFAULT_POLICIES

    @classmethod
    def of(cls, game: GameDefinition, policies: str = DEFAULT_POLICIES) -> GameSpec:
        """`game` trained with `policies` (checked against its agents)."""
        base = {f.name: getattr(game, f.name) for f in fields(GameDefinition)}
        return cls(**base).with_policies(policies)

    def with_policies(self, configuration: str) -> GameSpec:
        """This game trained with another policy configuration (checked against its agents)."""
        spec = replace(self, policies=check_configuration(configuration))
        spec.policy_mapping()  # raises PolicyConfigurationError naming the agents
        return spec

    def policy_ids(self) -> list[str]:
        """The policies of this configuration, sorted."""
        return sorted(set(self.policy_mapping().values()))

    def policy_mapping(self) -> dict[str, str]:
        """Agent id -> policy id."""
        return policy_mapping(self.agents, self.policies)

    def single_agent_policy(self) -> str | None:
        """The one policy of a game with one agent per environment, which can train on
        RLlib's single-agent path; None for games with more agents."""
        return self.policy_ids()[0] if len(self.agents) == 1 else None

    def policy_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """Policy id -> (observation space, action space); agents sharing a policy agree."""
        out: dict[str, tuple[gym.Space, gym.Space]] = {}
        for aid, pid in self.policy_mapping().items():
            spec = self.agents[aid]
            out.setdefault(pid, (spec.observation_space, spec.action_space))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "policy_configuration": self.policies,
            "policies": self.policy_ids(),
            "policy_mapping": self.policy_mapping(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GameSpec:
        return cls(
            **cls.fields_from_dict(data),
            policies=check_configuration(data.get("policy_configuration", DEFAULT_POLICIES)),
        )

    @classmethod
    def from_json(cls, text: str) -> GameSpec:
        return cls.from_dict(json.loads(text))


def game_spec_from_definition(definition: Any, endpoint: str) -> GameSpec:
    """A `TrainingDefinition` message as a GameSpec with the default configuration."""
    return GameSpec.of(game_definition_from_proto(definition, endpoint))
