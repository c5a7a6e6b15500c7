"""Relay: a two-player cooperative game with one shared reward (a speaker-listener task).

A `spotter` sees which of three beacons (at -0.6, 0, +0.6) is lit but cannot move; a
`runner` moves along [-1, 1] but cannot see the beacons. Each step the spotter calls
one of three words, which the runner hears on the next step, and the runner steps left,
stays or steps right (0.1). Both get the same reward, minus the runner's distance to
the lit beacon, for 20 steps. Neither can do well alone: the spotter's reward depends
on where the runner is, which it never sees, and the runner depends on a word whose
meaning the two must agree on. A critic that sees both (`--policies ctde`) knows the
value of a state neither agent sees whole.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from training.mock_ue.joint import JointGame, Result

SPOTTER, RUNNER = "spotter", "runner"
PLAYERS = (SPOTTER, RUNNER)
BEACONS = (-0.6, 0.0, 0.6)
STEP = 0.1
MAX_STEPS = 20


class Relay(JointGame):
    agent_ids = PLAYERS
    # spotter: lit beacon one-hot, time left; runner: position, last word heard one-hot.
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(3)  # spotter: a word; runner: left, stay, right

    def __init__(self) -> None:
        self.rng = np.random.default_rng()
        self.beacon = 0
        self.position = 0.0
        self.word: int | None = None
        self.steps = 0

    def reset(self, seed: int | None) -> dict[str, Any]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.beacon = int(self.rng.integers(len(BEACONS)))
        self.position = float(self.rng.uniform(-0.2, 0.2))
        self.word = None
        self.steps = 0
        return self._observations()

    def step(self, actions: dict[str, Any]) -> dict[str, Result]:
        self.position = float(np.clip(self.position + (int(actions[RUNNER]) - 1) * STEP, -1, 1))
        self.word = int(actions[SPOTTER])
        self.steps += 1
        reward = -abs(self.position - BEACONS[self.beacon])
        truncated = self.steps >= MAX_STEPS
        observations = self._observations()
        return {aid: (observations[aid], reward, False, truncated) for aid in PLAYERS}

    def _observations(self) -> dict[str, Any]:
        lit = np.zeros(3, np.float32)
        lit[self.beacon] = 1.0
        heard = np.zeros(3, np.float32)
        if self.word is not None:
            heard[self.word] = 1.0
        return {
            SPOTTER: np.array([*lit, 1.0 - self.steps / MAX_STEPS], np.float32),
            RUNNER: np.array([self.position, *heard], np.float32),
        }
