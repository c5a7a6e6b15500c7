"""`uerl eval` pieces: no two runs share a game, per-policy statistics, the episode loop."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.endpoints import Endpoints
from infra.topology import Topology
from training.local.local_endpoints import local_endpoints
from training.preflight.checks import NodeRoom, PreflightError, check_resources
from training.rllib.env_runner import (
    EvaluationRunnerRefused,
    UEEnvRunner,
    multi_agent_episode_summary,
)
from training.run.evaluation import (
    EvalError,
    EvalReport,
    check_fingerprints,
    check_policies,
    collect,
    policy_stats,
    weights_fingerprint,
)


def endpoints(workers: int = 2) -> Endpoints:
    topo = Topology.parse({"learners": {"replicas": 0}, "workers": {"replicas": workers}})
    return local_endpoints(topo, gcs_address="127.0.0.2:6379", client_port=10001, base_port=50000)


def worker_room(i: int, *, held: bool) -> NodeRoom:
    # A worker node: 1 ue_worker unit; an env runner of a running run holds it.
    return NodeRoom(
        f"node{i}", f"127.0.0.{i}", 0.0 if held else 1.0, 0.0, 0.0 if held else 1.0, 1.0
    )


# --------------------------------------------------------------- routing: one run per game


def test_an_rllib_evaluation_runner_is_refused_before_it_touches_a_game() -> None:
    from ray.rllib.algorithms.ppo import PPOConfig

    # RLlib numbers evaluation runners 1..N: runner 1 would go to training runner 1's game.
    config = PPOConfig().evaluation(evaluation_num_env_runners=2)
    eval_config = config.get_evaluation_config_object()
    assert eval_config.in_evaluation
    with pytest.raises(EvaluationRunnerRefused, match="runner 1 is an RLlib evaluation runner"):
        UEEnvRunner(config=eval_config, worker_index=1)


def test_a_run_cannot_start_while_another_runs_runners_hold_the_games() -> None:
    # The training run's two runners hold both games' units: eval finds none free.
    rooms = [worker_room(1, held=True), worker_room(2, held=True)]
    with pytest.raises(PreflightError, match=r"games are in use.*hold 2 of 2 unit\(s\)"):
        check_resources(endpoints(2), rooms)


def test_a_partly_held_cluster_is_refused_too() -> None:
    rooms = [worker_room(1, held=True), worker_room(2, held=False)]
    with pytest.raises(PreflightError, match="games are in use"):
        check_resources(endpoints(2), rooms)


def test_free_games_pass() -> None:
    rooms = [worker_room(1, held=False), worker_room(2, held=False)]
    assert check_resources(endpoints(2), rooms) == []


def test_a_cluster_without_enough_games_is_not_called_busy() -> None:
    rooms = [worker_room(1, held=False)]
    with pytest.raises(PreflightError) as info:
        check_resources(endpoints(2), rooms)
    assert "in use" not in str(info.value)
    assert "expected at least 2" in str(info.value)


def test_eval_runners_are_routed_exactly_like_training_runners() -> None:
    # Same endpoints, same routing: eval runner i talks to game i, which is why the
    # games must be free (above) rather than shared.
    from training.rllib.algorithm import connection_for

    ep = endpoints(3)
    connection = connection_for(ep)
    assert [connection.endpoint_for(i) for i in (1, 2, 3)] == [
        ep.worker_endpoint(i) for i in (1, 2, 3)
    ]


# --------------------------------------------------------------- statistics


@dataclass
class FakeAgentEpisode:
    rewards: list[float]

    def get_return(self) -> float:
        return sum(self.rewards)

    def __len__(self) -> int:
        return len(self.rewards)


@dataclass
class FakeEpisode:
    agent_episodes: dict[str, FakeAgentEpisode]
    mapping: dict[str, str]

    def module_for(self, agent_id: str) -> str:
        return self.mapping[agent_id]


def test_a_policys_episode_return_sums_its_agents_and_length_is_the_longest() -> None:
    episode = FakeEpisode(
        {
            "cart_0": FakeAgentEpisode([1.0] * 10),
            "cart_1": FakeAgentEpisode([1.0] * 12),
            "pendulum_0": FakeAgentEpisode([-2.0] * 200),
        },
        {"cart_0": "cart", "cart_1": "cart", "pendulum_0": "pendulum"},
    )
    assert multi_agent_episode_summary(episode) == {"cart": (22.0, 12), "pendulum": (-400.0, 200)}


def test_policy_stats_are_mean_std_min_max_and_mean_length() -> None:
    stats = policy_stats([(10.0, 10), (20.0, 20), (30.0, 30)])
    assert stats.episodes == 3
    assert (stats.return_mean, stats.return_min, stats.return_max) == (20.0, 10.0, 30.0)
    assert stats.return_std == pytest.approx(8.1649658)
    assert stats.episode_len_mean == 20.0


def test_collect_asks_until_enough_episodes_and_keeps_exactly_n() -> None:
    asked: list[int] = []

    def rounds(per_runner: int) -> list[dict]:
        asked.append(per_runner)
        one = {"p": (1.0, 5)}
        return [
            {"runner_index": 1, "endpoint": "g1", "episodes": [one] * per_runner},
            # A runner whose game is down returns nothing this round.
            {"runner_index": 2, "endpoint": "g2", "episodes": []},
        ]

    done, games = collect(rounds, episodes=5, num_runners=2, timeout_s=60, log=lambda _: None)
    assert len(done) == 5
    assert games == {"g1", "g2"}
    assert asked == [3, 1, 1]  # what is left, spread over both runners


def test_collect_gives_up_after_the_timeout_naming_what_finished() -> None:
    def rounds(per_runner: int) -> list[dict]:
        return [{"runner_index": 1, "endpoint": "g1", "episodes": []}]

    with pytest.raises(EvalError, match=r"only 0 of 3 episode\(s\) finished"):
        collect(rounds, episodes=3, num_runners=1, timeout_s=0.0, log=lambda _: None)


def test_a_checkpoint_for_another_game_is_refused_naming_both_policy_sets() -> None:
    with pytest.raises(EvalError, match=r"policies \['cartpole'\], the game defines \['pend"):
        check_policies(["pendulum"], ["cartpole"], Path("ckpt"))


def test_the_same_weights_as_tensors_or_arrays_have_the_same_fingerprint() -> None:
    # The driver holds the checkpoint's weights as arrays; a runner reports its own.
    import numpy as np
    import torch

    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.full(4, 0.5)}
    as_tensors = {"a": {k: torch.as_tensor(v) for k, v in weights.items()}}
    assert weights_fingerprint(as_tensors) == weights_fingerprint({"a": weights})


def test_weights_that_differ_but_sum_alike_are_refused_naming_runner_and_policy() -> None:
    import numpy as np

    loaded = {"a": {"w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)}}
    swapped = {"a": {"w": np.array([[2.0, 1.0], [3.0, 4.0]], np.float32)}}
    want = weights_fingerprint(loaded)
    got = [weights_fingerprint(loaded), weights_fingerprint(swapped)]
    with pytest.raises(EvalError, match=r"env runner 2: policy 'a' did not take the checkpoint"):
        check_fingerprints(want, got)


def test_report_json_round_trips_and_prints_one_row_per_policy() -> None:
    report = EvalReport(
        checkpoint="c",
        iteration=3,
        env_steps_trained=6000,
        explore=False,
        episodes=2,
        env_runners=2,
        games=["127.0.0.1:1", "127.0.0.1:2"],
        wall_s=1.0,
        policies={
            "cart": policy_stats([(20.0, 10), (22.0, 11)]),
            "pendulum": policy_stats([(-900.0, 200), (-1100.0, 200)]),
        },
    )
    assert EvalReport.model_validate(json.loads(report.model_dump_json())) == report
    rows = [line.split()[0] for line in report.table().splitlines()[2:]]
    assert rows == ["cart", "pendulum"]
    assert "deterministic actions" in report.table()


# --------------------------------------------------------------- a failed evaluation


@pytest.mark.parametrize("output", [None, "elsewhere/report.json"])
def test_a_failed_evaluation_says_so_and_writes_nothing_into_the_checkpoint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    output: str | None,
) -> None:
    # Before: "training failed", and its traceback in the user's checkpoint folder.
    from training.run import eval_outcome, evaluation
    from training.run.evaluation import EvalOptions

    checkpoint = tmp_path / "checkpoint_000001"
    checkpoint.mkdir()
    report = tmp_path / output if output else checkpoint / "eval.json"

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the algorithm could not be built")

    monkeypatch.setattr(evaluation, "run_eval", fails)
    options = EvalOptions(checkpoint=checkpoint, report_path=report)
    assert eval_outcome.eval_and_report(endpoints(), options, prog="uerl eval") == 1
    err = capsys.readouterr().err
    assert err.startswith("uerl eval: evaluation failed: RuntimeError: the algorithm could not")
    assert list(checkpoint.iterdir()) == []
    written = Path(err.split("full traceback: ")[1].strip())
    assert written.is_file() and "RuntimeError" in written.read_text()
    if output:
        assert written == report.with_name("eval-traceback.txt")
    written.unlink()
