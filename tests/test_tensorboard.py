"""TensorBoard: each iteration's scalars land in an event file TensorBoard itself reads."""

from __future__ import annotations

import math
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from training.run.metrics import IterationRow
from training.run.tensorboard import TensorBoardWriter, scalars_for


def row(iteration: int, steps: int, ret: float = 20.0) -> IterationRow:
    return IterationRow(
        iteration=iteration,
        env_steps_total=steps,
        episodes_total=iteration * 10,
        time_s=2.0,
        env_steps_per_s=1000.0,
        episode_return_mean=ret,
        episode_len_mean=20.0,
        learner_steps_per_s=9000.0,
        runners_healthy=1,
        runners_total=3,
        runners_unknown=1,
    )


# The shape of `Algorithm.train()`'s result for a two-policy PPO run (new API stack).
RESULT = {
    "env_runners": {"module_episode_returns_mean": {"cart": 21.0, "pendulum": -1200.0}},
    "learners": {
        "__all_modules__": {"num_env_steps_trained_throughput": 9000.0},
        "cart": {"policy_loss": -0.01, "vf_loss": 3.5, "entropy": 0.69, "curr_kl_coeff": 0.2},
        "pendulum": {"policy_loss": 0.02, "vf_loss": 100.0, "entropy": 1.4},
    },
}
RUNNERS = {
    1: {"healthy": True, "down_for_s": 0.0},
    2: {"healthy": False, "down_for_s": 4.5},
}


def test_scalars_cover_return_length_throughput_losses_and_runner_health() -> None:
    tags = scalars_for(row(1, 2000), RESULT, RUNNERS)
    assert tags["uerl/episode_return_mean"] == 20.0
    assert tags["uerl/episode_len_mean"] == 20.0
    assert tags["uerl/env_steps_per_s"] == 1000.0
    assert tags["uerl/learner_steps_per_s"] == 9000.0
    assert (tags["uerl/runners_healthy"], tags["uerl/runners_total"]) == (1.0, 3.0)
    assert tags["uerl/runners_unknown"] == 1.0
    assert tags["policy/pendulum/episode_return_mean"] == -1200.0
    assert tags["learner/cart/vf_loss"] == 3.5
    assert tags["learner/pendulum/entropy"] == 1.4
    assert (tags["runner/1/healthy"], tags["runner/2/healthy"]) == (1.0, 0.0)
    assert tags["runner/2/down_for_s"] == 4.5
    assert not any(tag.startswith("learner/__all_modules__") for tag in tags)


def test_nan_values_are_left_out_rather_than_plotted() -> None:
    tags = scalars_for(row(1, 2000, ret=math.nan), {}, {})
    assert "uerl/episode_return_mean" not in tags


def test_event_file_is_readable_by_tensorboard_with_env_steps_as_x(tmp_path: Path) -> None:
    writer = TensorBoardWriter(tmp_path)
    writer.write(row(1, 2000, ret=20.0), RESULT, RUNNERS)
    writer.write(row(2, 4000, ret=30.0), RESULT, RUNNERS)
    writer.close()
    (event_file,) = tmp_path.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(event_file))
    acc.Reload()
    points = acc.Scalars("uerl/episode_return_mean")
    assert [(p.step, p.value) for p in points] == [(2000, 20.0), (4000, 30.0)]
    assert "learner/cart/policy_loss" in acc.Tags()["scalars"]


def test_each_iteration_is_on_disk_before_the_next_one(tmp_path: Path) -> None:
    # TensorBoard watching a running training sees every finished iteration.
    writer = TensorBoardWriter(tmp_path)
    writer.write(row(1, 2000), RESULT, RUNNERS)
    (event_file,) = tmp_path.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(event_file))
    acc.Reload()
    assert len(acc.Scalars("uerl/env_steps_per_s")) == 1
    writer.close()


def test_a_resumed_run_plots_each_step_once_with_the_resumed_value(tmp_path: Path) -> None:
    lost = TensorBoardWriter(tmp_path)  # got to 300 env steps; its checkpoint was at 200
    for iteration, steps in enumerate((100, 200, 300), start=1):
        lost.write(row(iteration, steps, ret=1.0), RESULT)
    lost.close()
    resumed = TensorBoardWriter(tmp_path, resumed_at=200)
    for iteration, steps in ((3, 300), (4, 400)):
        resumed.write(row(iteration, steps, ret=2.0), RESULT)
    resumed.close()
    # Two event files in one directory, read as TensorBoard reads a run.
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    points = [(e.step, e.value) for e in acc.Scalars("uerl/episode_return_mean")]
    assert points == [(100, 1.0), (200, 1.0), (300, 2.0), (400, 2.0)]
