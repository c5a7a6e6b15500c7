"""uerl's own metrics, scraped from the Ray nodes' metrics agents of a real `uerl local`
run (the HTTP endpoints Prometheus would scrape), while it trains and a game is killed.

One run for the module: the scrapes are taken while it trains, the checks read them
against the run's own metrics.csv once it has ended.
"""

from __future__ import annotations

import csv
import json
import math
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from host_speed import guard
from local_runs import LocalRunWatcher, retry_signal
from proc_tree import Deadline, StartedProcesses
from prometheus_client.parser import text_string_to_metric_families

from training.local.session import METRICS_TARGETS_FILE
from training.telemetry import ray_metrics as rm

ITERATIONS = 10
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


@pytest.fixture(scope="module")
def metrics_run(tmp_path_factory: pytest.TempPathFactory) -> MetricsRun:
    run_dir = tmp_path_factory.mktemp("metrics") / "run"
    with StartedProcesses() as started:
        deadline = Deadline(guard(900))
        run = LocalRunWatcher(
            started, deadline, run_dir,
            "--workers", str(WORKERS), "--iterations", str(ITERATIONS),
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
        while run.proc.poll() is None:
            try:
                samples = scrape_all(urls)
            except OSError:  # the nodes stopping at the end
                break
            during.append(samples)
            faults = by_runner(samples, rm.GAME_FAULTS)
            up = by_runner(samples, rm.GAME_UP)
            if not after_fault and faults.get("1", 0) >= 1 and up.get("1") == 1:
                after_fault = samples
            time.sleep(1)
        code = run.finish(timeout_s=guard(600))
        watching.send_signal(signal.SIGINT)
        watch_output, _ = watching.communicate(timeout=deadline.left(guard(30)))
    return MetricsRun(
        run_dir, run.output, code, urls, targets, during, after_fault,
        watching.returncode, watch_output,
    )  # fmt: skip


def csv_rows(run_dir: Path) -> dict[int, dict[str, str]]:
    with (run_dir / "metrics.csv").open() as fh:
        return {int(row["iteration"]): row for row in csv.DictReader(fh)}


@pytest.mark.slow
def test_the_run_says_where_its_metrics_are_and_lists_every_node_as_a_scrape_target(
    metrics_run: MetricsRun,
) -> None:
    assert metrics_run.code == 0, metrics_run.output
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
    assert max(rows) == ITERATIONS
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
