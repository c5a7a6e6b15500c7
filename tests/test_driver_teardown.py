"""How a training driver lets Ray go: last, with nothing of RLlib's left to free.

A driver once died of SIGSEGV in the moments after `ray.shutdown()`, with its final
checkpoint written but its learning curve not. Here an IMPALA run (asynchronous: its
learner has requests in flight when it stops) watches the moment Ray is disconnected.

It is also the suite's one IMPALA run (APPO's: tests/test_algos.py), so it shows IMPALA
learning on uerl's env runners and games: finite losses, weights that move, every game
stepped, a checkpoint every iteration.
"""

from __future__ import annotations

import gc
import math
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import ray
from host_speed import CLUSTER_START_S
from ray.rllib.algorithms.algorithm import Algorithm
from run_artifacts import fingerprints, learner_losses

from infra.topology import Topology
from training.local.local_endpoints import local_endpoints
from training.local.ray_cluster import LocalRayCluster, topology_node_specs
from training.mock_ue import MockUEServer
from training.rllib import hparams as hp
from training.run.driver import CSV_NAME, PNG_NAME, TrainOptions, TrainResult, run_training

# A Ray cluster and a short IMPALA run: a hang guard, far above their loaded time.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

TOPOLOGY = Topology.parse({"learners": {"replicas": 1}, "workers": {"replicas": 2}})
# IMPALA learns asynchronously: its learner's first results come back in the third
# iteration (tests/test_algos.py).
ITERATIONS = 4


@dataclass
class AtShutdown:
    """What was true when the driver called `ray.shutdown()`."""

    calls: int = 0
    algorithms_alive: int = 0
    files: set[str] = field(default_factory=set)


@dataclass
class Run:
    result: TrainResult
    at_shutdown: AtShutdown
    run_dir: Path
    games: list[MockUEServer]

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


def _free_port_run(length: int) -> int:
    """A base port with `length` free ports after it (the games' ports)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + length > 65535:
            continue
        try:
            for offset in range(1, length + 1):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports on 127.0.0.1")


@pytest.fixture(scope="module")
def impala_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    run_dir = tmp_path_factory.mktemp("impala")
    base = _free_port_run(TOPOLOGY.workers.replicas)
    games = [
        MockUEServer("127.0.0.1", base + i, "CartPole-v1", 1)
        for i in range(1, TOPOLOGY.workers.replicas + 1)
    ]
    seen = AtShutdown()
    disconnect = ray.shutdown

    def watching_shutdown(*args: object, **kwargs: object) -> None:
        seen.calls += 1
        seen.algorithms_alive = sum(isinstance(o, Algorithm) for o in gc.get_objects())
        seen.files = {p.name for p in run_dir.iterdir()}
        disconnect(*args, **kwargs)

    options = TrainOptions(
        algo="IMPALA",
        iterations=ITERATIONS,
        run_dir=run_dir,
        checkpoint_dir=run_dir / "checkpoints",
        checkpoint_every=1,
        hparams=hp.merge("IMPALA"),
    )
    nodes = topology_node_specs(TOPOLOGY)
    with (
        pytest.MonkeyPatch.context() as patch,
        LocalRayCluster(nodes, start_timeout_s=CLUSTER_START_S) as cluster,
    ):
        for game in games:
            game.start()
        try:
            endpoints = local_endpoints(
                TOPOLOGY, gcs_address=cluster.address, client_port=cluster.client_port,
                base_port=base,
            )  # fmt: skip
            patch.setattr(ray, "shutdown", watching_shutdown)
            result = run_training(endpoints, options, log=lambda line: None)
        finally:
            for game in games:
                game.stop(grace=0)
    yield Run(result, seen, run_dir, games)


def test_the_run_trains_to_its_last_iteration(impala_run: Run) -> None:
    assert impala_run.result.failure is None
    assert [row.iteration for row in impala_run.result.rows] == list(range(1, ITERATIONS + 1))
    assert impala_run.result.env_steps_total > 0


def test_every_game_served_steps(impala_run: Run) -> None:
    assert all(game.stats.steps > 0 for game in impala_run.games), [
        game.stats for game in impala_run.games
    ]


def test_a_checkpoint_is_written_every_iteration_and_latest_names_the_last(
    impala_run: Run,
) -> None:
    names = sorted(p.name for p in impala_run.checkpoints.glob("checkpoint_*"))
    assert names == [f"checkpoint_{i:06d}" for i in range(1, ITERATIONS + 1)]
    assert (impala_run.checkpoints / "latest").read_text() == f"checkpoint_{ITERATIONS:06d}"


def test_the_learner_reports_finite_losses(impala_run: Run) -> None:
    losses = learner_losses(impala_run.run_dir)
    assert losses, "no learner loss reported"
    assert all(math.isfinite(v) for values in losses.values() for v in values), losses


def test_the_weights_move_between_the_first_and_the_last_checkpoint(impala_run: Run) -> None:
    first = fingerprints(impala_run.checkpoints / "checkpoint_000001")
    last = fingerprints(impala_run.checkpoints / f"checkpoint_{ITERATIONS:06d}")
    assert first.keys() == last.keys() and first
    assert all(first[pid] != last[pid] for pid in first), (first, last)


def test_no_algorithm_is_left_alive_when_ray_is_disconnected(impala_run: Run) -> None:
    assert impala_run.at_shutdown.calls >= 1
    assert impala_run.at_shutdown.algorithms_alive == 0


def test_the_metrics_and_learning_curve_are_written_before_ray_is_disconnected(
    impala_run: Run,
) -> None:
    assert {CSV_NAME, PNG_NAME} <= impala_run.at_shutdown.files
