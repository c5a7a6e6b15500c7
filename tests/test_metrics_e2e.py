"""uerl's own metrics, scraped from the Ray nodes' metrics agents of a real `uerl local`
run (the HTTP endpoints Prometheus would scrape), while it trains and a game is killed;
and the same run scraped by a real Prometheus (Debian's, tests/tools/prometheus.sh)
through the run's `metrics_targets.json`, every query of the repository's Grafana
dashboard (infra/dashboards/uerl-training.json) evaluated against what it holds.

One run for the module: the scrapes are taken while it trains, the checks read them
against the run's own metrics.csv once it has ended. It ends when the scrapes hold enough
of Ray's reports (every 10 s), not after a number of iterations: ten iterations took over
a minute on a loaded host and 10 s on a quiet one, where Prometheus then held two reports
of the driver's figures and no rate of the step histogram. The test stops it as a user
would, with Ctrl-C: the iteration finishes, the final checkpoint is written, exit 130.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dashboard_queries as dq
import pytest
from host_speed import guard
from local_runs import LocalRunWatcher, retry_signal
from proc_tree import Deadline, StartedProcesses
from prometheus_client.parser import text_string_to_metric_families
from prometheus_server import Prometheus, start_prometheus

from training.local.session import METRICS_TARGETS_FILE
from training.telemetry import ray_metrics as rm

# A hang guard: the test stops the run once REPORTS of Ray's reports are scraped.
MOST_ITERATIONS = 500
REPORTS = 4  # distinct reports of the driver's gauges, and of each runner's counter
KILLED = "ue-1"  # its runner: 1
WORKERS = 2
SMALL_BATCH = ("--train-batch-size", "500", "--minibatch-size", "100")
PREFIX = "ray_"  # what Ray's metrics agent puts before every published name


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(url: str) -> list[Sample]:
    with urllib.request.urlopen(url, timeout=guard(10)) as reply:
        text = reply.read().decode()
    return [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(PREFIX + "uerl_")
    ]


def scrape_all(urls: list[str]) -> list[Sample]:
    return [s for url in urls for s in scrape(url)]


def named(samples: list[Sample], spec: rm.MetricSpec, suffix: str = "") -> list[Sample]:
    return [s for s in samples if s.name == PREFIX + spec.name + suffix]


def by_runner(samples: list[Sample], spec: rm.MetricSpec, suffix: str = "") -> dict[str, float]:
    """Summed over Ray's own labels (a runner restarted is another worker id)."""
    out: dict[str, float] = {}
    for s in named(samples, spec, suffix):
        out[s.labels["runner"]] = out.get(s.labels["runner"], 0.0) + s.value
    return out


@dataclass
class MetricsRun:
    run_dir: Path
    output: str
    code: int
    urls: list[str]
    targets: list[dict]
    during: list[list[Sample]]  # every scrape taken while it trained, in order
    after_fault: list[Sample]  # the first scrape showing runner 1's game back
    watch_code: int  # `uerl watch` beside the run while it trained, ended by Ctrl-C
    watch_output: str  # its frames (not a terminal: one after another, a blank line between)
    prometheus: Prometheus  # scraped the run's targets every second, still running
    started_at: float  # Unix times: the run started,
    last_scrape_at: float  # the test's last scrape while it trained (its nodes all up)
    ended_at: float  # it exited
    last_iteration: int  # the last iteration it printed


def reports_seen(during: list[list[Sample]]) -> int:
    """How many of Ray's reports the scrapes hold: distinct values of the driver's
    iteration, and of each runner's env step counter, the fewest of those."""
    iterations = {s.value for samples in during for s in named(samples, rm.ITERATION)}
    counters: dict[str, set[float]] = {str(r): set() for r in range(1, WORKERS + 1)}
    for samples in during:
        for runner, value in by_runner(samples, rm.ENV_STEPS).items():
            counters.setdefault(runner, set()).add(value)
    return min(len(iterations), *(len(values) for values in counters.values()))


