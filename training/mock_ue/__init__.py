"""A mock Schola game: GymService over gymnasium envs, for tests, benchmarks, dev clusters."""

from training.mock_ue.scenarios import (
    RELAY,
    SCENARIOS,
    SUMO,
    TWO_TEAMS,
    AgentSlot,
    Scenario,
    scenario_for,
)
from training.mock_ue.server import MockStats, MockUEServer

__all__ = [
    "RELAY",
    "SCENARIOS",
    "SUMO",
    "TWO_TEAMS",
    "AgentSlot",
    "MockStats",
    "MockUEServer",
    "Scenario",
    "scenario_for",
]
