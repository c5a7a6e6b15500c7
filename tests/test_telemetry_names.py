"""uerl's metrics follow Prometheus' naming conventions, and the docs list every one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from training.telemetry import ray_metrics as rm

DOCS = Path(__file__).resolve().parent.parent / "docs" / "kubernetes.md"
# Label values a topology or a game bounds (its size, its names, its policies, the
# algorithm's losses): never a step, a time or a seed.
BOUNDED_TAGS = {"stack", "run", "runner", "game", "policy", "loss"}


@pytest.mark.parametrize("spec", rm.ALL_METRICS, ids=lambda s: s.name)
def test_a_metric_name_is_snake_case_under_uerl(spec: rm.MetricSpec) -> None:
    assert re.fullmatch(r"uerl_[a-z][a-z0-9_]*[a-z0-9]", spec.name), spec.name


@pytest.mark.parametrize("spec", rm.ALL_METRICS, ids=lambda s: s.name)
def test_only_counters_end_in_total(spec: rm.MetricSpec) -> None:
    assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name


@pytest.mark.parametrize("spec", rm.ALL_METRICS, ids=lambda s: s.name)
def test_times_are_in_seconds(spec: rm.MetricSpec) -> None:
    assert not re.search(r"_(ms|millis|milliseconds|minutes|hours)\b", spec.name), spec.name
    if "timestamp" in spec.name or spec.kind == "histogram":
        assert spec.name.endswith("_seconds"), spec.name


@pytest.mark.parametrize("spec", rm.ALL_METRICS, ids=lambda s: s.name)
def test_labels_are_bounded_by_the_topology(spec: rm.MetricSpec) -> None:
    assert set(spec.tags) <= BOUNDED_TAGS, spec.tags


def test_names_are_unique() -> None:
    names = [spec.name for spec in rm.ALL_METRICS]
    assert len(names) == len(set(names))


def test_step_latency_buckets_rise_from_under_a_millisecond_to_past_a_request_timeout() -> None:
    buckets = rm.STEP_SECONDS_BUCKETS
    assert list(buckets) == sorted(set(buckets))
    assert buckets[0] < 0.001 and buckets[-1] >= 5.0


@pytest.mark.parametrize("spec", rm.ALL_METRICS, ids=lambda s: s.name)
def test_the_docs_list_the_metric_as_it_is_scraped(spec: rm.MetricSpec) -> None:
    assert f"`ray_{spec.name}`" in DOCS.read_text(), spec.name


def test_a_runner_with_metrics_off_makes_no_metric_at_all() -> None:
    # What `uerl bench --metrics-cost` compares with: not even Ray's metric objects.
    off = rm.RunnerMetrics(stack="s", run="r", runner=1, game="127.0.0.1:1", enabled=False)
    off.sampled(100, [0.001, 0.002])
    off.game_down(1.0)
    off.game_back()
    assert off._metrics is None


def test_only_the_losses_of_each_policy_are_published_under_the_games_policy_ids() -> None:
    learners = {
        "default_policy": {"total_loss": 1.5, "vf_loss": 0.25, "entropy": 0.7, "kl": 0.01},
        "__all_modules__": {"total_loss": 9.0},
        "blue": {"policy_loss": -0.5, "vf_loss": float("nan"), "curr_lr": 3e-4},
    }
    got = rm.losses(learners, {"default_policy": "agent"})
    assert got == {
        ("agent", "total_loss"): 1.5,
        ("agent", "vf_loss"): 0.25,
        ("blue", "policy_loss"): -0.5,
    }