@pytest.fixture(scope="module")
def metrics_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsRun]:
    base = tmp_path_factory.mktemp("metrics")
    run_dir = base / "run"
    with StartedProcesses() as started:
        deadline = Deadline(guard(900))
        # Started first: it finds the targets file once the run writes it.
        prometheus = start_prometheus(started, run_dir / METRICS_TARGETS_FILE, base / "prometheus")
        started_at = time.time()
        run = LocalRunWatcher(
            started, deadline, run_dir,
            "--workers", str(WORKERS), "--iterations", str(MOST_ITERATIONS),
            "--checkpoint-every", "3", "--request-timeout", "2", "--seed", "0", *SMALL_BATCH,
        )  # fmt: skip
        run.wait_iteration(2, timeout_s=guard(600))
        targets = json.loads((run_dir / METRICS_TARGETS_FILE).read_text())
        urls = [f"http://{t['targets'][0]}/metrics" for t in targets]
        # The terminal view beside the scrapes below, to the run's end.
        watching = started.popen(
            [sys.executable, "-m", "training.cli", "watch", "--run-dir", str(run_dir),
             "--interval", "1"],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        retry_signal(run, KILLED, signal.SIGKILL)
        during: list[list[Sample]] = []
        after_fault: list[Sample] = []
        last_scrape_at = time.time()
        stopped = False
        while run.proc.poll() is None:
            try:
                samples = scrape_all(urls)
            except OSError:  # the nodes stopping at the end
                break
            last_scrape_at = time.time()
            during.append(samples)
            faults = by_runner(samples, rm.GAME_FAULTS)
            up = by_runner(samples, rm.GAME_UP)
            if not after_fault and faults.get("1", 0) >= 1 and up.get("1") == 1:
                after_fault = samples
            enough = after_fault and reports_seen(during) >= REPORTS
            # Never reaching enough, it is stopped with room left for the checks to say so.
            if not stopped and (enough or deadline.left() < guard(300)):
                run.proc.send_signal(signal.SIGINT)  # Ctrl-C: finish the iteration, stop
                stopped = True
            time.sleep(1)
        code = run.finish(timeout_s=guard(600))
        watching.send_signal(signal.SIGINT)
        watch_output, _ = watching.communicate(timeout=deadline.left(guard(30)))
        ended_at = time.time()
        yield MetricsRun(
            run_dir, run.output, code, urls, targets, during, after_fault,
            watching.returncode, watch_output,
            prometheus, started_at, last_scrape_at, ended_at, run.iteration,
        )  # fmt: skip


def csv_rows(run_dir: Path) -> dict[int, dict[str, str]]:
    with (run_dir / "metrics.csv").open() as fh:
        return {int(row["iteration"]): row for row in csv.DictReader(fh)}


@pytest.mark.slow
def test_the_run_says_where_its_metrics_are_and_lists_every_node_as_a_scrape_target(
    metrics_run: MetricsRun,
) -> None:
    # 130: stopped by the test's Ctrl-C once the scrapes held enough reports.
    assert metrics_run.code == 130, metrics_run.output
    assert "metrics (Prometheus) of each Ray node" in metrics_run.output
    nodes = sorted(t["labels"]["uerl_node"] for t in metrics_run.targets)
    assert nodes == ["head", "learner1", "worker1", "worker2"]
    assert {t["labels"]["stack"] for t in metrics_run.targets} == {"uerl"}
    for url in metrics_run.urls:
        assert url in metrics_run.output


@pytest.mark.slow
def test_each_runner_publishes_its_env_steps_and_step_latency_labelled_with_its_game(
    metrics_run: MetricsRun,
) -> None:
    last = metrics_run.during[-1]
    steps = named(last, rm.ENV_STEPS)
    games = json.loads((metrics_run.run_dir / "endpoints.json").read_text())
    assert {s.labels["runner"] for s in steps} == {"1", "2"}, steps
    for s in steps:
        assert s.labels["stack"] == "uerl" and s.labels["run"] == metrics_run.run_dir.name
        assert s.labels["game"].endswith(f":{games['port'] + int(s.labels['runner'])}"), s
        assert s.value > 0
    counts = by_runner(last, rm.STEP_SECONDS, "_count")
    sums = by_runner(last, rm.STEP_SECONDS, "_sum")
    assert set(counts) == {"1", "2"} and all(n > 0 for n in counts.values())
    for runner, n in counts.items():
        # A step's mean time: under the 2 s request timeout, however loaded the host.
        assert 0 < sums[runner] / n < 2.0, (runner, sums[runner], n)


@pytest.mark.slow
def test_a_killed_game_shows_as_a_fault_then_up_again_with_a_reconnect(
    metrics_run: MetricsRun,
) -> None:
    assert metrics_run.after_fault, "no scrape showed runner 1's game failed and back"
    samples = metrics_run.after_fault
    assert by_runner(samples, rm.GAME_FAULTS)["1"] >= 1
    assert by_runner(samples, rm.RECONNECTS)["1"] >= 1
    assert by_runner(samples, rm.GAME_DOWN_SINCE)["1"] == 0
    # The other runner's game never failed.
    assert by_runner(samples, rm.GAME_FAULTS).get("2", 0) == 0
    # While it was down, a scrape said so, with when it went down.
    down = [
        by_runner(s, rm.GAME_DOWN_SINCE).get("1", 0)
        for s in metrics_run.during
        if by_runner(s, rm.GAME_UP).get("1") == 0
    ]
    if down:  # a restart quicker than Ray's 10 s export interval shows no down scrape
        assert all(since > time.time() - guard(900) for since in down), down


@pytest.mark.slow
def test_the_drivers_figures_agree_with_metrics_csv_at_the_iteration_they_name(
    metrics_run: MetricsRun,
) -> None:
    rows = csv_rows(metrics_run.run_dir)
    # The iteration under way at Ctrl-C finished and has its row; none after it.
    assert max(rows) == metrics_run.last_iteration < MOST_ITERATIONS
    compared = 0
    for samples in metrics_run.during:
        iteration = named(samples, rm.ITERATION)
        if not iteration:
            continue
        (sample,) = iteration
        row = rows[int(sample.value)]
        figures = {spec.name: named(samples, spec) for spec in rm.DRIVER_METRICS}
        # Each gauge is exported with the others of its iteration: one report, one time.
        (steps,) = figures[rm.RUN_ENV_STEPS.name]
        assert steps.value == int(row["env_steps_total"]), (sample.value, row)
        returns = figures[rm.EPISODE_RETURN.name]
        if not math.isnan(float(row["episode_return_mean"])):
            (ret,) = returns
            assert math.isclose(ret.value, float(row["episode_return_mean"]), rel_tol=1e-6)
        (healthy,) = figures[rm.RUNNERS_HEALTHY.name]
        assert healthy.value == int(row["runners_healthy"])
        compared += 1
    assert compared >= 3, f"only {compared} scrape(s) had the driver's figures"


@pytest.mark.slow
def test_the_newest_checkpoints_time_is_published(metrics_run: MetricsRun) -> None:
    stamps = [s.value for samples in metrics_run.during for s in named(samples, rm.CHECKPOINT_TIME)]
    assert stamps, "no scrape had the checkpoint's time"
    newest = max(stamps)
    assert time.time() - guard(900) < newest <= time.time()


@pytest.mark.slow
def test_the_learners_losses_are_published_per_policy_under_rllibs_names(
    metrics_run: MetricsRun,
) -> None:
    losses = [s for samples in metrics_run.during for s in named(samples, rm.LEARNER_LOSS)]
    assert losses, "no scrape had a loss"
    assert {s.labels["loss"] for s in losses} >= {"total_loss", "policy_loss", "vf_loss"}
    assert all(math.isfinite(s.value) for s in losses)
    policies = {s.labels["policy"] for s in losses}
    assert policies and not [p for p in policies if p.startswith("__")], policies


@pytest.mark.slow
def test_an_unsupervised_run_is_its_first_attempt_and_followed_no_rescale(
    metrics_run: MetricsRun,
) -> None:
    attempts = [s.value for samples in metrics_run.during for s in named(samples, rm.ATTEMPT)]
    assert attempts and set(attempts) == {1.0}
    rescales = [s.value for samples in metrics_run.during for s in named(samples, rm.RESCALES)]
    assert set(rescales) <= {0.0}  # a counter never raised is absent, or 0


@pytest.mark.slow
def test_uerl_watch_showed_both_games_sampling_while_it_trained(metrics_run: MetricsRun) -> None:
    output = metrics_run.watch_output
    assert metrics_run.watch_code == 0, output[-3000:]
    assert "Traceback" not in output
    assert all(len(line) <= 80 for line in output.splitlines()), output[-3000:]
    games = json.loads((metrics_run.run_dir / "endpoints.json").read_text())
    sampling = 0
    for frame in output.split("\n\n"):
        rows = {
            cells[0]: cells
            for cells in (line.split() for line in frame.splitlines())
            if cells[:1] in (["1"], ["2"]) and len(cells) >= 3 and ":" in cells[1]
        }
        if set(rows) != {"1", "2"}:
            continue
        for runner, cells in rows.items():
            assert cells[1].endswith(f":{games['port'] + int(runner)}"), frame
        rates = [rows[r][2].replace(",", "") for r in ("1", "2")]
        if all(rate.isdigit() and int(rate) > 0 for rate in rates):
            sampling += 1
    assert sampling, f"no frame showed both runners' env steps per second:\n{output[-3000:]}"


# ------------------------------------------------ the dashboard, on a real Prometheus

WINDOW = "1m"  # the dashboard's default rate window (Ray's workers report every 10 s)


def dashboard_values(run: MetricsRun) -> dict[str, str]:
    """The template variables as Grafana would fill them for this run."""
    return {"stack": "uerl", "run": run.run_dir.name, "window": WINDOW}


def panel_query(title: str, ref: str = "A") -> dq.Query:
    (query,) = [q for q in dq.queries(dq.load()) if q.panel == title and q.ref == ref]
    return query


def over_the_run(run: MetricsRun, query: dq.Query) -> dict[str, dict[float, float]]:
    """The query's series (by legend-relevant labels) over the run, every second."""
    result = run.prometheus.query_range(
        query.with_values(dashboard_values(run)), run.started_at, run.ended_at
    )
    return {
        json.dumps(series["metric"], sort_keys=True): {
            float(t): float(v) for t, v in series["values"]
        }
        for series in result
    }


def one_series(run: MetricsRun, query: dq.Query) -> dict[float, float]:
    series = over_the_run(run, query)
    assert len(series) == 1, (query.name, list(series))
    return next(iter(series.values()))


def finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


@pytest.mark.slow
def test_prometheus_found_every_node_through_the_runs_file_sd_targets(
    metrics_run: MetricsRun,
) -> None:
    seen = metrics_run.prometheus.query(
        'count by (uerl_node) (up{job="uerl-local"})', metrics_run.last_scrape_at
    )
    assert sorted(s["metric"]["uerl_node"] for s in seen) == [
        "head", "learner1", "worker1", "worker2",
    ], metrics_run.prometheus.log_tail()  # fmt: skip


@pytest.mark.slow
def test_every_dashboard_query_returns_data_from_prometheus(metrics_run: MetricsRun) -> None:
    """Each panel's query as Grafana sends it: over the run (a graph's range query), and
    at the last instant that range holds a point (a stat panel's instant query), which
    must give the same value."""
    values = dashboard_values(metrics_run)
    empty = []
    for query in dq.queries(dq.load()):
        series = over_the_run(metrics_run, query)
        points = [(t, v) for s in series.values() for t, v in s.items() if math.isfinite(v)]
        if not points:
            empty.append(f"{query.name}: no point over the run: {query.expr}")
            continue
        at = max(t for t, _ in points)
        now = metrics_run.prometheus.query(query.with_values(values), at)
        instant = sorted(finite([float(s["value"][1]) for s in now]))
        print(f"figure dashboard {query.name}: {len(points)} point(s), last {instant}")
        if instant != sorted(v for t, v in points if t == at):
            empty.append(f"{query.name}: at {at}: {now} against the range's {points[-3:]}")
    assert not empty, "\n".join(empty)


@pytest.mark.slow
def test_the_dashboards_run_figures_agree_with_metrics_csv_at_each_instant(
    metrics_run: MetricsRun,
) -> None:
    """At every second Prometheus holds the driver's figures, the panels show metrics.csv's
    row of the iteration the iteration panel shows: exactly (relative 1e-6 for floats; the
    driver publishes them together, Prometheus stores them with one scrape's time)."""
    rows = csv_rows(metrics_run.run_dir)
    iteration = one_series(metrics_run, panel_query("Iteration and env steps trained", "A"))
    compared = {
        "env_steps_total": panel_query("Iteration and env steps trained", "B"),
        "episode_return_mean": panel_query("Episode return (mean)"),
        "episode_len_mean": panel_query("Episode length (mean)"),
        "runners_healthy": panel_query("Env runners healthy / total", "A"),
        "runners_total": panel_query("Env runners healthy / total", "B"),
        "env_steps_per_s": panel_query("Run and learner throughput", "B"),
        "learner_steps_per_s": panel_query("Run and learner throughput", "C"),
    }
    seen: set[int] = set()
    for column, query in compared.items():
        series = one_series(metrics_run, query)
        both = [t for t in series if t in iteration]
        # Every second Prometheus held them (Ray reports every 10 s: how many iterations
        # that covers depends on the host's speed).
        assert len(both) >= 3, (column, query.name, both)
        for t in both:
            row = rows[int(iteration[t])]
            seen.add(int(iteration[t]))
            want = float(row[column])
            assert math.isclose(series[t], want, rel_tol=1e-6), (t, column, series[t], row)
    runners = one_series(metrics_run, compared["runners_total"])
    assert set(runners.values()) == {WORKERS}
    print(f"figure dashboard iterations compared with metrics.csv: {sorted(seen)}")


# How late a figure can reach Prometheus: Ray's workers report to their node's agent every
# 10 s (metrics_report_interval_ms), Prometheus scrapes every 1 s, and a loaded host delays
# the driver's report further: beside two CPU-bound processes its iteration gauge was 5
# iterations behind the runners' counters, over 15 s late. A runner's counter and the
# driver's iteration gauge are each at most this late (scaled as every wait is).
REPORT_LAG_S = guard(30)


@pytest.mark.slow
def test_the_runners_env_steps_agree_with_metrics_csv_within_ray_s_reporting_lag(
    metrics_run: MetricsRun,
) -> None:
    """The runners' env step counters, summed (what the throughput panels take the rate
    of), against metrics.csv's env_steps_total. At instant t they hold what the runners had
    sampled at most REPORT_LAG_S earlier, so: at least what the iterations finished by the
    driver's figures at t - REPORT_LAG_S had sampled, at most what the iteration after those
    shown at t + REPORT_LAG_S sampled. No other tolerance: a runner counts exactly the env
    steps it returns to RLlib, which metrics.csv counts."""
    rows = csv_rows(metrics_run.run_dir)
    steps = {n: int(row["env_steps_total"]) for n, row in rows.items()}
    last = max(rows)
    values = dashboard_values(metrics_run)
    selector = f'stack=~"{values["stack"]}", run=~"{values["run"]}"'
    per_runner = over_the_run(
        metrics_run,
        dq.Query(
            "counters", "A", f"max by (runner) (ray_uerl_env_steps_total{{{selector}}})", "", False
        ),
    )
    assert len(per_runner) == WORKERS, list(per_runner)
    # Summed where every runner's counter is held (at the end one node's target goes stale
    # a scrape before another's).
    raw = {
        t: sum(series[t] for series in per_runner.values())
        for t in set.intersection(*(set(series) for series in per_runner.values()))
    }
    iteration = one_series(metrics_run, panel_query("Iteration and env steps trained", "A"))

    def shown(at: float) -> int | None:
        """The iteration the driver's gauge showed at `at` (None: none yet, or gone)."""
        held = [t for t in iteration if t <= at]
        return int(iteration[max(held)]) if held else None

    checked = 0
    for t, counted in sorted(raw.items()):
        before, after = shown(t - REPORT_LAG_S), shown(t + REPORT_LAG_S)
        low = steps[before] if before else 0
        high = steps[min(after + 1, last)] if after is not None else steps[last]
        assert low <= counted <= high, (t, counted, before, after, low, high)
        checked += 1
    print(f"figure dashboard env steps: counters {max(raw.values()):.0f} at most, "
          f"metrics.csv {steps[last]} ({checked} instants checked)")  # fmt: skip
    assert max(raw.values()) <= steps[last]
    # The throughput panels are that counter's rate: per runner and per game they add up
    # to the run's, at every instant.
    whole = one_series(metrics_run, panel_query("Run and learner throughput", "A"))
    for title in ("Env steps/s per runner", "Env steps/s per game"):
        parts = over_the_run(metrics_run, panel_query(title))
        assert len(parts) == WORKERS, (title, list(parts))
        for t, total in whole.items():
            assert math.isclose(sum(p.get(t, 0.0) for p in parts.values()), total,
                                rel_tol=1e-9, abs_tol=1e-9), (title, t)  # fmt: skip
    assert max(whole.values()) > 0


def game_events(run: MetricsRun) -> list[dict]:
    with (run.run_dir / "game_events.jsonl").open() as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.slow
def test_the_health_panels_show_the_killed_games_fault_and_reconnect(
    metrics_run: MetricsRun,
) -> None:
    """The faults and reconnects in the window, per runner, show those of game_events.jsonl
    (the kill: runner 1's game only; a window holds at least one, at most all of them); at
    the end every game is up, none down."""
    events = game_events(metrics_run)
    for ref, kind in (("A", "fault"), ("B", "recovery")):
        per_runner: dict[str, float] = {}
        panel = over_the_run(metrics_run, panel_query("Faults and reconnects", ref))
        for labels, series in panel.items():
            runner = json.loads(labels)["runner"]
            per_runner[runner] = max([per_runner.get(runner, 0.0), *series.values()])
        want = {str(e["runner_index"]) for e in events if e["kind"] == kind}
        assert {r for r, n in per_runner.items() if n > 0} == want, (kind, per_runner, events)
        # A game with none shows 0, not "no data".
        assert set(per_runner) == {str(i) for i in range(1, WORKERS + 1)}, per_runner
        for runner in want:
            count = sum(1 for e in events if e["kind"] == kind and str(e["runner_index"]) == runner)
            # A window holds one of them or more, never more than there were.
            assert 1 <= per_runner[runner] <= count, (kind, runner, per_runner, events)
    assert {str(e["runner_index"]) for e in events} == {"1"}, events
    up = over_the_run(metrics_run, panel_query("Games up"))
    assert len(up) == WORKERS, list(up)
    for query in (panel_query("Games down", "A"), panel_query("Games down", "B")):
        series = one_series(metrics_run, query)
        assert series[max(series)] == 0, (query.name, series)
    # Whenever a runner's sampling reached Prometheus, so did its game's state (set again
    # on every sample: Ray drops a gauge left unset for two report intervals, 20 s).
    values = dashboard_values(metrics_run)
    selector = f'stack=~"{values["stack"]}", run=~"{values["run"]}"'
    counted = over_the_run(
        metrics_run,
        dq.Query(
            "counters", "A", f"max by (runner) (ray_uerl_env_steps_total{{{selector}}})", "", False
        ),
    )
    up_by_runner = {json.loads(labels)["runner"]: series for labels, series in up.items()}
    for labels, series in counted.items():
        runner = json.loads(labels)["runner"]
        times = sorted(series)
        reported = [t for a, t in itertools.pairwise(times) if series[t] != series[a]]
        missing = [t for t in reported if t not in up_by_runner[runner]]
        assert not missing, (runner, reported, missing)


@pytest.mark.slow
def test_the_latency_percentiles_are_ordered_and_under_the_request_timeout(
    metrics_run: MetricsRun,
) -> None:
    """No step latency is in metrics.csv: the panel's percentiles are checked against each
    other and the run's 2 s request timeout (a step RPC never takes longer)."""
    p50, p90, p99, mean = (
        one_series(metrics_run, panel_query("Game step latency, all games", ref)) for ref in "ABCD"
    )
    both = [t for t in p50 if t in p90 and t in p99 and math.isfinite(p50[t])]
    assert both
    for t in both:
        assert 0 < p50[t] <= p90[t] <= p99[t] <= 2.0, (t, p50[t], p90[t], p99[t])
        assert 0 < mean[t] <= 2.0, (t, mean[t])
    per_game = over_the_run(metrics_run, panel_query("Game step latency p99 per game"))
    assert len(per_game) == WORKERS
    print(f"figure dashboard step latency at the end: p50 {p50[both[-1]] * 1e3:.2f} ms, "
          f"p90 {p90[both[-1]] * 1e3:.2f} ms, p99 {p99[both[-1]] * 1e3:.2f} ms")  # fmt: skip


CHECKPOINT_PANEL = "Newest checkpoint's age, and the store's lag"


@pytest.mark.slow
def test_the_checkpoint_age_panel_dates_a_checkpoint_the_run_wrote(
    metrics_run: MetricsRun,
) -> None:
    """time() - age is the publish time: within 5 s after a checkpoint directory was last
    written (the driver publishes right after the save)."""
    age = one_series(metrics_run, panel_query(CHECKPOINT_PANEL))
    written = [
        d.stat().st_mtime
        for d in (metrics_run.run_dir / "checkpoints").glob("checkpoint_*")
        if d.is_dir()
    ]
    stamps = {round(t - a, 3) for t, a in age.items()}
    for stamp in stamps:
        assert any(-1 <= stamp - m <= 5 for m in written), (stamp, sorted(written))
    assert all(a >= 0 for a in age.values())


@pytest.mark.slow
def test_the_store_lag_panel_dates_a_moment_of_the_run(metrics_run: MetricsRun) -> None:
    """A run kept in its directory is stored at once: time() - lag is when the driver
    last published, an instant of the run (after its start, before its end)."""
    lag = one_series(metrics_run, panel_query(CHECKPOINT_PANEL, "B"))
    assert lag and all(value >= 0 for value in lag.values())
    for t, value in lag.items():
        assert metrics_run.started_at - 1 <= t - value <= metrics_run.ended_at + 1, (t, value)
