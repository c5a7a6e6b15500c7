"""Sumo: a two-player zero-sum game where each agent's action moves the other.

Two wrestlers on a ring [-1, 1], player_0 starting at -0.5 facing right, player_1 at
+0.5 facing left. Each step each one steps back, stays, steps forward (0.1) or dodges.
When they meet they push: the pair moves by the margin of the stronger push, so the one
who pushes while the other does not gains a full step. A dodge answers a push: a wrestler who
charges an opponent it already touches while that one dodges falls (and loses); a
dodger who is not charged is off balance and gives a step. So every fixed habit has an
answer (charge beats standing, dodging beats charging, standing beats dodging) and no
pure strategy holds a draw. Leaving the ring loses (+1 to the winner, -1 to the loser);
after 80 steps it is a draw (0 each). Both see the same egocentric frame
(own position, opponent's position along their own forward axis, time left), so one
policy can play either side (self-play, `--policies shared`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from training.mock_ue.joint import JointGame, Result

PLAYERS = ("player_0", "player_1")
STEP = 0.1
CONTACT = 0.2  # the wrestlers' distance when they touch
BACK, STAY, FORWARD, DODGE = range(4)
MAX_STEPS = 80


class Sumo(JointGame):
    agent_ids = PLAYERS
    observation_space = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(4)  # 0 back, 1 stay, 2 forward, 3 dodge

    def __init__(self) -> None:
        self.positions = [-0.5, 0.5]
        self.steps = 0
        self.rng = np.random.default_rng()

    def reset(self, seed: int | None) -> dict[str, Any]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        jitter = self.rng.uniform(-0.1, 0.1)
        self.positions = [-0.5 + jitter, 0.5 + jitter]
        self.steps = 0
        return self._observations()

    def step(self, actions: dict[str, Any]) -> dict[str, Result]:
        left, right = self.positions
        moves = [int(actions[aid]) for aid in PLAYERS]
        touching = right - left <= CONTACT + 1e-6
        if touching and DODGE in moves and FORWARD in moves:
            # The charger leant on someone who was no longer there: it falls.
            score = 1.0 if moves[0] == DODGE else -1.0
            return self._end(score)
        steps = [(m - 1) * STEP if m != DODGE else 0.0 for m in moves]
        if touching:  # an uncharged dodger is off balance and gives a step
            steps = [
                -STEP if m == DODGE and other != DODGE else s
                for m, other, s in zip(moves, moves[::-1], steps, strict=True)
            ]
        middle = (left + right) / 2
        left, right = left + steps[0], right - steps[1]
        if CONTACT - (right - left) > 1e-9:
            # They push against each other: the pair moves by the stronger push's margin.
            middle += steps[0] - steps[1]
            left, right = middle - CONTACT / 2, middle + CONTACT / 2
        self.positions = [left, right]
        self.steps += 1
        out_left, out_right = left < -1.0, right > 1.0
        if out_left or out_right:
            return self._end(0.0 if out_left and out_right else (1.0 if out_right else -1.0))
        observations = self._observations()
        truncated = self.steps >= MAX_STEPS
        return {aid: (observations[aid], 0.0, False, truncated) for aid in PLAYERS}

    def _end(self, score: float) -> dict[str, Result]:
        """The bout is over: +score to player_0, -score to player_1."""
        observations = self._observations()
        return {
            PLAYERS[0]: (observations[PLAYERS[0]], score, True, False),
            PLAYERS[1]: (observations[PLAYERS[1]], -score, True, False),
        }

    def _observations(self) -> dict[str, Any]:
        left, right = self.positions
        left_time = 1.0 - self.steps / MAX_STEPS
        return {
            PLAYERS[0]: np.array([left, right, left_time], np.float32),
            PLAYERS[1]: np.array([-right, -left, left_time], np.float32),
        }
