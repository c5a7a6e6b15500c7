"""`uerl bench` measures the three stepping paths against a mock-ue process."""

from __future__ import annotations

import re

import pytest

from training.bench import stepping

RATE = re.compile(r"([\d,]+) env-steps/s")
STEPS = re.compile(r"([\d,]+) env-steps/s")
RATIO = re.compile(r"\((\d+\.\d\d)x in-process\)")


def test_a_rate_is_env_steps_over_the_elapsed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(stepping.time, "perf_counter", lambda: clock[0])

    def step(k: int) -> None:
        clock[0] += 0.25  # each vector step takes a quarter of a second

    tally = stepping._Tally()
    # Two passes over 2 actions reach the 1 s slice: 4 vector steps of 3 envs in 1 s.
    assert stepping._timed(step, 2, 1.0, 3, tally) == 12.0
    assert tally.calls == 4


def test_bench_prints_each_client_rate_as_its_fraction_of_in_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--envs", "2", "--seconds", "0.6", "--rounds", "2", "--e2e-iterations", "0"]
    assert stepping.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["sync", "python", "native"]
    rates = [float(m.group(1).replace(",", "")) for line in lines if (m := RATE.search(line))]
    ratios = [float(m.group(1)) for line in lines if (m := RATIO.search(line))]
    assert len(rates) == 3 and len(ratios) == 2, lines
    for rate, ratio in zip(rates[1:], ratios, strict=True):
        # Rates are printed rounded to whole steps/s, ratios to 0.01.
        assert ratio == pytest.approx(rate / rates[0], abs=0.011), lines
    # Which path is faster is a figure the bench prints, not a check: a 0.6 s window on a
    # loaded host can starve any one path (the in-process one ran at 7,943 steps/s against
    # the native path's 12,270 beside the Kubernetes tier).
    assert all(rate > 0 for rate in rates), lines


def test_every_path_reports_its_cpu_per_step_for_a_continuous_action_env() -> None:
    result = stepping.run("Pendulum-v1", num_envs=2, seconds=0.4, rounds=1)
    assert list(result.paths) == ["in_process", "python", "native"]
    assert all(result.ratio(name) > 0 for name in ("python", "native")), result
    # The client's CPU per step is measured (the game's is in clock ticks: may read 0 here).
    assert all(p.cpu_us is not None and p.cpu_us > 0 for p in result.paths.values()), result


# A hang guard: six short PPO paths, minutes at most on a loaded host.
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_end_to_end_ppo_reports_each_path_against_rllibs_single_agent_ppo(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--envs", "2", "--seconds", "0.2", "--rounds", "1"]
    # A small batch: this checks what the bench reports, not the figures (`make bench`).
    e2e = ["--e2e-envs", "2", "--e2e-iterations", "1", "--e2e-batch-size", "256"]
    assert stepping.main([*argv, *e2e]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("PPO")]
    labels = [line.removeprefix("PPO").split(" x")[0].strip() for line in lines]
    assert labels == [
        "RLlib single-agent", "RLlib multi-agent", "RLlib single-agent, env behind a round trip",
        "uerl python client", "uerl native client", "uerl native client, multi-agent runner",
    ], lines  # fmt: skip
    for line in lines:
        iterations, sampling = (float(x.replace(",", "")) for x in STEPS.findall(line))
        assert sampling > 0 and iterations > 0 and "MiB" in line, line
    # Every path but the baseline says what fraction of it, for both rates.
    assert all(len(re.findall(r"\(\d+\.\d\dx\)", line)) == 2 for line in lines[1:]), lines


def test_bench_runner_prints_each_runner_against_rllibs_in_process_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from training.bench import runner_step

    assert runner_step.main(["--steps", "200", "--rounds", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"mock game: \d+ us of CPU per step of 1 environment\(s\)", out[0]), out
    runners = [line for line in out if line.startswith("runner")]
    assert [line.split(" x1:")[0].removeprefix("runner").strip() for line in runners] == list(
        runner_step.LABELS.values()
    ), runners
    # Every path but the in-process one says how much longer its step takes.
    assert all(re.search(r"us/step  \(\d+\.\d\dx the time\)$", line) for line in runners[1:])


def test_the_sampling_clock_times_each_of_ppos_sampling_calls_and_puts_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from ray.rllib.algorithms.ppo import ppo

    from training.bench.end_to_end import SamplingClock

    def slow_sample(*_args: object, **_kwargs: object) -> str:
        time.sleep(0.05)
        return "episodes"

    monkeypatch.setattr(ppo, "synchronous_parallel_sample", slow_sample)
    with SamplingClock() as clock:
        assert ppo.synchronous_parallel_sample(worker_set=None) == "episodes"
        assert 0.05 <= clock.last_s < 10.0  # the sleep, however loaded the host
    assert ppo.synchronous_parallel_sample is slow_sample


def test_the_metrics_cost_runs_the_first_path_again_publishing_and_then_not() -> None:
    # A/A beside A/B: the gap between two identical paths says what gap is noise.
    from training.bench import end_to_end

    paths = end_to_end._uerl_paths(["python", "native"], metrics_cost=True)
    assert list(paths) == [
        "python",
        "native",
        "native_multi_agent",
        "metrics_on_again",
        "metrics_off",
    ]
    assert paths["metrics_on_again"] == paths["metrics_off"] == paths["python"]
    assert set(stepping.E2E_LABELS) >= {"rllib", "multi_agent", "rllib_trip", *paths}
