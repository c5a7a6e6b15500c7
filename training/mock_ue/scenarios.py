"""What a mock game hosts: one or more agents per environment, each backed by a gymnasium env.

A scenario lists agent slots (agent id, agent type, gymnasium id). Every one of the
game's N environments holds one gymnasium env per slot; an environment is done when
all its agents are done. Single-agent scenarios are any gymnasium id; the
multi-agent one mixes two agent types with different spaces (and two agents
sharing one type, as policy sharing in Schola works by agent type). A joint scenario
(`SUMO`, competitive; `RELAY`, cooperative) is one game whose agents act on each
other (`training.mock_ue.joint`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym

from training.mock_ue import relay
from training.mock_ue.joint import JointGame, JointSeat
from training.mock_ue.relay import Relay
from training.mock_ue.sumo import PLAYERS, Sumo

TWO_TEAMS = "uerl/TwoTeams-v0"
SUMO = "uerl/Sumo-v0"
RELAY = "uerl/Relay-v0"


@dataclass(frozen=True)
class AgentSlot:
    agent_id: str
    agent_type: str
    gym_id: str


@dataclass(frozen=True)
class Scenario:
    name: str
    slots: tuple[AgentSlot, ...]
    # A joint game (agents interact): a factory of one game per environment.
    joint: Callable[[], JointGame] | None = None

    def make(self, slot: AgentSlot) -> gym.Env:
        # The passive checker only warns and costs time per step; the mock is for speed.
        return gym.make(slot.gym_id, disable_env_checker=True)

    def make_environment(self) -> tuple[dict[str, gym.Env], JointSeat | None]:
        """Every agent's env for one environment, and its joint game's seat if any."""
        if self.joint is None:
            return {s.agent_id: self.make(s) for s in self.slots}, None
        seat = JointSeat(self.joint())
        return seat.views(), seat


SCENARIOS: dict[str, Scenario] = {
    "CartPole-v1": Scenario("CartPole-v1", (AgentSlot("agent_0", "cartpole", "CartPole-v1"),)),
    "Pendulum-v1": Scenario("Pendulum-v1", (AgentSlot("agent_0", "pendulum", "Pendulum-v1"),)),
    SUMO: Scenario(
        SUMO,
        tuple(AgentSlot(aid, "sumo", SUMO) for aid in PLAYERS),
        joint=Sumo,
    ),
    RELAY: Scenario(
        RELAY,
        tuple(AgentSlot(aid, aid, RELAY) for aid in relay.PLAYERS),
        joint=Relay,
    ),
    TWO_TEAMS: Scenario(
        TWO_TEAMS,
        (
            AgentSlot("cart_0", "cart", "CartPole-v1"),
            AgentSlot("cart_1", "cart", "CartPole-v1"),
            AgentSlot("pendulum_0", "pendulum", "Pendulum-v1"),
        ),
    ),
}


def scenario_for(env_id: str) -> Scenario:
    """A named scenario, or any registered gymnasium id as a single agent."""
    if env_id in SCENARIOS:
        return SCENARIOS[env_id]
    if env_id not in gym.registry:
        known = ", ".join(SCENARIOS)
        raise ValueError(f"unknown env {env_id!r}: use one of {known} or a gymnasium id")
    agent_type = env_id.split("/")[-1].split("-")[0].lower()
    return Scenario(env_id, (AgentSlot("agent_0", agent_type, env_id),))
