"""What a game hosts: its environments, agents, spaces and the policy layout.

`GameSpec` is plain data: picklable (returned from Ray tasks) and JSON
round-trippable (`uerl discover --json`), with the policy layout derived from its
policy configuration (`training.policies`): by default agent types (agents of one
type share a policy, as in Schola).
`game_spec_from_definition` builds it from a `TrainingDefinition` message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym

from training.policies.configurations import DEFAULT as DEFAULT_POLICIES
from training.policies.configurations import (
    PolicyConfiguration,
    check_configuration,
    policy_mapping,
)
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
class GameSpec:
    """What one game instance hosts: `num_envs` identical environments of `agents`."""

    num_envs: int
    agents: dict[str, AgentSpec]
    endpoint: str = ""
    # Which policy each agent acts with (training.policies); one per agent type by default.
    policies: PolicyConfiguration = DEFAULT_POLICIES

    def with_policies(self, configuration: str) -> GameSpec:
        """This game trained with another policy configuration (checked against its agents)."""
        spec = replace(self, policies=check_configuration(configuration))
        spec.policy_mapping()  # raises PolicyConfigurationError naming the agents
        return spec

    def signature(self) -> dict[str, Any]:
        """What a game instance must match to join a run: its environments and agents, not
        where it is or how the run maps its agents to policies."""
        data = self.to_dict()
        return {k: data[k] for k in ("version", "num_envs", "agents")}

    def policy_ids(self) -> list[str]:
        """The policies of this configuration, sorted."""
        return sorted(set(self.policy_mapping().values()))

    def policy_mapping(self) -> dict[str, str]:
        """Agent id -> policy id."""
        return policy_mapping(self.agents, self.policies)

    def policy_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """Policy id -> (observation space, action space); agents sharing a policy agree."""
        out: dict[str, tuple[gym.Space, gym.Space]] = {}
        for aid, pid in self.policy_mapping().items():
            spec = self.agents[aid]
            out.setdefault(pid, (spec.observation_space, spec.action_space))
        return out

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
            "policy_configuration": self.policies,
            "policies": self.policy_ids(),
            "policy_mapping": self.policy_mapping(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GameSpec:
        from training.protocol.spaces import space_from_json

        if data.get("version") != JSON_VERSION:
            raise ValueError(f"unsupported GameSpec version {data.get('version')!r}")
        agents = {
            aid: AgentSpec(
                agent_type=a["agent_type"],
                observation_space=space_from_json(a["observation_space"]),
                action_space=space_from_json(a["action_space"]),
            )
            for aid, a in data["agents"].items()
        }
        return cls(
            num_envs=int(data["num_envs"]),
            agents=agents,
            endpoint=data.get("endpoint", ""),
            policies=check_configuration(data.get("policy_configuration", DEFAULT_POLICIES)),
        )

    @classmethod
    def from_json(cls, text: str) -> GameSpec:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GameSpec):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable dicts inside


def same_agents(signature: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two games' signatures define the same agents and spaces; the number of
    environments may differ (rollout sizing warns about it)."""
    return {**signature, "num_envs": 0} == {**other, "num_envs": 0}


def game_spec_from_definition(definition: Any, endpoint: str) -> GameSpec:
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
    spec = GameSpec(num_envs=len(envs), agents=agents, endpoint=endpoint)
    for aid, pid in spec.policy_mapping().items():
        ref_obs, ref_act = spec.policy_spaces()[pid]
        if agents[aid].observation_space != ref_obs or agents[aid].action_space != ref_act:
            raise UEProtocolError(
                endpoint,
                op,
                f"agent {aid!r} has agent_type {pid!r} but different spaces from other agents "
                "of that type; agents sharing a type share a policy and must share spaces",
            )
    return spec
