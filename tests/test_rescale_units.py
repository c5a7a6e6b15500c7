"""Live rescale, the parts without a cluster: the plan, new games' admission, the endpoints
watch, the health board following the runners, the train batch split, the driver's pause."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.endpoints import Endpoints
from infra.topology import Topology
from training.local.scaling import ScaleError, request_scale
from training.rescale.admission import MAX_RETRY_S, Admission
from training.rescale.endpoints_watch import EndpointsWatch
from training.rescale.plan import RescalePlan, Runner, plan_rescale
from training.rescale.runner_pool import fragment_lengths
from training.run.driver import TrainOptions, _loop
from training.run.runner_health import RunnerHealthBoard
from training.run.stop import StopRequest


def runners(*slots: int) -> list[Runner]:
    return [Runner(actor_id=i, worker_index=i, slot=s) for i, s in enumerate(slots, start=1)]


# -- the plan ------------------------------------------------------------------


def test_growing_adds_a_runner_for_each_new_game_slot() -> None:
    assert plan_rescale(runners(1, 2), 4) == RescalePlan(add_slots=(3, 4))


def test_shrinking_removes_the_runners_of_the_games_that_left() -> None:
    plan = plan_rescale(runners(1, 2, 3, 4), 1)
    assert [r.slot for r in plan.remove] == [2, 3, 4] and plan.add_slots == ()


def test_a_slot_freed_earlier_is_filled_again_by_a_new_runner() -> None:
    # 4 -> 1 -> 3: runners 5 and 6 serve slots 2 and 3, whatever RLlib would number them.
    current = [Runner(1, 1, 1)]
    assert plan_rescale(current, 3).add_slots == (2, 3)


def test_two_runners_on_one_game_leave_one() -> None:
    plan = plan_rescale([Runner(1, 1, 1), Runner(7, 7, 1)], 1)
    assert [r.worker_index for r in plan.remove] == [7]


def test_the_same_size_plans_nothing() -> None:
    assert plan_rescale(runners(1, 2), 2).empty


def test_zero_games_remove_every_runner() -> None:
    assert len(plan_rescale(runners(1, 2), 0).remove) == 2


# -- admission of new games ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_new_game_that_does_not_answer_is_retried_with_growing_delays() -> None:
    clock = Clock()
    admission = Admission(30.0, clock=clock)
    admission.want([3])
    delays = []
    for _ in range(6):
        assert admission.due() == [3]
        admission.failed(3, "no answer")
        delays.append(admission.waiting[3].next_try - clock.now)
        clock.now = admission.waiting[3].next_try
    assert delays == [1.0, 2.0, 4.0, 8.0, MAX_RETRY_S, MAX_RETRY_S]


def test_the_first_failed_try_says_the_game_is_awaited() -> None:
    admission = Admission(30.0, clock=Clock())
    admission.want([5])
    line = admission.failed(5, "127.0.0.1:5005 does not answer")
    assert line is not None and "waiting for ue-5" in line and "30 s" in line


def test_a_game_silent_past_the_preflight_timeout_is_given_up_on_with_a_line() -> None:
    clock = Clock()
    admission = Admission(30.0, clock=clock)
    admission.want([3])
    admission.failed(3, "no answer")
    clock.now += 31
    line = admission.failed(3, "no answer")
    assert line is not None and "gave up on ue-3" in line and "the run goes on" in line
    admission.want([3])
    assert admission.due() == []  # not retried ...
    admission.endpoints_changed()
    admission.want([3])
    assert admission.due() == [3]  # ... until the endpoints change again


def test_a_game_with_other_spaces_is_refused_at_once() -> None:
    admission = Admission(30.0, clock=Clock())
    admission.want([2])
    line = admission.failed(2, "other spaces", refuse=True)
    assert line is not None and "ue-2 refused: other spaces" in line
    assert 2 in admission.given_up


def test_a_slot_no_longer_wanted_stops_waiting() -> None:
    admission = Admission(30.0, clock=Clock())
    admission.want([2, 3])
    admission.want([2])
    assert admission.due() == [2]


# -- the endpoints watch -------------------------------------------------------


def endpoints(workers: int = 2) -> Endpoints:
    return Topology.model_validate({"workers": {"replicas": workers}}).endpoints()


def test_an_unchanged_file_is_no_change(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(endpoints(2).to_json())
    assert EndpointsWatch(path, endpoints(2)).poll() == (None, [])


def test_a_new_number_of_games_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(endpoints(2).to_json())
    watch = EndpointsWatch(path, endpoints(2))
    path.write_text(endpoints(5).to_json())
    changed, lines = watch.poll()
    assert changed is not None and changed.num_env_runners == 5 and lines == []


def test_the_whole_stack_output_is_accepted_too(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    watch = EndpointsWatch(path, endpoints(2))
    path.write_text(json.dumps({"endpoints": json.loads(endpoints(3).to_json())}))
    changed, _ = watch.poll()
    assert changed is not None and changed.num_env_runners == 3


def test_an_invalid_file_is_reported_once_and_the_last_good_endpoints_stay(
    tmp_path: Path,
) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(endpoints(2).to_json())
    watch = EndpointsWatch(path, endpoints(2))
    path.write_text(endpoints(2).to_json().replace('"num_env_runners": 2', '"num_env_runners": -1'))
    changed, lines = watch.poll()
    assert changed is None and len(lines) == 1
    assert "num_env_runners" in lines[0] and "keeping the last good one (2 game(s))" in lines[0]
    assert watch.poll() == (None, [])  # the same problem is not repeated
    assert watch.current.num_env_runners == 2


def test_an_unreadable_file_is_reported_and_the_last_good_endpoints_stay(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    watch = EndpointsWatch(path, endpoints(2))
    changed, lines = watch.poll()
    assert changed is None and "cannot read" in lines[0] and str(path) in lines[0]


def test_a_file_that_is_not_json_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    watch = EndpointsWatch(path, endpoints(2))
    path.write_text("{half a file")
    _, lines = watch.poll()
    assert f"{path} is not JSON" in lines[0]


def test_changes_a_running_training_cannot_follow_are_named(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    watch = EndpointsWatch(path, endpoints(2))
    moved = endpoints(3).model_copy(update={"port": 6000, "custom_resource": "gpu_game"})
    path.write_text(moved.to_json())
    changed, lines = watch.poll()
    assert changed is not None and changed.num_env_runners == 3 and changed.port != 6000
    assert "custom_resource, port changed" in lines[0]


# -- the board and the train batch ---------------------------------------------


def report(index: int, healthy: bool = True) -> dict[str, Any]:
    return {"runner_index": index, "endpoint": f"h:{index}", "healthy": healthy,
            "down_for_s": 0.0, "last_error": "", "events": []}  # fmt: skip


def test_the_health_board_counts_the_runners_after_a_rescale() -> None:
    board = RunnerHealthBoard(4, give_up_after_s=60)
    board.update([report(i) for i in (1, 2, 3, 4)])
    board.follow([1])
    assert (board.healthy, board.total, board.unknown) == (1, 1, 0)
    board.follow([1, 5, 6])
    assert (board.healthy, board.total, board.unknown) == (1, 3, 2)


def ppo_config(workers: int, batch: int, envs: int = 1) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .env_runners(num_env_runners=workers, num_envs_per_env_runner=envs)
        .training(train_batch_size_per_learner=batch)
    )


def test_the_train_batch_is_split_over_the_runners_there_are_now() -> None:
    lengths = fragment_lengths(ppo_config(2, 2000), [1, 5, 6, 7])
    assert lengths == {1: 500, 5: 500, 6: 500, 7: 500}


def test_an_uneven_split_still_adds_up_to_the_train_batch() -> None:
    lengths = fragment_lengths(ppo_config(2, 1000, envs=2), [1, 2, 9])
    assert sum(lengths.values()) * 2 == 1000  # 2 environments per runner
    assert lengths == {1: 167, 2: 167, 9: 166}


def test_a_fixed_rollout_fragment_length_is_left_alone() -> None:
    config = ppo_config(2, 2000).env_runners(rollout_fragment_length=64)
    assert fragment_lengths(config, [1, 2, 3]) == {}


# -- uerl local scale ----------------------------------------------------------


def test_scaling_a_directory_without_a_session_says_so(tmp_path: Path) -> None:
    with pytest.raises(ScaleError, match="no `uerl local` session is running in"):
        request_scale(tmp_path, 3, timeout_s=1)


def test_a_negative_number_of_workers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScaleError, match="workers -1: must be between 0 and 64"):
        request_scale(tmp_path, -1, timeout_s=1)


# -- the driver with no game left ----------------------------------------------


class FakeRescaler:
    """Runner counts in the order the driver will see them, one per loop pass."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.runners = counts[0]
        self.rescales = 0  # the rescales followed (Rescaler's), for the metrics sink

    def between_iterations(self) -> None:
        self.runners = self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]

    def worker_indices(self) -> list[int]:
        return list(range(1, self.runners + 1))

    def note_reports(self, reports: list[dict[str, Any]]) -> None:
        pass


