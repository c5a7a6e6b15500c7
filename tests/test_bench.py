"""`uerl bench` measures the three stepping paths against a mock-ue process."""

from __future__ import annotations

import pytest

from training.commands import bench


def test_bench_reports_all_three_rates_and_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--envs", "2", "--seconds", "0.6", "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["gymnasium", "GymClient", "UEVectorEnv"]
    assert all("env-steps/s" in line for line in lines)
    assert "x in-process" in lines[1] and "x in-process" in lines[2]


def test_bench_rates_are_positive_for_a_continuous_action_env() -> None:
    result = bench.run("Pendulum-v1", num_envs=2, seconds=0.4, rounds=1)
    assert result.in_process_steps_per_s > 0
    assert result.client_steps_per_s > 0 and result.vector_env_steps_per_s > 0
