"""Building the algorithm: RLlib's obscure failure when no env runner started, made clear.

The failure is RLlib 2.60's own, on a real cluster of `ray start` raylets: every
env runner actor dies in its creation task (its game is not there), RLlib's fault
tolerance (`restart_failed_env_runners`, as uerl configures it) logs and drops
them, and `Algorithm.setup` then fails inferring the spaces from no runner at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from host_speed import CLUSTER_START_S

from training.local.ray_cluster import NODE_IP, LocalRayCluster, node_specs
from training.mock_ue import MockUEServer
from training.policies.game_spec import GameSpec
from training.preflight.discovery import discover
from training.rllib.algorithm import build_ppo_config
from training.rllib.env_runner import UEConnection
from training.run.driver import EnvRunnersDidNotStart, _build_algo


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """Head with no CPUs and two 1-CPU worker nodes; this process is the driver."""
    import ray

    specs = node_specs(
        learners=0, learner_cpus=1, workers=2, worker_cpus=1, custom_resource="ue_worker"
    )
    with LocalRayCluster(specs, start_timeout_s=CLUSTER_START_S) as cluster:
        ray.init(address=cluster.address, _node_ip_address=NODE_IP, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture
def cartpole(mock_ue: Callable[..., MockUEServer]) -> GameSpec:
    return discover(mock_ue("CartPole-v1").address, timeout_s=5)


def test_no_env_runner_started_is_reported_with_the_count_and_what_to_check(
    ray_cluster: None, cartpole: GameSpec, closed_port: int
) -> None:
    # Both runners' games are at a port nothing listens on: each actor dies in __init__.
    connection = UEConnection(url_template="127.0.0.1", port=closed_port, startup_timeout_s=1)
    config = build_ppo_config(cartpole, connection, num_env_runners=2).fault_tolerance(
        restart_failed_env_runners=True
    )
    with pytest.raises(
        EnvRunnersDidNotStart, match=r"none of the 2 env runner\(s\) started"
    ) as info:
        _build_algo(config, 2)
    assert isinstance(info.value.__cause__, IndexError)


def test_other_build_failures_pass_through_unchanged(
    ray_cluster: None, cartpole: GameSpec, closed_port: int
) -> None:
    connection = UEConnection(url_template="127.0.0.1", port=closed_port, startup_timeout_s=1)
    config = build_ppo_config(
        cartpole, connection, num_env_runners=2, train_batch_size=100, minibatch_size=500
    )
    with pytest.raises(ValueError, match="minibatch_size"):
        _build_algo(config, 2)