def test_with_no_game_left_sampling_pauses_and_resumes_when_one_joins(tmp_path: Path) -> None:
    from test_driver_loop import FakeAlgorithm

    algo, lines = FakeAlgorithm(), []
    options = TrainOptions(
        run_dir=tmp_path, checkpoint_dir=tmp_path / "c", hparams={}, iterations=3
    )
    board = RunnerHealthBoard(2, give_up_after_s=60)
    rescaler = FakeRescaler([2, 0, 0, 1, 1])
    result = _loop(algo, options, StopRequest(), lines.append, board, None, rescaler)  # type: ignore[arg-type]
    assert algo.trained == [1, 2, 3] and result.failure is None
    assert any("sampling paused until a game joins" in line for line in lines)
    assert any(line.startswith("rescale: sampling again after") for line in lines)


def test_paused_longer_than_the_game_down_limit_the_run_fails(tmp_path: Path) -> None:
    from test_driver_loop import FakeAlgorithm

    algo, lines = FakeAlgorithm(), []
    options = TrainOptions(
        run_dir=tmp_path, checkpoint_dir=tmp_path / "c", hparams={}, iterations=5,
        game_down_limit_s=0.5,
    )  # fmt: skip
    board = RunnerHealthBoard(2, give_up_after_s=0.5)
    result = _loop(algo, options, StopRequest(), lines.append, board, None, FakeRescaler([1, 0]))  # type: ignore[arg-type]
    assert algo.trained == [1]
    assert result.failure is not None and "no game joined within 0.5 s" in result.failure


