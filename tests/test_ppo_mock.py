"""PPO (RLlib new API stack) trains against two mock games through uerl's env runners
(the single-agent one for CartPole, the multi-agent one for TwoTeams)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from host_speed import CLUSTER_START_S

from training.local.ray_cluster import NODE_IP, LocalRayCluster, node_specs
from training.mock_ue import TWO_TEAMS, MockUEServer
from training.probe.discovery import discover
from training.rllib.algorithm import build_ppo_config, policy_names
from training.rllib.env_runner import UEConnection


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A real cluster of `ray start` raylets (head with no CPUs, two 1-CPU worker
    nodes), with this process as its driver."""
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


# A hang guard: a Ray cluster and a short run, minutes at most on a loaded host.
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("env_id", ["CartPole-v1", TWO_TEAMS])
def test_ppo_trains_two_iterations_against_two_mock_games(
    mock_ue_row: Callable[..., list[MockUEServer]],
    ray_cluster: None,
    env_id: str,
) -> None:
    servers = mock_ue_row(2, env_id, num_envs=4)
    game = discover(servers[0].address, timeout_s=5)
    connection = UEConnection(
        url_template="127.0.0.1",
        port=servers[0].port - 1,
        port_offset_mode="per_worker",
        startup_timeout_s=20,
    )
    config = build_ppo_config(
        game,
        connection,
        num_env_runners=2,
        train_batch_size=512,
        minibatch_size=128,
        num_epochs=1,
        seed=0,
    )
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    sampled = [r["env_runners"]["num_env_steps_sampled"] for r in results]
    assert all(n >= 512 for n in sampled)
    # RLlib's module ids, by the game's policy ids (the single-agent path's module is
    # RLlib's `default_policy`).
    names = {policy: module for module, policy in policy_names(config).items()}
    modules = [names.get(policy, policy) for policy in game.policy_ids()]
    learned = results[-1]["learners"]
    assert set(modules) <= set(learned)
    for module in modules:
        # Lifetime: in the multi-agent game a policy may sit out one iteration (its agents
        # all done while the pendulum runs on), but each must have been trained.
        assert learned[module]["num_module_steps_trained_lifetime"] > 0
    stats = [s.stats for s in servers]
    # Each game served exactly its own env runner (the first also served discovery).
    assert [s.sessions_opened for s in stats] == [2, 1]
    assert all(s.sessions_superseded == 0 for s in stats)
    assert all(s.steps >= 2 * 512 // (2 * 4) for s in stats)
    assert [s.sessions_closed for s in stats] == [2, 1]  # algo.stop() sends CLOSED
