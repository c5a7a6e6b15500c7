"""uerl's metrics read back where Ray's metrics agents serve them (`uerl watch`): each
node's endpoint scraped (Prometheus' text format), or a Prometheus server asked for
them; the samples summed per env runner and for the driver (training.telemetry.watch
draws them).

Ray puts `ray_` before every published name and adds its own labels (the node, the
worker, Ray's session): a runner restarted is another worker, so a runner's counters
are summed over Ray's labels, as a `sum by (runner)` would.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from training.telemetry import ray_metrics as rm

RAY_PREFIX = "ray_"
TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Sample:
    name: str  # uerl's name, Ray's prefix taken off (`uerl_env_steps_total`)
    labels: dict[str, str]
    value: float


@dataclass
class Scrape:
    """One round over every target: their samples, and each target's trouble (None:
    it answered)."""

    samples: list[Sample] = field(default_factory=list)
    targets: dict[str, str | None] = field(default_factory=dict)


def parse(text: str) -> list[Sample]:
    """uerl's samples in a Prometheus text exposition (Ray's others left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix(RAY_PREFIX)
            if name.startswith("uerl_"):
                out.append(Sample(name, dict(sample.labels), float(sample.value)))
    return out


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return "refused"
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return "no answer"
    return str(reason) or type(reason).__name__


def endpoint_url(target: str) -> str:
    """`host:port` (a file_sd target) or a URL -> the URL to scrape."""
    if "://" not in target:
        target = f"http://{target}"
    parts = urllib.parse.urlsplit(target)
    return target if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def scrape_targets(
    targets: Iterable[str], names: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S
) -> Scrape:
    """Each target's endpoint read once; one that does not answer is said, not raised.
    `names`: what to call a target in `Scrape.targets` (a node's name), else itself."""
    scrape = Scrape()
    names = names or {}
    for target in targets:
        shown = names.get(target, target)
        url = endpoint_url(target)
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as reply:
                text = reply.read().decode("utf-8", "replace")
            scrape.samples += parse(text)
            scrape.targets[shown] = None
        except (OSError, ValueError) as exc:  # URLError, a reset, a bad reply
            scrape.targets[shown] = _why(exc)
    return scrape


def scrape_prometheus(server: str, timeout_s: float = TIMEOUT_S) -> Scrape:
    """uerl's series as a Prometheus server holds them now (one instant query)."""
    query = urllib.parse.urlencode({"query": '{__name__=~"(ray_)?uerl_.*"}'})
    url = f"{server.rstrip('/')}/api/v1/query?{query}"
    scrape = Scrape()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            data = json.loads(reply.read())
        for series in data["data"]["result"]:
            labels = dict(series["metric"])
            name = labels.pop("__name__").removeprefix(RAY_PREFIX)
            scrape.samples.append(Sample(name, labels, float(series["value"][1])))
        scrape.targets[server] = None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        scrape.targets[server] = _why(exc)
    return scrape


@dataclass
class RunnerState:
    """One env runner's figures at one scrape (summed over Ray's labels)."""

    run: str
    runner: str
    game: str
    env_steps: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    up: float | None = None
    down_since: float = 0.0
    faults: float = 0.0
    reconnects: float = 0.0


@dataclass
class DriverState:
    """The run's figures at one scrape (the driver's gauges)."""

    run: str
    stack: str
    figures: dict[str, float] = field(default_factory=dict)  # spec name -> value


def runners(samples: Iterable[Sample]) -> dict[tuple[str, str], RunnerState]:
    """(run, runner) -> its figures."""
    out: dict[tuple[str, str], RunnerState] = {}
    bucket_name = rm.STEP_SECONDS.name + "_bucket"
    for s in samples:
        if "runner" not in s.labels:
            continue
        key = (s.labels.get("run", ""), s.labels["runner"])
        state = out.get(key)
        if state is None:
            state = out[key] = RunnerState(key[0], key[1], s.labels.get("game", "?"))
        if s.name == rm.ENV_STEPS.name:
            state.env_steps += s.value
        elif s.name == bucket_name:
            le = float(s.labels.get("le", "inf"))
            state.buckets[le] = state.buckets.get(le, 0.0) + s.value
        elif s.name == rm.GAME_UP.name:
            state.up = s.value if state.up is None else max(state.up, s.value)
        elif s.name == rm.GAME_DOWN_SINCE.name:
            state.down_since = max(state.down_since, s.value)
        elif s.name == rm.GAME_FAULTS.name:
            state.faults += s.value
        elif s.name == rm.RECONNECTS.name:
            state.reconnects += s.value
    for state in out.values():
        if state.up:  # a restarted runner's old worker may still say when it went down
            state.down_since = 0.0
    return out


DRIVER_NAMES = {spec.name for spec in rm.DRIVER_METRICS}


def drivers(samples: Iterable[Sample]) -> dict[str, DriverState]:
    """run -> its driver's figures."""
    out: dict[str, DriverState] = {}
    for s in samples:
        if s.name not in DRIVER_NAMES or "runner" in s.labels:
            continue
        run = s.labels.get("run", "")
        state = out.setdefault(run, DriverState(run, s.labels.get("stack", "")))
        state.figures[s.name] = s.value
    return out


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The q-quantile of a histogram's cumulative buckets (le -> count), interpolated
    inside its bucket as Prometheus' histogram_quantile does; None with no observation.
    In the +Inf bucket: the highest finite bound."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound
