"""An env runner's game gauges are set again on every refresh: Ray's metrics agent drops a
gauge left unset for two report intervals (20 s by default), and a game's state must stay
in the scrapes however long it lasts (tests/test_metrics_e2e.py sees it in Prometheus)."""

from __future__ import annotations

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