def test_a_game_whose_runner_is_starting_is_not_tried_again_unless_that_fails() -> None:
    clock = Clock()
    admission = Admission(30.0, clock=clock)
    admission.want([4])
    admission.starting(4)
    clock.now += 100
    assert admission.due() == []
    admission.failed(4, "its env runner was not up within 30 s")
    assert 4 in admission.given_up  # 100 s after it was first wanted


# -- the runner pool: runners that are up -------------------------------------


class _Ref:
    """A runner's readiness call."""


class _Actor:
    def __init__(self) -> None:
        self.ref = _Ref()
        self.assert_healthy = type("Call", (), {"remote": lambda _self: self.ref})()


class _Manager:
    def __init__(self) -> None:
        self.added: list[_Actor] = []
        self._next_id = 3

    def actor_ids(self) -> list[int]:
        return [1, 2]

    def add_actors(self, actors: list[_Actor]) -> None:
        self.added += actors
        self._next_id += len(actors)

    def actors(self) -> dict[int, Any]:
        return {}

    def remove_actor(self, actor_id: int) -> Any:
        return None


class _Group:
    def __init__(self) -> None:
        self._worker_manager = _Manager()
        self._env_creator = self._remote_config_obj_ref = None
        self.local_env_runner = type("Local", (), {"get_state": lambda _self: {}})()

    def _make_worker(self, **kwargs: Any) -> _Actor:
        return _Actor()

    def foreach_env_runner(self, **kwargs: Any) -> None:
        pass


class _Registry:
    def assign(self, index: int, slot: int) -> None:
        pass


