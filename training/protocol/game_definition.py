"""What a game hosts: its environments, their agents and the agents' spaces.

`GameDefinition` is plain data: picklable (returned from Ray tasks) and JSON
round-trippable (`uerl discover --json`). It says nothing of how a run trains the
agents: that is `training.policies.game_spec.GameSpec`, a definition plus a policy
configuration. `game_definition_from_proto` builds it from a `TrainingDefinition`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from training.protocol.errors import UEProtocolError

JSON_VERSION = 1


@dataclass(frozen=True)
class AgentSpec:
    agent_type: str
    observation_space: gym.Space
    action_space: gym.Space

    def policy_id(self, agent_id: str) -> str:
        # An agent without a type declares no sharing: it gets a policy of its own.
        return self.agent_type or agent_id


@dataclass(frozen=True)
class GameDefinition:
    """What one game instance hosts: `num_envs` identical environments of `agents`."""

    num_envs: int
    agents: dict[str, AgentSpec]
    endpoint: str = ""

    def signature(self) -> dict[str, Any]:
        """What a game instance must match to join a run: its environments and agents, not
        where it is or how the run maps its agents to policies."""
        data = self.to_dict()
        return {k: data[k] for k in ("version", "num_envs", "agents")}

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        from training.protocol.spaces import space_to_json

        return {
            "version": JSON_VERSION,
            "endpoint": self.endpoint,
            "num_envs": self.num_envs,
            "agents": {
                aid: {
                    "agent_type": spec.agent_type,
                    "observation_space": space_to_json(spec.observation_space),
                    "action_space": space_to_json(spec.action_space),
                }
                for aid, spec in sorted(self.agents.items())
            },
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @staticmethod
    def fields_from_dict(data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's arguments from `to_dict`'s output (ValueError if unsupported)."""
        from training.protocol.spaces import space_from_json

        if data.get("version") != JSON_VERSION:
            raise ValueError(f"unsupported game definition version {data.get('version')!r}")
        agents = {
            aid: AgentSpec(
                agent_type=a["agent_type"],
                observation_space=space_from_json(a["observation_space"]),
                action_space=space_from_json(a["action_space"]),
            )
            for aid, a in data["agents"].items()
        }
        return {
            "num_envs": int(data["num_envs"]),
            "agents": agents,
            "endpoint": data.get("endpoint", ""),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GameDefinition:
        return cls(**cls.fields_from_dict(data))

    @classmethod
    def from_json(cls, text: str) -> GameDefinition:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GameDefinition):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable dicts inside


def same_agents(signature: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two games' signatures define the same agents and spaces; the number of
    environments may differ (rollout sizing warns about it)."""
    return {**signature, "num_envs": 0} == {**other, "num_envs": 0}


def game_definition_from_proto(definition: Any, endpoint: str) -> GameDefinition:
    """Build a GameSpec from a `TrainingDefinition`, checking what clients rely on:
    at least one environment, every environment identical to environment 0, and
    agents of one type sharing spaces."""
    from training.protocol.spaces import CodecError, space_from_proto

    op = "RequestTrainingDefinition"
    envs = definition.environment_definitions
    if len(envs) == 0:
        raise UEProtocolError(endpoint, op, "the game defines no environments")
    first = envs[0].agent_definitions
    if len(first) == 0:
        raise UEProtocolError(endpoint, op, "environment 0 defines no agents")
    for index in range(1, len(envs)):
        other = envs[index].agent_definitions
        if set(other.keys()) != set(first.keys()):
            raise UEProtocolError(
                endpoint,
                op,
                f"environment {index} has agents {sorted(other.keys())}, environment 0 has "
                f"{sorted(first.keys())}; all environments must host the same agents",
            )
        for aid in first:
            if other[aid] != first[aid]:
                raise UEProtocolError(
                    endpoint,
                    op,
                    f"environment {index} agent {aid!r} differs from environment 0 "
                    "(spaces or agent_type); all environments must be identical",
                )
    agents: dict[str, AgentSpec] = {}
    for aid in sorted(first.keys()):
        definition_ = first[aid]
        try:
            obs = space_from_proto(definition_.obs_space, f"agent {aid!r} obs_space")
            act = space_from_proto(definition_.action_space, f"agent {aid!r} action_space")
        except CodecError as exc:
            raise UEProtocolError(endpoint, op, str(exc)) from exc
        agents[aid] = AgentSpec(definition_.agent_type, obs, act)
    # Schola's convention: agents of one type share a policy, so they must share spaces.
    first_of_type: dict[str, str] = {}
    for aid, spec in agents.items():
        type_ = spec.policy_id(aid)
        ref = agents[first_of_type.setdefault(type_, aid)]
        if spec.observation_space != ref.observation_space or spec.action_space != ref.action_space:
            raise UEProtocolError(
                endpoint,
                op,
                f"agent {aid!r} has agent_type {type_!r} but different spaces from other agents "
                "of that type; agents sharing a type share a policy and must share spaces",
            )
    return GameDefinition(num_envs=len(envs), agents=agents, endpoint=endpoint)
