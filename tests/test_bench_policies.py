"""`uerl bench-policies`' figures and verdict, on given learning curves (the runs
themselves are `make bench-policies`; tests/test_ctde_e2e.py runs ctde alone)."""

from __future__ import annotations

from training.bench.policy_runs import summarise, table
from training.run.metrics import IterationRow


def curve(returns: list[float], batch: int = 2000) -> list[IterationRow]:
    """One run's rows: iteration i sampled `batch` env steps and averaged `returns[i]`."""
    return [
        IterationRow(
            iteration=i,
            env_steps_total=i * batch,
            episodes_total=i * 10,
            time_s=1.0,
            env_steps_per_s=float(batch),
            episode_return_mean=value,
            episode_len_mean=20.0,
            learner_steps_per_s=float(batch),
        )
        for i, value in enumerate(returns, start=1)
    ]


CTDE = [curve([-21.0, -18.0, -12.0, -9.0, -8.0, -7.5, -7.0])]
INDEPENDENT = [curve([-20.0, -19.0, -15.0, -12.0, -10.0, -9.5, -9.0])]


def test_the_first_configuration_is_said_to_beat_the_second_when_it_ends_higher() -> None:
    target, summary = summarise({"ctde": CTDE, "independent": INDEPENDENT}, None)
    lines = table(target, summary).splitlines()
    assert lines[-1].startswith("  ctde beats independent: final return +")


def test_the_first_configuration_is_said_not_to_beat_the_second_when_it_ends_lower() -> None:
    target, summary = summarise({"independent": INDEPENDENT, "ctde": CTDE}, None)
    assert "independent does not beat ctde: final return -" in table(target, summary)


def test_one_configuration_alone_gets_its_row_and_no_verdict() -> None:
    target, summary = summarise({"ctde": CTDE}, None)
    text = table(target, summary)
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["ctde"]
    assert "beat" not in text


def test_the_target_is_half_way_from_the_first_return_to_the_best_final_one() -> None:
    target, summary = summarise({"ctde": CTDE, "independent": INDEPENDENT}, None)
    first = (-21.0 + -20.0) / 2
    best_final = summary["ctde"]["final_return"]
    assert target == first + (best_final - first) / 2
    # Steps to that target: the first iteration at or above it.
    assert summary["ctde"]["steps_to_target"] == 3 * 2000