def test_a_runner_up_but_held_back_to_join_with_others_outlives_its_start_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    import ray

    from training.rescale.runner_pool import JOIN_TOGETHER_S, RunnerPool

    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    up: set[_Ref] = set()
    killed: list[Any] = []
    monkeypatch.setattr(
        ray,
        "wait",
        lambda refs, **kw: ([r for r in refs if r in up], [r for r in refs if r not in up]),
    )
    monkeypatch.setattr(ray, "get", lambda ref: None)
    monkeypatch.setattr(ray, "put", lambda value: value)
    monkeypatch.setattr(ray, "kill", lambda actor, **kw: killed.append(actor))
    config = type("Config", (), {"env_runner_restore_timeout_s": 1.0})()
    algo = type("Algo", (), {"env_runner_group": _Group(), "config": config})()
    pool = RunnerPool(algo, _Registry())  # type: ignore[arg-type]
    pool.start([3], ready_timeout_s=10)
    pool.start([4], ready_timeout_s=60)
    first = next(s for s in pool.starting.values() if s.slot == 3)
    started = clock.now
    clock.now = started + 5
    up.add(first.actor.ref)
    assert pool.collect() == ([], [])  # up, held back for the slot-4 runner
    clock.now = started + 11  # past the first runner's 10 s deadline, still held back
    joined, failures = pool.collect()
    assert (joined, failures, killed) == ([], [], [])
    clock.now = started + 5 + JOIN_TOGETHER_S + 1
    joined, failures = pool.collect()
    assert [r.slot for r in joined] == [3] and failures == [] and killed == []


# -- `uerl local scale`: a grow that fails ---------------------------------------


class _Games:
    """A stand-in for LocalMockGames: the games by name, started and stopped."""

    def __init__(self, workers: int) -> None:
        self.names = [f"ue-{i}" for i in range(1, workers + 1)]

    def add_worker_games(self, count: int) -> list[Any]:
        first = len(self.names) + 1
        new = [f"ue-{i}" for i in range(first, first + count)]
        self.names += new
        return [type("Game", (), {"name": name})() for name in new]

    def discard_worker_games(self, games: list[Any]) -> None:
        leaving = {g.name for g in games}
        self.names = [n for n in self.names if n not in leaving]


class _NodesFail:
    def add_worker_nodes(self, count: int) -> list[str]:
        raise RuntimeError("ray start for node worker3 exited with code 1")


def test_a_grow_whose_worker_nodes_fail_stops_the_games_it_started(tmp_path: Path) -> None:
    from training.local.scaling import LocalScaler

    games = _Games(1)
    scaler = LocalScaler(
        tmp_path,
        _NodesFail(),
        games,
        endpoints(1),
        log=lambda line: None,  # type: ignore[arg-type]
    )
    with pytest.raises(RuntimeError, match="worker3 exited"):
        scaler.scale(3)
    assert games.names == ["ue-1"] and scaler.endpoints.num_env_runners == 1


# -- a sidecar shrink when Ray's state API fails ------------------------------------------


class _ShrinkManager:
    def __init__(self, actor_ids: list[int]) -> None:
        self._actors = {aid: object() for aid in actor_ids}

    def actors(self) -> dict[int, Any]:
        return self._actors


class _Pool:
    def __init__(self, runners: list[Runner]) -> None:
        self.runners = {r.actor_id: r for r in runners}
        self.group = type("Group", (), {"_worker_manager": _ShrinkManager(list(self.runners))})()


def _shrinking_sidecar(tmp_path: Path, *, running: int, wanted: int) -> tuple[Any, list[str]]:
    from training.rescale.rescaler import Rescaler

    lines: list[str] = []
    rescaler = Rescaler.__new__(Rescaler)  # the shrink's decision alone: no Ray, no RLlib
    rescaler.endpoints = Topology.parse({"workers": {"replicas": wanted}}).endpoints()
    rescaler.pool = _Pool(runners(*range(1, running + 1)))
    rescaler.log = lines.append
    rescaler.events_path = tmp_path / "events.jsonl"
    rescaler._shrink_since = None
    return rescaler, lines


