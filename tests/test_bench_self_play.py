"""`uerl bench-self-play`'s table: each seed's results and their range per opponent (the
runs themselves are `make bench-self-play`; tests/test_self_play_e2e.py runs one seed)."""

from __future__ import annotations

from training.bench.self_play_range import table


def results(wins: int, draws: int, losses: int, len_mean: float = 60.0) -> dict[str, float]:
    return {
        "wins": wins,
        "draws": draws,
        "losses": losses,
        "net": wins - losses,
        "len_mean": len_mean,
    }


RUNS = [
    (1, {"random": results(96, 4, 0), "snapshot:0": results(55, 45, 0, 70.0)}),
    (2, {"random": results(77, 20, 3), "snapshot:0": results(80, 18, 2)}),
    (1, {"random": results(90, 8, 2), "snapshot:0": results(70, 25, 5)}),
]


def test_each_seed_gets_a_line_per_opponent() -> None:
    lines = table(RUNS).splitlines()
    assert "    seed 2     77 won   20 drawn    3 lost   net  +74   bout length 60.0" in lines


def test_the_range_over_seeds_is_minimum_median_maximum() -> None:
    text = table(RUNS)
    against_random, against_snapshot = text.split("  against snapshot:0:")
    assert "net      min / median / max: 74 / 88 / 96" in against_random
    assert "draws    min / median / max: 18 / 25 / 45" in against_snapshot
    assert "len_mean min / median / max: 60 / 60 / 70" in against_snapshot
