"""The training loop's stop rules (`uerl train`, `uerl local`), driven by a stand-in for
RLlib's Algorithm: no Ray, no games; real checkpoints' metadata, CSV and signals."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from training.run import checkpoints, metrics
from training.run.driver import CSV_NAME, TrainOptions, _loop
from training.run.iteration_sinks import Iteration
from training.run.runner_health import RunnerHealthBoard
from training.run.stop import StopRequest

STEPS_PER_ITERATION = 500


class FakeAlgorithm:
    """What `_loop` uses of an RLlib Algorithm. Like RLlib (the resume in
    tests/test_rescale_e2e.py shows it on a real run), a restored algorithm continues the
    checkpoint's iteration and its lifetime env-step count."""

    def __init__(self, *, on_train: Any = None) -> None:
        self.iteration = 0
        self.env_steps = 0
        self.trained: list[int] = []
        self.saved: list[int] = []
        self.on_train = on_train
        self.config = SimpleNamespace(normalize_actions=True, clip_actions=False, env_config={})
        self.env_runner_group = SimpleNamespace(foreach_env_runner=lambda *a, **k: [])

    def restore_from_path(self, path: str) -> None:
        meta = checkpoints.read_meta(Path(path))
        self.iteration, self.env_steps = meta.iteration, meta.env_steps_total

    def train(self) -> dict[str, Any]:
        self.iteration += 1
        if self.on_train is not None:
            self.on_train(self.iteration)
        self.env_steps += STEPS_PER_ITERATION
        self.trained.append(self.iteration)
        return {
            "training_iteration": self.iteration,
            "time_this_iter_s": 1.0,
            "env_runners": {"num_env_steps_sampled_lifetime": self.env_steps},
        }

    def save_to_path(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        self.saved.append(self.iteration)


def options(tmp_path: Path, **values: Any) -> TrainOptions:
    return TrainOptions(
        run_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints", hparams={}, **values
    )


def earlier_run(tmp_path: Path, iterations: int) -> None:
    """What a finished run leaves: its checkpoint (and `latest`) and its metrics CSV."""
    algo = FakeAlgorithm()
    rows = []
    for _ in range(iterations):
        previous = algo.env_steps
        rows.append(metrics.row_from_result(algo.train(), previous_steps=previous))
    meta = checkpoints.CheckpointMeta(iterations, algo.env_steps, "PPO")
    checkpoints.save(algo, tmp_path / "checkpoints", meta)
    metrics.write_csv(tmp_path / CSV_NAME, rows)


def test_timesteps_count_the_resumed_checkpoints_steps(tmp_path: Path) -> None:
    earlier_run(tmp_path, iterations=4)  # 2,000 env steps
    algo = FakeAlgorithm()
    result = _loop(
        algo,
        options(tmp_path, timesteps=3000, resume="latest"),
        StopRequest(),
        lambda line: None,
        RunnerHealthBoard(2, give_up_after_s=300),
    )
    # 1,000 more steps, not 3,000 more: the total counts the first run's 2,000.
    assert algo.trained == [5, 6]
    assert [r.env_steps_total for r in result.rows] == [500, 1000, 1500, 2000, 2500, 3000]


def test_a_second_ctrl_c_aborts_the_iteration_without_a_final_checkpoint(
    tmp_path: Path,
) -> None:
    def ctrl_c_twice_in_iteration_3(iteration: int) -> None:
        if iteration == 3:
            os.kill(os.getpid(), signal.SIGINT)  # stop after this iteration...
            os.kill(os.getpid(), signal.SIGINT)  # ...no: abort now

    algo = FakeAlgorithm(on_train=ctrl_c_twice_in_iteration_3)
    with StopRequest() as stop, pytest.raises(KeyboardInterrupt):
        _loop(
            algo,
            options(tmp_path, iterations=10, checkpoint_every=1),
            stop,
            lambda line: None,
            RunnerHealthBoard(2, give_up_after_s=300),
        )
    # Iteration 3 never finished, and nothing was saved after the signals.
    assert algo.trained == [1, 2]
    assert algo.saved == [1, 2]


def test_a_single_ctrl_c_finishes_the_iteration_and_writes_a_final_checkpoint(
    tmp_path: Path,
) -> None:
    def ctrl_c_in_iteration_3(iteration: int) -> None:
        if iteration == 3:
            os.kill(os.getpid(), signal.SIGINT)

    algo = FakeAlgorithm(on_train=ctrl_c_in_iteration_3)
    with StopRequest() as stop:
        result = _loop(
            algo,
            options(tmp_path, iterations=10, checkpoint_every=5),
            stop,
            lambda line: None,
            RunnerHealthBoard(2, give_up_after_s=300),
        )
    assert result.interrupted
    assert algo.trained == [1, 2, 3]
    assert algo.saved == [3]


def test_each_checkpoint_says_its_size_and_how_long_it_took(tmp_path: Path) -> None:
    lines: list[str] = []
    _loop(
        FakeAlgorithm(),
        options(tmp_path, iterations=4, checkpoint_every=2),
        StopRequest(),
        lines.append,
        RunnerHealthBoard(2, give_up_after_s=300),
    )
    written = [line for line in lines if " written: " in line]
    assert [line.split()[0] for line in written] == ["checkpoint_000002", "checkpoint_000004"]
    shape = r"\S+ written: \d+\.\d MiB in [\d.]+ s \(RLlib's state [\d.]+ s, storing [\d.]+ s\)"
    assert all(re.fullmatch(shape, line) for line in written), written


class RecordingSink:
    """An IterationSink that writes down what it is told, in order."""

    def __init__(self) -> None:
        self.heard: list[Any] = []

    def iteration(self, done: Iteration) -> None:
        self.heard.append(("iteration", done.row.iteration, done.rescales))

    def checkpoint_written(self) -> None:
        self.heard.append("checkpoint")

    def stored_through(self, iteration: float) -> None:
        self.heard.append(("stored", iteration))

    def close(self) -> None:
        self.heard.append("closed")


def test_each_sink_hears_every_iteration_then_its_checkpoint_then_its_store_then_the_end(
    tmp_path: Path,
) -> None:
    sink = RecordingSink()
    _loop(
        FakeAlgorithm(),
        options(tmp_path, iterations=3, checkpoint_every=2),
        StopRequest(),
        lambda line: None,
        RunnerHealthBoard(2, give_up_after_s=300),
        store=lambda: 1.0,
        sinks=[sink],
    )
    assert sink.heard == [
        ("iteration", 1, 0), ("stored", 1.0),
        ("iteration", 2, 0), "checkpoint", ("stored", 1.0),
        ("iteration", 3, 0), ("stored", 1.0),
        "checkpoint",  # the final checkpoint, iteration 3
        "closed",
    ]  # fmt: skip
