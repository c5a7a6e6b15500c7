"""Self-play's parts without a cluster: who plays whom, the snapshot ring, Elo, outcomes."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from training.policies.outcomes import SelfPlayOutcomes, learner_results, outcomes_from_result
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
THREE = ("player_0", "player_1", "player_2")
FOUR = ("player_0", "player_1", "player_2", "player_3")


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
    # 10 wins against an equal: K 16 x 10 games x (1 - 0.5); games against itself count nothing.
    assert league.rating == pytest.approx(INITIAL_RATING + 80)


def test_the_league_round_trips_through_json() -> None:
    league = League(SelfPlaySettings(window=3))
    league.took("snapshot_0", 0)
    league.record({"snapshot_0": Outcomes(wins=3, losses=1)})
    again = League.from_json(league.to_json())
    assert again == league


def test_an_episode_result_is_the_learners_against_its_opponent() -> None:
    modules = {"player_0": LEARNER, "player_1": "snapshot_2"}
    seat = "player_0"
    won = learner_results({"player_0": 1.0, "player_1": -1.0}, modules, seat)
    lost = learner_results({"player_0": -1.0, "player_1": 1.0}, modules, seat)
    drawn = learner_results({"player_0": 0.0, "player_1": 0.0}, modules, seat)
    assert won == [("snapshot_2", "wins")]
    assert lost == [("snapshot_2", "losses")]
    assert drawn == [("snapshot_2", "draws")]


def test_the_learner_against_itself_is_not_a_result() -> None:
    modules = {"player_0": LEARNER, "player_1": LEARNER}
    assert learner_results({"player_0": 1.0, "player_1": -1.0}, modules, "player_1") == []


def test_the_learner_seat_is_the_agent_the_mapping_gives_the_learner() -> None:
    mapping = SelfPlayMapping(FOUR, ("snapshot_0",), p_current=0.5)
    for n in range(200):
        seat = mapping.learner_seat(episode(n))
        assert mapping(seat, episode(n)) == LEARNER
        assert seat in FOUR


def test_outcomes_are_read_per_opponent_from_the_training_result() -> None:
    result = {"env_runners": {"uerl_league": {"snapshot_0": {"wins": 3, "draws": 1, "losses": 2}}}}
    assert outcomes_from_result(result) == {"snapshot_0": Outcomes(3, 1, 2)}
    assert outcomes_from_result({}) == {}


def test_an_opponent_not_met_this_iteration_counts_no_games() -> None:
    nan = float("nan")
    result = {"env_runners": {"uerl_league": {"snapshot_1": {"wins": nan, "losses": nan}}}}
    assert outcomes_from_result(result) == {"snapshot_1": Outcomes()}


class _Logged:
    """A stand-in MetricsLogger: the sums the callback logs, per key."""

    def __init__(self) -> None:
        self.sums: Counter[tuple[str, ...]] = Counter()

    def log_value(self, key: tuple[str, ...], value: int, reduce: str) -> None:
        assert reduce == "sum"
        self.sums[key] += value


def _finished_episode(
    agents: tuple[str, ...], learner_seat: str, modules: dict[str, str], returns: dict[str, float]
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """An episode whose drawn learner seat is `learner_seat`, its agents playing `modules`
    (a seat other than the learner's may play the current learner), and its env runner."""
    mapping = SelfPlayMapping(agents, ("snapshot_0",), p_current=0.0)
    n = next(n for n in range(1000) if mapping(learner_seat, episode(n)) == LEARNER)
    played = SimpleNamespace(
        id_=f"episode-{n}",
        agent_episodes={
            aid: SimpleNamespace(get_return=lambda r=r: r) for aid, r in returns.items()
        },
        module_for=modules.__getitem__,
    )
    return played, SimpleNamespace(config=SimpleNamespace(policy_mapping_fn=mapping))


def _rated(agents: tuple[str, ...], seat: str, modules: dict[str, str], returns: dict[str, float]):
    played, runner = _finished_episode(agents, seat, modules, returns)
    logged = _Logged()
    SelfPlayOutcomes().on_episode_end(
        episode=played, env_runner=runner, metrics_logger=logged, env_index=0
    )
    return {key: n for key, n in logged.sums.items() if n}


def test_an_opponent_playing_the_current_learner_is_not_added_to_the_learners_score() -> None:
    # The case: learner +1, the current learner as an opponent -1, snapshot_0 0.
    modules = {"player_0": LEARNER, "player_1": LEARNER, "player_2": "snapshot_0"}
    returns = {"player_0": 1.0, "player_1": -1.0, "player_2": 0.0}
    assert _rated(THREE, "player_0", modules, returns) == {("uerl_league", "snapshot_0", "wins"): 1}


def test_the_learners_seat_is_the_drawn_one_not_the_first_agent_playing_the_learner() -> None:
    modules = {"player_0": LEARNER, "player_1": "snapshot_0", "player_2": LEARNER}
    returns = {"player_0": 5.0, "player_1": 1.0, "player_2": -3.0}
    assert _rated(THREE, "player_2", modules, returns) == {
        ("uerl_league", "snapshot_0", "losses"): 1
    }


def test_with_three_players_each_snapshot_seat_is_one_game_against_its_snapshot() -> None:
    modules = {"player_0": "snapshot_0", "player_1": LEARNER, "player_2": "snapshot_1"}
    returns = {"player_0": 0.0, "player_1": 1.0, "player_2": 2.0}
    assert _rated(THREE, "player_1", modules, returns) == {
        ("uerl_league", "snapshot_0", "wins"): 1,
        ("uerl_league", "snapshot_1", "losses"): 1,
    }


def test_with_four_players_only_the_seats_snapshots_play_are_rated() -> None:
    modules = {
        "player_0": "snapshot_0",
        "player_1": LEARNER,
        "player_2": LEARNER,
        "player_3": "snapshot_0",
    }
    returns = {"player_0": 2.0, "player_1": 1.0, "player_2": 7.0, "player_3": 1.0}
    assert _rated(FOUR, "player_1", modules, returns) == {
        ("uerl_league", "snapshot_0", "losses"): 1,
        ("uerl_league", "snapshot_0", "draws"): 1,
    }


def test_a_four_player_game_against_the_current_learner_only_is_not_rated() -> None:
    modules = dict.fromkeys(FOUR, LEARNER)
    returns = {"player_0": 2.0, "player_1": 1.0, "player_2": 7.0, "player_3": 1.0}
    assert _rated(FOUR, "player_3", modules, returns) == {}
