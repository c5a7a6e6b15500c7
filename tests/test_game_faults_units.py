"""The pieces that let training survive games dying: health records, the driver's board,
the restart policy, and finding the game error inside RLlib's wrapping."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import pytest

from infra.topology import Topology
from training.local.local_endpoints import local_endpoints
from training.local.restart_policy import RestartPolicy
from training.policies.game_spec import GameSpec
from training.protocol.errors import UEConnectionError
from training.protocol.game_definition import AgentSpec
from training.rllib.algorithm import build_algo_config
from training.rllib.env_runner import UEEnvRunner, _game_fault
from training.rllib.game_health import GameHealth
from training.run import metrics
from training.run.runner_health import RunnerHealthBoard


def test_an_outage_is_one_fault_event_however_many_calls_fail() -> None:
    health = GameHealth(2, "127.0.0.1:5002")
    health.fault("went away", now=100.0)
    health.fault("still refused", now=101.0)
    assert not health.healthy and health.faults == 1
    assert health.last_error == "still refused"
    assert [e.kind for e in health.events] == ["fault"]


def test_a_recovery_records_how_long_the_game_was_down() -> None:
    health = GameHealth(1, "h:1")
    health.fault("gone", now=10.0)
    health.recovered(now=13.5)
    assert health.healthy and health.last_recovery_at == 13.5
    assert health.events[-1].kind == "recovery" and health.events[-1].down_for_s == 3.5


def test_a_report_hands_over_the_events_once() -> None:
    health = GameHealth(1, "h:1")
    health.fault("gone")
    assert len(health.report()["events"]) == 1
    assert health.report()["events"] == []


def _report(index: int, *, healthy: bool, down_for_s: float = 0.0, events=()) -> dict:
    return {
        "runner_index": index,
        "endpoint": f"127.0.0.1:{5000 + index}",
        "healthy": healthy,
        "down_for_s": down_for_s,
        "faults": 1,
        "last_error": "" if healthy else "did not answer UpdateState(step) within 5 s",
        "last_recovery_at": None,
        "events": list(events),
    }


def test_the_board_prints_one_line_per_failure_and_recovery() -> None:
    board = RunnerHealthBoard(3, give_up_after_s=60)
    lines = board.update(
        [
            _report(
                2,
                healthy=True,
                events=[
                    {"kind": "fault", "at": 1.0, "message": "went away", "down_for_s": 0.0},
                    {"kind": "recovery", "at": 4.0, "message": "sampling again", "down_for_s": 3.0},
                ],
            ),
        ]
    )
    assert len(lines) == 2
    assert "env runner 2 (127.0.0.1:5002) failed: went away" in lines[0]
    assert "is back after 3.0 s" in lines[1]


def test_the_board_counts_a_runner_that_never_reported_as_unknown_not_healthy() -> None:
    board = RunnerHealthBoard(3, give_up_after_s=60)
    board.update([_report(1, healthy=False, down_for_s=2), _report(2, healthy=True)])
    assert (board.healthy, board.unknown) == (1, 1)


def test_the_board_counts_a_runner_that_did_not_answer_this_round_as_unknown() -> None:
    board = RunnerHealthBoard(2, give_up_after_s=60)
    board.update([_report(1, healthy=True), _report(2, healthy=True)])
    board.update([_report(1, healthy=True)])  # runner 2's report is from the round before
    assert (board.healthy, board.unknown) == (1, 1)


def test_the_board_gives_up_only_when_every_game_is_down_past_the_limit() -> None:
    board = RunnerHealthBoard(2, give_up_after_s=30)
    board.update([_report(1, healthy=False, down_for_s=100), _report(2, healthy=True)])
    assert board.give_up_reason() is None
    board.update([_report(2, healthy=False, down_for_s=10)])
    assert board.give_up_reason() is None
    board.update([_report(2, healthy=False, down_for_s=31)])
    reason = board.give_up_reason()
    assert reason is not None and "127.0.0.1:5001" in reason and "127.0.0.1:5002" in reason
    assert "--game-down-limit" in reason


def test_restart_delays_double_up_to_the_maximum() -> None:
    policy = RestartPolicy(max_restarts=6, initial_s=0.5, max_delay_s=3.0)
    delays = [policy.next_delay(uptime_s=1.0) for _ in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_game_that_stayed_up_restarts_after_the_initial_delay_again() -> None:
    policy = RestartPolicy(initial_s=0.5, stable_after_s=60.0)
    policy.next_delay(uptime_s=1.0)
    policy.next_delay(uptime_s=1.0)
    assert policy.next_delay(uptime_s=120.0) == 0.5


def test_past_the_cap_there_is_no_next_restart() -> None:
    policy = RestartPolicy(max_restarts=2, initial_s=0.5)
    assert policy.next_delay(uptime_s=0) == 0.5
    assert policy.next_delay(uptime_s=0) == 1.0
    assert policy.next_delay(uptime_s=0) is None
    assert policy.restarts == 2


def test_the_game_error_is_found_behind_rllibs_runtime_error() -> None:
    cause = UEConnectionError("h:1", "UpdateState(step)", "went away during UpdateState(step)")
    try:
        try:
            raise cause
        except UEConnectionError as exc:
            raise RuntimeError("env step failed") from exc
    except RuntimeError as wrapped:
        assert _game_fault(wrapped) is cause
    assert _game_fault(ValueError("model bug")) is None


# ------------------------------------------- runner actors that die (not their games)


def _training_config(**options: Any) -> Any:
    """The config `uerl train` builds for 2 workers and a CartPole-like game."""
    topo = Topology.parse({"learners": {"replicas": 0}, "workers": {"replicas": 2}})
    endpoints = local_endpoints(
        topo, gcs_address="127.0.0.2:6379", client_port=10001, base_port=50000
    )
    agent = AgentSpec("cartpole", gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2))
    return build_algo_config(endpoints, GameSpec(num_envs=1, agents={"agent_0": agent}), **options)


def test_the_sample_timeout_bounds_each_iterations_wait_for_samples() -> None:
    # With every game down an iteration ends only at this timeout: it bounds the give-up.
    assert _training_config().sample_timeout_s == 60.0  # RLlib's default, kept
    assert _training_config(sample_timeout_s=10.0).sample_timeout_s == 10.0


def test_env_runner_actors_are_created_for_ray_to_restart_when_they_die(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray
    from ray.rllib.env.env_runner_group import EnvRunnerGroup

    # The arguments RLlib creates the runner actors with; no Ray cluster, no actor.
    monkeypatch.setattr(ray, "put", lambda value: value)
    group = EnvRunnerGroup(config=_training_config(), _setup=False)
    # Ray restarts an actor whose process or node died up to max_restarts times.
    assert group._remote_args["max_restarts"] == 1000
    assert group._remote_args["resources"] == {"ue_worker": 1}


def test_a_runner_whose_call_raised_exits_to_be_restarted_after_2_s_not_60(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.rllib.utils import actor_manager

    slept: list[float] = []
    monkeypatch.setattr(actor_manager.time, "sleep", slept.append)
    runner = SimpleNamespace(config=_training_config())

    def broken(_runner: Any) -> None:
        raise RuntimeError("not a game fault: a bug in the runner")

    # RLlib's own `apply` (UEEnvRunner keeps it): wait, then exit for Ray to restart it.
    with pytest.raises(SystemExit):
        UEEnvRunner.apply(runner, broken)  # type: ignore[arg-type]
    assert slept == [2.0]


def test_csv_without_runner_columns_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text(
        "iteration,env_steps_total,episodes_total,time_s,env_steps_per_s,"
        "episode_return_mean,episode_len_mean,learner_steps_per_s\n"
        "1,2000,10,5.0,400.0,20.0,20.0,nan\n"
    )
    (row,) = metrics.read_csv(path)
    assert row.iteration == 1 and row.runners_total == 0 and math.isnan(row.learner_steps_per_s)


def test_the_progress_line_shows_healthy_runners() -> None:
    row = metrics.IterationRow(3, 6000, 30, 5.0, 400.0, 25.0, 25.0, 9000.0, 2, 3)
    assert metrics.progress_line(row).endswith("| runners 2/3")


def test_the_progress_line_shows_runners_without_a_report_apart() -> None:
    row = metrics.IterationRow(3, 6000, 30, 5.0, 400.0, 25.0, 25.0, 9000.0, 2, 3, 1)
    assert metrics.progress_line(row).endswith("| runners 2/3, 1 unknown")


def test_a_runner_that_refused_its_game_stops_the_run_with_its_line_at_once() -> None:
    board = RunnerHealthBoard(2, give_up_after_s=60)
    refused = {**_report(2, healthy=True), "refused": "--policies ctde needs every agent to act"}
    board.update([_report(1, healthy=True), refused])
    assert board.give_up_reason() == (
        "env runner 2 (127.0.0.1:5002): --policies ctde needs every agent to act"
    )


def test_a_refusal_is_kept_in_the_runners_reports() -> None:
    health = GameHealth(1, "h:1")
    health.refuse("first reason")
    health.refuse("second reason")
    assert health.report()["refused"] == health.report()["refused"] == "first reason"
