"""Self-play's parts without a cluster: who plays whom, the snapshot ring, Elo, outcomes."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from training.policies.outcomes import learner_result, outcomes_from_result
from training.policies.self_play import (
    INITIAL_RATING,
    LEARNER,
    League,
    Outcomes,
    SelfPlayMapping,
    SelfPlaySettings,
    elo_update,
    expected_score,
)

AGENTS = ("player_0", "player_1")


def episode(n: int) -> SimpleNamespace:
    return SimpleNamespace(id_=f"episode-{n}")


def test_one_agent_per_episode_plays_the_learner_the_other_an_opponent() -> None:
    mapping = SelfPlayMapping(AGENTS, ("snapshot_0", "snapshot_1"), p_current=0.0)
    for n in range(200):
        modules = [mapping(aid, episode(n)) for aid in AGENTS]
        assert modules.count(LEARNER) == 1 and set(modules) - {LEARNER} <= {
            "snapshot_0",
            "snapshot_1",
        }


def test_the_draw_is_the_same_however_often_it_is_asked() -> None:
    mapping = SelfPlayMapping(AGENTS, ("snapshot_0", "snapshot_1", "snapshot_2"), 0.3)
    assert [mapping("player_1", episode(7)) for _ in range(5)] == [
        mapping("player_1", episode(7))
    ] * 5


def test_both_seats_and_all_opponents_come_up() -> None:
    mapping = SelfPlayMapping(AGENTS, ("snapshot_0", "snapshot_1"), p_current=0.0)
    seats = Counter(mapping("player_0", episode(n)) == LEARNER for n in range(1000))
    opponents = Counter(
        module
        for n in range(1000)
        for aid in AGENTS
        if (module := mapping(aid, episode(n))) != LEARNER
    )
    assert 400 < seats[True] < 600
    assert 400 < opponents["snapshot_0"] < 600


def test_the_current_learner_is_the_opponent_with_chance_p() -> None:
    mapping = SelfPlayMapping(AGENTS, ("snapshot_0",), p_current=0.25)
    mirrors = sum(all(mapping(aid, episode(n)) == LEARNER for aid in AGENTS) for n in range(2000))
    assert 400 < mirrors < 600


def test_without_snapshots_the_learner_plays_itself() -> None:
    mapping = SelfPlayMapping(AGENTS, (), p_current=0.0)
    assert {mapping(aid, episode(1)) for aid in AGENTS} == {LEARNER}


def test_snapshots_fill_the_window_then_replace_the_oldest() -> None:
    league = League(SelfPlaySettings(snapshot_every=2, window=2))
    slots = []
    for iteration in (0, 2, 4, 6):
        slot = league.next_slot()
        league.took(slot, iteration)
        slots.append(slot)
    assert slots == ["snapshot_0", "snapshot_1", "snapshot_0", "snapshot_1"]
    assert {s: snap.number for s, snap in league.slots.items()} == {
        "snapshot_0": 2,
        "snapshot_1": 3,
    }
    assert league.slot_of(3) == "snapshot_1" and league.slot_of(0) is None
    assert league.due(4) and not league.due(5)


def test_winning_against_an_equal_raises_the_rating_losing_lowers_it() -> None:
    assert elo_update(1000, 1000, Outcomes(wins=1)) == pytest.approx(1008)
    assert elo_update(1000, 1000, Outcomes(losses=1)) == pytest.approx(992)
    assert elo_update(1000, 1000, Outcomes(draws=4)) == pytest.approx(1000)


def test_a_big_batch_of_games_moves_the_rating_a_bounded_step() -> None:
    one_batch = elo_update(1000, 1000, Outcomes(wins=500))
    assert one_batch == pytest.approx(1000 + 16 * 32 * 0.5)


def test_ratings_converge_where_the_expected_score_meets_the_result() -> None:
    rating = 1000.0
    for _ in range(200):
        rating = elo_update(rating, 1000, Outcomes(wins=75, losses=25))
    assert expected_score(rating, 1000) == pytest.approx(0.75, abs=0.01)


def test_the_league_rates_the_learner_against_the_snapshots_it_played() -> None:
    league = League(SelfPlaySettings())
    league.took("snapshot_0", 0)
    league.record({"snapshot_0": Outcomes(wins=10), "learner": Outcomes(wins=5)})
    assert league.rating > INITIAL_RATING


def test_the_league_round_trips_through_json() -> None:
    league = League(SelfPlaySettings(window=3))
    league.took("snapshot_0", 0)
    league.record({"snapshot_0": Outcomes(wins=3, losses=1)})
    again = League.from_json(league.to_json())
    assert again == league


def test_an_episode_result_is_the_learners_against_its_opponent() -> None:
    modules = {"player_0": LEARNER, "player_1": "snapshot_2"}
    assert learner_result({"player_0": 1.0, "player_1": -1.0}, modules) == ("snapshot_2", "wins")
    assert learner_result({"player_0": -1.0, "player_1": 1.0}, modules) == ("snapshot_2", "losses")
    assert learner_result({"player_0": 0.0, "player_1": 0.0}, modules) == ("snapshot_2", "draws")


def test_the_learner_against_itself_is_not_a_result() -> None:
    modules = {"player_0": LEARNER, "player_1": LEARNER}
    assert learner_result({"player_0": 1.0, "player_1": -1.0}, modules) is None


def test_outcomes_are_read_per_opponent_from_the_training_result() -> None:
    result = {"env_runners": {"uerl_league": {"snapshot_0": {"wins": 3, "draws": 1, "losses": 2}}}}
    assert outcomes_from_result(result) == {"snapshot_0": Outcomes(3, 1, 2)}
    assert outcomes_from_result({}) == {}


def test_an_opponent_not_met_this_iteration_counts_no_games() -> None:
    nan = float("nan")
    result = {"env_runners": {"uerl_league": {"snapshot_1": {"wins": nan, "losses": nan}}}}
    assert outcomes_from_result(result) == {"snapshot_1": Outcomes()}
