"""An env runner's game gauges are set again on every refresh: Ray's metrics agent drops a
gauge left unset for two report intervals (20 s by default), and a game's state must stay
in the scrapes however long it lasts (tests/test_metrics_e2e.py sees it in Prometheus)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from training.telemetry import ray_metrics as rm


class FakeMetric:
    def __init__(self) -> None:
        self.sets: list[float] = []
        self.total = 0.0

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.sets.append(value)

    def inc(self, value: float) -> None:
        self.total += value

    def observe(self, value: float) -> None:
        pass


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeMetric]:
    metrics: dict[str, FakeMetric] = {}

    def make(spec: rm.MetricSpec, tags: Any) -> FakeMetric:
        return metrics.setdefault(spec.name, FakeMetric())

    monkeypatch.setattr(rm, "_make", make)
    return metrics


def test_each_refresh_sets_the_games_state_again_up_then_down_then_up(
    made: dict[str, FakeMetric],
) -> None:
    runner = rm.RunnerMetrics(stack="s", run="r", runner=1, game="127.0.0.1:1")
    runner.refresh()
    runner.refresh()
    assert made[rm.GAME_UP.name].sets == [1, 1, 1]  # made, then twice again
    assert made[rm.GAME_DOWN_SINCE.name].sets == [0, 0, 0]
    runner.game_down(1234.5)
    runner.refresh()
    assert made[rm.GAME_UP.name].sets[-2:] == [0, 0]
    assert made[rm.GAME_DOWN_SINCE.name].sets[-2:] == [1234.5, 1234.5]
    runner.game_back()
    runner.refresh()
    assert made[rm.GAME_UP.name].sets[-2:] == [1, 1]
    assert made[rm.GAME_DOWN_SINCE.name].sets[-2:] == [0, 0]
    assert made[rm.GAME_FAULTS.name].total == 1 and made[rm.RECONNECTS.name].total == 1


def test_a_refresh_with_metrics_off_makes_nothing(made: dict[str, FakeMetric]) -> None:
    off = rm.RunnerMetrics(stack="s", run="r", runner=1, game="127.0.0.1:1", enabled=False)
    off.refresh()
    assert made == {} and off._metrics is None


FIGURES = rm.IterationFigures(
    iteration=3, env_steps_total=1500, env_steps_per_s=250.0, learner_steps_per_s=900.0,
    episode_return_mean=float("nan"), episode_len_mean=20.0, runners_healthy=2, runners_total=2,
)  # fmt: skip


def test_the_drivers_gauges_are_set_again_as_last_set_by_its_heartbeat(
    made: dict[str, FakeMetric], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rm.DriverMetrics, "REFRESH_S", 0.02)
    driver = rm.DriverMetrics(stack="s", run="r", attempt=2)
    driver.iteration(FIGURES, losses={("agent", "total_loss"): 0.5}, rescales=1)
    driver.checkpoint_written(at=99.0)
    deadline = time.monotonic() + 10
    while len(made[rm.CHECKPOINT_TIME.name].sets) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    driver.close()
    assert set(made[rm.ITERATION.name].sets) == {3}
    assert set(made[rm.CHECKPOINT_TIME.name].sets) == {99.0}
    assert len(made[rm.CHECKPOINT_TIME.name].sets) >= 3
    assert set(made[rm.ATTEMPT.name].sets) == {2}
    assert set(made[rm.LEARNER_LOSS.name].sets) == {0.5}
    assert not made[rm.EPISODE_RETURN.name].sets  # NaN: never set, so never set again
    assert made[rm.RESCALES.name].total == 1  # a counter is not a gauge: not raised again


def test_a_closed_drivers_heartbeat_sets_nothing_more(
    made: dict[str, FakeMetric], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rm.DriverMetrics, "REFRESH_S", 0.02)
    driver = rm.DriverMetrics(stack="s", run="r")
    driver.iteration(FIGURES)
    driver.close()
    count = len(made[rm.ITERATION.name].sets)
    time.sleep(0.1)
    assert len(made[rm.ITERATION.name].sets) == count


def test_the_store_lag_is_published_as_the_time_the_store_holds_the_run_through(
    made: dict[str, FakeMetric],
) -> None:
    driver = rm.DriverMetrics(stack="s", run="r")
    driver.stored_through(1234.0)
    driver.close()
    assert made[rm.STORED_THROUGH.name].sets == [1234.0]
