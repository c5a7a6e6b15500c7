"""The competitive mock game: two players whose actions move each other, zero-sum, served
over the Schola protocol like any game."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from training.mock_ue import SUMO, MockUEServer
from training.mock_ue.sumo import MAX_STEPS, PLAYERS, Sumo
from training.rllib.vector_env import UEVectorEnv

BACK, STAY, FORWARD = 0, 1, 2


def play(game: Sumo, left: int, right: int) -> tuple[dict, int]:
    """Both players repeat one action until the game ends; (last results, steps)."""
    game.reset(seed=0)
    for steps in range(1, MAX_STEPS + 1):
        results = game.step({PLAYERS[0]: left, PLAYERS[1]: right})
        if any(term or trunc for _, _, term, trunc in results.values()):
            return results, steps
    raise AssertionError("the game did not end")


def test_pushing_a_player_who_stands_still_wins() -> None:
    results, steps = play(Sumo(), FORWARD, STAY)
    assert results[PLAYERS[0]][1:3] == (1.0, True) and results[PLAYERS[1]][1:3] == (-1.0, True)
    assert steps < MAX_STEPS


def test_the_game_is_symmetric() -> None:
    results, _ = play(Sumo(), STAY, FORWARD)
    assert results[PLAYERS[1]][1] == 1.0 and results[PLAYERS[0]][1] == -1.0


def test_two_equal_pushes_hold_until_the_time_is_up_a_draw() -> None:
    results, steps = play(Sumo(), FORWARD, FORWARD)
    assert steps == MAX_STEPS
    assert all(r == 0.0 and trunc for _, r, _, trunc in results.values())


def test_stepping_back_out_of_the_ring_loses() -> None:
    results, _ = play(Sumo(), BACK, STAY)
    assert results[PLAYERS[0]][1] == -1.0


def test_rewards_always_sum_to_zero_and_each_player_sees_its_own_frame() -> None:
    game, rng = Sumo(), np.random.default_rng(1)
    first = game.reset(seed=3)
    # Mirror images: each sees itself first, positions along its own forward axis.
    (me_0, them_0, _), (me_1, them_1, _) = first[PLAYERS[0]], first[PLAYERS[1]]
    assert (me_1, them_1) == (-them_0, -me_0)
    for _ in range(500):
        results = game.step({aid: int(rng.integers(3)) for aid in PLAYERS})
        assert sum(r for _, r, _, _ in results.values()) == 0.0
        if any(term or trunc for _, _, term, trunc in results.values()):
            game.reset(seed=None)


def test_over_the_protocol_one_players_action_moves_the_other(
    mock_ue: Callable[..., MockUEServer],
) -> None:
    server = mock_ue(SUMO, num_envs=2)
    env = UEVectorEnv(server.address, startup_timeout_s=5, request_timeout_s=5)
    try:
        assert sorted(env.game.agents) == list(PLAYERS)
        observations, _ = env.reset(seed=0)
        before = [obs[PLAYERS[1]][0] for obs in observations]
        # player_0 pushes, player_1 stands: player_1 is moved back (its own frame: its
        # position along its forward axis falls) once they touch, after 8 steps.
        for _ in range(12):
            observations, *_ = env.step([{PLAYERS[0]: FORWARD, PLAYERS[1]: STAY}] * 2)
        after = [obs[PLAYERS[1]][0] for obs in observations]
        assert all(a < b for a, b in zip(after, before, strict=True)), (before, after)
    finally:
        env.close()