def test_a_shrink_by_slot_because_the_state_api_failed_says_so_in_the_log_and_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the highest slots left silently (a warning in Ray's log only).
    import ray

    from training.preflight import checks as preflight
    from training.preflight.checks import NodeRoom

    def state_api_down() -> list[Any]:
        raise RuntimeError("the dashboard is not answering")

    monkeypatch.setattr(ray, "nodes", state_api_down)
    # KubeRay already deleted one pod: the cluster has the 2 units of the 2 games wanted.
    rooms = [NodeRoom(f"n{i}", "10.0.0.1", 1, 0, 1, custom_total=1) for i in range(2)]
    monkeypatch.setattr(preflight, "node_rooms", lambda resource: rooms)
    rescaler, lines = _shrinking_sidecar(tmp_path, running=3, wanted=2)
    plan = rescaler._tied_plan()
    assert [r.slot for r in plan.remove] == [3]
    assert lines == [
        "rescale: Ray's state API did not say which env runners' pods went (RuntimeError: "
        "the dashboard is not answering); removing the runners of the highest slots"
    ]
    (event,) = [json.loads(line) for line in rescaler.events_path.read_text().splitlines()]
    assert event["kind"] == "shrink_by_slot" and event["reason"] == "state_api_failed"


def test_a_shrink_past_the_settle_time_says_so_in_the_log_and_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from training.preflight import checks as preflight
    from training.preflight.checks import NodeRoom
    from training.rescale import rescaler as rescaler_module

    monkeypatch.setattr(ray, "nodes", lambda: [])
    monkeypatch.setattr("ray.util.state.get_actor", lambda **kw: None)
    # Three units still, for two games: KubeRay has not deleted a pod.
    rooms = [NodeRoom(f"n{i}", "10.0.0.1", 1, 0, 1, custom_total=1) for i in range(3)]
    monkeypatch.setattr(preflight, "node_rooms", lambda resource: rooms)
    rescaler, lines = _shrinking_sidecar(tmp_path, running=3, wanted=2)
    rescaler.pool.group._worker_manager._actors = {}  # no actor known to have left
    rescaler._shrink_since = -rescaler_module.SHRINK_SETTLE_S  # long ago
    plan = rescaler._tied_plan()
    assert [r.slot for r in plan.remove] == [3]
    assert lines[0].startswith("rescale: the cluster still has 3 unit(s) of 'ue_worker'")
    (event,) = [json.loads(line) for line in rescaler.events_path.read_text().splitlines()]
    assert event["kind"] == "shrink_by_slot" and event["reason"] == "settle_timeout"


# -- RLlib internals the runner pool relies on -------------------------------------------


def test_the_rllib_internals_the_runner_pool_uses_are_where_it_expects_them() -> None:
    # A Ray upgrade that moves one fails here, naming it (not in the middle of a rescale).
    import inspect
    import re

    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.utils.actor_manager import FaultTolerantActorManager

    from training.rescale.runner_pool import RLLIB_INTERNALS

    group_source = inspect.getsource(EnvRunnerGroup)
    missing = [
        f"EnvRunnerGroup.{name}"
        for name in RLLIB_INTERNALS["EnvRunnerGroup"]
        # A method, or an attribute its constructor (or setup) assigns.
        if not hasattr(EnvRunnerGroup, name)
        and not re.search(rf"self\.{name}\s*(:[^=\n]*)?=[^=]", group_source)
    ]
    manager = FaultTolerantActorManager()  # no actors: needs no Ray
    missing += [
        f"FaultTolerantActorManager.{name}"
        for name in RLLIB_INTERNALS["FaultTolerantActorManager"]
        if not hasattr(manager, name)
    ]
    assert missing == [], f"RLlib moved what RunnerPool uses: {', '.join(missing)}"


def test_a_runner_pool_on_an_rllib_without_one_of_them_stops_naming_it() -> None:
    from ray.rllib.utils.actor_manager import FaultTolerantActorManager

    from training.rescale.runner_pool import RLlibInternalsChanged, RunnerPool

    class MovedGroup:  # as if a Ray upgrade renamed _make_worker
        _worker_manager = FaultTolerantActorManager()
        _remote_config_obj_ref = None
        _env_creator = None

    algo = type("Algo", (), {"env_runner_group": MovedGroup()})()
    with pytest.raises(RLlibInternalsChanged, match=r"has no EnvRunnerGroup\._make_worker: "):
        RunnerPool(algo, registry=None)  # type: ignore[arg-type]
