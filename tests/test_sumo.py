"""The competitive mock game: two players whose actions move each other, zero-sum, served
over the Schola protocol like any game."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from training.mock_ue import SUMO, MockUEServer
from training.mock_ue.sumo import BACK, CONTACT, DODGE, FORWARD, MAX_STEPS, PLAYERS, STAY, Sumo
from training.rllib.vector_env import UEVectorEnv


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


def touch(game: Sumo) -> None:
    """Walk both players into contact."""
    game.reset(seed=0)
    while game.positions[1] - game.positions[0] > CONTACT + 1e-6:
        game.step({PLAYERS[0]: FORWARD, PLAYERS[1]: FORWARD})


def test_dodging_a_charger_already_in_contact_throws_it() -> None:
    game = Sumo()
    touch(game)
    results = game.step({PLAYERS[0]: FORWARD, PLAYERS[1]: DODGE})
    assert results[PLAYERS[1]][1:3] == (1.0, True) and results[PLAYERS[0]][1] == -1.0


def test_charging_into_contact_is_not_thrown_by_a_dodge() -> None:
    game = Sumo()
    game.reset(seed=0)
    results = game.step({PLAYERS[0]: FORWARD, PLAYERS[1]: DODGE})
    assert not any(term for _, _, term, _ in results.values())


def test_a_dodger_who_is_not_charged_gives_a_step() -> None:
    game = Sumo()
    touch(game)
    right_before = game.positions[1]
    game.step({PLAYERS[0]: STAY, PLAYERS[1]: DODGE})
    assert game.positions[1] > right_before


def answer(game: Sumo, habit: int) -> int:
    """player_0's reply to a player_1 who always does `habit`."""
    if game.positions[1] - game.positions[0] > CONTACT + 1e-6:
        return FORWARD
    return {FORWARD: DODGE, STAY: FORWARD, DODGE: STAY, BACK: FORWARD}[habit]


def test_every_fixed_habit_loses_to_its_answer_so_no_pure_strategy_holds_a_draw() -> None:
    for habit in (BACK, STAY, FORWARD, DODGE):
        game = Sumo()
        game.reset(seed=0)
        for _ in range(MAX_STEPS):
            results = game.step({PLAYERS[0]: answer(game, habit), PLAYERS[1]: habit})
            if results[PLAYERS[0]][2]:
                break
        assert results[PLAYERS[0]][1:3] == (1.0, True), habit


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
        results = game.step({aid: int(rng.integers(4)) for aid in PLAYERS})
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
