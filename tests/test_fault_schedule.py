"""The fault schedule and the invariant checker of the real-pods tier
(tests/k8s/fault_schedule.py), without a cluster: a schedule drawn from a seed, and
snapshots (of a stored run, the head's jobs, the supervisor's log) that break each
invariant, each reported."""

from __future__ import annotations

import calendar
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pyarrow import fs

from training.runstore import events

K8S = Path(__file__).resolve().parent / "k8s"


def _load() -> ModuleType:
    """tests/k8s/fault_schedule.py (tests/k8s is on the path of the tier's tests only)."""
    if "fault_schedule" in sys.modules:  # the tier's tests in the same session
        return sys.modules["fault_schedule"]
    spec = importlib.util.spec_from_file_location("fault_schedule", K8S / "fault_schedule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fault_schedule"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fsch = _load()
RUN = "r"
BUCKET_FAULTS = [
    fsch.STORE, fsch.OPERATOR, fsch.HEAD, fsch.LEARNER, fsch.NEW_IMAGE, fsch.HEAD_DURING_UPLOAD
]  # fmt: skip


def meta(iteration: int) -> str:
    """A checkpoint's uerl.json as this uerl writes it: naming its files (`stored`'s)."""
    return json.dumps(
        {"iteration": iteration, "env_steps_total": iteration * 1000,
         "files": {"module_state.pkl": 7}}
    )  # fmt: skip


def name(iteration: int) -> str:
    return f"checkpoint_{iteration:06d}"


def stored(
    whole: tuple[int, ...] = (),
    *,
    partial: tuple[int, ...] = (),
    latest: int | None = None,
    latest_meta: str | None = None,
    metrics: tuple[int, ...] | None = None,
    attempts: tuple[dict[str, Any], ...] = (),
    extra: tuple[str, ...] = (),
) -> Any:
    """A stored run: checkpoints `whole` (their uerl.json with them) and `partial` (a
    file of theirs, no uerl.json), `latest` naming one (its uerl.json as stored, unless
    `latest_meta` says otherwise)."""
    files = {f"checkpoints/{name(i)}/module_state.pkl" for i in (*whole, *partial)}
    files |= {f"checkpoints/{name(i)}/uerl.json" for i in whole}
    if latest is not None:
        files.add("checkpoints/latest")
        if latest_meta is None and latest in whole:
            latest_meta = meta(latest)
    return fsch.StoredRun(
        files=frozenset(files | set(extra)),
        latest=None if latest is None else name(latest),
        latest_meta=latest_meta,
        metrics=metrics,
        attempts=attempts,
    )


def entry(attempt: int, started_s: int = 0, *, iteration: int | None = None) -> dict[str, Any]:
    """attempts.jsonl's line: started `started_s` after 2026-01-01T00:00:00Z."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH + started_s))
    return {"attempt": attempt, "started": started, "reason": "why", "iteration": iteration,
            "resumed_from": None if iteration is None else name(iteration)}  # fmt: skip


EPOCH = calendar.timegm((2026, 1, 1, 0, 0, 0))


def struck(
    kind: str,
    *,
    index: int = 1,
    lost_after: int = 0,
    stored_before: int | None = None,
    store_down: bool = False,
) -> Any:
    return fsch.Struck(index, kind, 10.0, 1, lost_after, stored_before, store_down, "pod-x")


def job(submission_id: str, status: str = "RUNNING") -> Any:
    return fsch.JobState(submission_id, status, {"uerl_run": RUN})


# ---- the schedule ----------------------------------------------------------------------


def test_a_seed_gives_the_same_schedule_every_time() -> None:
    one = fsch.make_schedule(41, BUCKET_FAULTS, first=(2, 3), gap=(1, 2), salt="bucket")
    again = fsch.make_schedule(41, BUCKET_FAULTS, first=(2, 3), gap=(1, 2), salt="bucket")
    assert one == again


def test_a_schedule_strikes_each_fault_once() -> None:
    schedule = fsch.make_schedule(7, BUCKET_FAULTS, first=(2, 3), gap=(1, 2))
    assert sorted(f.kind for f in schedule.faults) == sorted(BUCKET_FAULTS)


def test_seeds_draw_different_orders() -> None:
    schedules = [
        fsch.make_schedule(seed, BUCKET_FAULTS, first=(2, 3), gap=(1, 2)) for seed in range(20)
    ]
    orders = {tuple(fault.kind for fault in schedule.faults) for schedule in schedules}
    assert len(orders) > 1


def test_two_runs_of_one_seed_get_schedules_of_their_own() -> None:
    kinds = [fsch.HEAD, fsch.SUPERVISOR, fsch.WORKER]
    pairs = [
        (fsch.make_schedule(seed, kinds, first=(4, 5), gap=(1, 2), salt="claim"),
         fsch.make_schedule(seed, kinds, first=(4, 5), gap=(1, 2), salt="bucket"))
        for seed in range(10)
    ]  # fmt: skip
    assert any(a.faults != b.faults for a, b in pairs)


def test_the_first_fault_and_each_gap_fall_within_their_ranges() -> None:
    for seed in range(50):
        faults = fsch.make_schedule(seed, BUCKET_FAULTS, first=(4, 5), gap=(1, 2)).faults
        assert 4 <= faults[0].after <= 5
        assert all(1 <= f.after <= 2 for f in faults[1:])


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="no such fault: meteor"):
        fsch.make_schedule(1, [fsch.HEAD, "meteor"], first=(1, 1), gap=(1, 1))


def test_the_seed_comes_from_uerl_fault_seed() -> None:
    assert fsch.seed_from_environment({"UERL_FAULT_SEED": " 1234 "}) == 1234


def test_without_uerl_fault_seed_a_seed_is_drawn() -> None:
    seeds = {fsch.seed_from_environment({}) for _ in range(5)}
    assert all(isinstance(seed, int) and seed >= 0 for seed in seeds) and len(seeds) > 1


def test_a_seed_that_is_no_integer_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="UERL_FAULT_SEED='abc'"):
        fsch.seed_from_environment({"UERL_FAULT_SEED": "abc"})


def test_the_schedule_says_its_seed_how_to_replay_it_and_every_fault() -> None:
    schedule = fsch.make_schedule(99, [fsch.HEAD, fsch.WORKER], first=(2, 2), gap=(1, 1))
    said = schedule.describe()
    assert "seed 99" in said and "UERL_FAULT_SEED=99" in said
    assert f"{fsch.HEAD} after" in said and f"{fsch.WORKER} after" in said


# ---- the supervisor's log -------------------------------------------------------------


def _iteration(n: int, ret: float) -> str:
    """An iteration's progress line and its event, as the driver logs them."""
    prose = f"iter {n:4d} | env steps {n * 1000:>9,} |      500 steps/s | return mean {ret:7.1f}"
    event = events.line(
        events.ITERATION, iteration=n, env_steps=n * 1000, steps_per_s=500.0,
        return_mean=ret, time_s=2.0, runners=[1, 1], unknown=0,
    )  # fmt: skip
    return f"{prose}\n{event}\n"


def _attempt(n: int, *, following: bool = False) -> str:
    """The supervisor's line and event for attempt `n`, as it logs them."""
    said = (
        f"following attempt {n} (job uerl-r-{n}), already RUNNING"
        if following
        else f"attempt {n} of run r: submitting job uerl-r-{n} (the run starts)"
    )
    event = events.line(events.ATTEMPT, attempt=n, job=f"uerl-r-{n}", following=following)
    return f"uerl supervise: {said}\nuerl supervise: {event}\n"


SUPERVISOR_LOG = (
    _attempt(1)
    + _iteration(1, 10.0)
    + _iteration(2, 11.0)
    + "checkpoint_000002 written: 0.2 MiB in 3.00 s (RLlib's state 2.99 s, storing 0.01 s)\n"
    + events.checkpoint_written("checkpoint_000002", mib=0.2, seconds=3.0, storing_s=0.01)
    + "\n"
    + _iteration(3, 12.0)
    + "uerl supervise: the Ray head's job API does not answer: no answer in 60 s\n"
    + _attempt(2)
    + _iteration(3, 12.5)
)
# The Job's next pod: it follows attempt 2 and passes its log on from its start.
REPLACED_LOG = _attempt(2, following=True) + _iteration(3, 12.5) + _iteration(4, 13.0)


def test_iterations_are_counted_to_the_attempt_the_supervisor_submitted() -> None:
    assert fsch.attempt_progress(SUPERVISOR_LOG) == [(1, 1), (1, 2), (1, 3), (2, 3)]


def test_a_replaced_supervisors_repeat_of_an_attempts_log_counts_once() -> None:
    view = fsch.LogView((("pod-a", SUPERVISOR_LOG), ("pod-b", REPLACED_LOG)))
    assert sorted(view.pairs) == [(1, 1), (1, 2), (1, 3), (2, 3), (2, 4)]


def test_the_log_view_says_the_newest_attempt_and_its_last_iteration() -> None:
    view = fsch.LogView((("pod-a", SUPERVISOR_LOG), ("pod-b", REPLACED_LOG)))
    assert (view.attempt, view.last_iteration) == (2, 4)
    assert view.last_shown() == {1: 3, 2: 4}
    assert view.last_line == _iteration(4, 13.0).splitlines()[1]


def test_the_drivers_written_lines_name_its_checkpoints() -> None:
    assert fsch.written_checkpoints(SUPERVISOR_LOG) == ["checkpoint_000002"]


def test_supervisor_logs_keep_a_deleted_pods_log() -> None:
    pods = ["pod-a"]
    texts = {"pod-a": SUPERVISOR_LOG}
    logs = fsch.SupervisorLogs(lambda: pods, texts.get)
    logs.refresh()
    pods[:] = ["pod-b"]  # pod-a deleted: its log is gone with it
    texts["pod-b"] = REPLACED_LOG
    view = logs.refresh()
    assert [pod for pod, _ in view.pods] == ["pod-a", "pod-b"] and (1, 1) in view.pairs


# ---- the stored run ------------------------------------------------------------------


def test_a_run_in_a_directory_is_read_whole(tmp_path: Path) -> None:
    run = tmp_path / RUN
    (run / "checkpoints" / name(2)).mkdir(parents=True)
    (run / "checkpoints" / name(2) / "uerl.json").write_text(meta(2))
    (run / "checkpoints" / "latest").write_text(name(2))
    (run / "checkpoints" / ".partial-ab12cd34-checkpoint_000004").mkdir()
    (run / "checkpoints" / ".partial-ab12cd34-checkpoint_000004" / "x.pkl").write_text("x")
    (run / "metrics.csv").write_text("iteration,episode_return_mean\n1,1.0\n2,2.0\n")
    (run / "attempts.jsonl").write_text(json.dumps(entry(1)) + "\n")
    read = fsch.read_stored(fs.LocalFileSystem(), str(run))
    assert read.latest == name(2) and read.latest_meta == meta(2)
    assert read.metrics == (1, 2) and [e["attempt"] for e in read.attempts] == [1]
    assert "checkpoints/.partial-ab12cd34-checkpoint_000004/x.pkl" in read.files


def test_a_run_not_stored_yet_reads_empty(tmp_path: Path) -> None:
    read = fsch.read_stored(fs.LocalFileSystem(), str(tmp_path / "none-yet"))
    assert read == fsch.StoredRun(sizes={})


def test_a_line_of_attempts_that_does_not_read_is_kept_as_it_is() -> None:
    read = fsch.parse_attempts('{"attempt": 1}\nnot json\n')
    assert read == ({"attempt": 1}, {"line": "not json"})


# ---- latest names a whole checkpoint --------------------------------------------------


def test_a_latest_naming_a_whole_checkpoint_holds() -> None:
    assert fsch.latest_problems(stored((2, 4), latest=4)) == []


def test_no_latest_yet_holds() -> None:
    assert fsch.latest_problems(stored(partial=(2,))) == []


def test_a_latest_naming_a_checkpoint_without_its_uerl_json_is_reported() -> None:
    [problem] = fsch.latest_problems(stored((2,), partial=(4,), latest=4))
    assert f"names {name(4)}, whose uerl.json the store does not hold" in problem


def test_a_latest_whose_uerl_json_does_not_read_is_reported() -> None:
    [problem] = fsch.latest_problems(stored((4,), latest=4, latest_meta="{cut"))
    assert "does not read" in problem


def test_a_latest_whose_uerl_json_says_another_iteration_is_reported() -> None:
    [problem] = fsch.latest_problems(stored((4,), latest=4, latest_meta=meta(2)))
    assert "says iteration 2" in problem


# ---- every iteration in metrics.csv once ------------------------------------------------


def test_metrics_consecutive_from_one_hold() -> None:
    assert fsch.metrics_problems((1, 2, 3)) == []


def test_an_iteration_twice_in_metrics_is_reported() -> None:
    problems = fsch.metrics_problems((1, 2, 3, 3, 4))
    assert "metrics.csv holds iteration 3 2 times" in problems


def test_an_iteration_missing_from_metrics_is_reported() -> None:
    assert fsch.metrics_problems((1, 2, 4)) == ["metrics.csv's row 3 is iteration 4, not 3"]


def test_metrics_not_starting_at_one_are_reported() -> None:
    assert fsch.metrics_problems((2, 3)) == ["metrics.csv's row 1 is iteration 2, not 1"]


# ---- attempts consecutive and never overlapping -----------------------------------------


def test_attempts_one_after_another_hold() -> None:
    entries = (entry(1, 0), entry(2, 60, iteration=4), entry(3, 120, iteration=6))
    seen = {"uerl-r-1": EPOCH + 50.0, "uerl-r-2": EPOCH + 110.0}
    assert fsch.attempts_problems(entries, seen, RUN) == []


def test_an_attempt_recorded_twice_is_reported() -> None:
    entries = (entry(1, 0), entry(1, 60))
    assert fsch.attempts_problems(entries, {}, RUN) == [
        "attempts.jsonl's line 2 is attempt 1, not 2"
    ]


def test_an_attempt_started_before_the_one_before_it_is_reported() -> None:
    [problem] = fsch.attempts_problems((entry(1, 60), entry(2, 0)), {}, RUN)
    assert "attempt 2 started (2026-01-01T00:00:00Z) before attempt 1 did" in problem


def test_an_attempt_started_while_the_one_before_was_still_running_is_reported() -> None:
    entries = (entry(1, 0), entry(2, 60, iteration=4))
    [problem] = fsch.attempts_problems(entries, {"uerl-r-1": EPOCH + 61.5}, RUN)
    assert "attempt 2 started (2026-01-01T00:01:00Z) while job uerl-r-1 was still RUNNING" in (
        problem
    )


def test_an_attempt_started_within_the_second_its_predecessor_was_last_seen_holds() -> None:
    # `started` is cut to the second: 00:01:00 may be 00:01:00.9, after 00:01:00.5.
    entries = (entry(1, 0), entry(2, 60, iteration=4))
    assert fsch.attempts_problems(entries, {"uerl-r-1": EPOCH + 60.5}, RUN) == []


def test_an_attempt_resuming_from_an_older_checkpoint_than_its_predecessor_is_reported() -> None:
    entries = (entry(1, 0), entry(2, 60, iteration=6), entry(3, 120, iteration=4))
    assert fsch.attempts_problems(entries, {}, RUN) == [
        "attempt 3 resumed from iteration 4, older than attempt 2's 6"
    ]


# ---- at most one job of the run running ------------------------------------------------


def test_one_job_of_the_run_running_holds() -> None:
    jobs = [job("uerl-r-1", "FAILED"), job("uerl-r-2")]
    assert fsch.one_job_problems(jobs, RUN) == []


def test_two_jobs_of_the_run_running_are_reported() -> None:
    [problem] = fsch.one_job_problems([job("uerl-r-1"), job("uerl-r-2")], RUN)
    assert problem == "2 jobs of run r at once: uerl-r-1 RUNNING, uerl-r-2 RUNNING"


def test_a_job_pending_beside_a_running_one_is_reported() -> None:
    assert fsch.one_job_problems([job("uerl-r-2"), job("uerl-r-3", "PENDING")], RUN)


def test_the_runs_record_jobs_and_other_runs_jobs_are_not_its_attempts() -> None:
    jobs = [job("uerl-r-2"), job("uerl-r-record-1a2b3c4d"), job("uerl-r2-1"), job("other")]
    assert fsch.one_job_problems(jobs, RUN) == []


# ---- at most one checkpoint interval redone per fault -----------------------------------


def test_an_attempt_resumed_within_a_checkpoint_interval_of_its_fault_holds() -> None:
    entries = (entry(1), entry(2, 60, iteration=6))
    faults = [struck(fsch.HEAD, lost_after=7, stored_before=6)]
    assert fsch.redone_problems(entries, faults, {1: 8}, 2) == []


def test_more_than_a_checkpoint_interval_redone_is_reported() -> None:
    entries = (entry(1), entry(2, 60, iteration=4))
    faults = [struck(fsch.HEAD, lost_after=7, stored_before=4)]
    [problem] = fsch.redone_problems(entries, faults, {1: 7}, 2)
    assert "attempt 2 did 3 iterations again after fault 1 (head)" in problem


def test_the_lost_attempts_last_iteration_is_the_later_of_the_fault_and_its_log() -> None:
    entries = (entry(1), entry(2, 60, iteration=6))
    faults = [struck(fsch.LEARNER, lost_after=7, stored_before=6)]
    [problem] = fsch.redone_problems(entries, faults, {1: 9}, 2)
    assert "attempt 1 showed iteration 9" in problem


def test_an_attempt_with_no_fault_to_end_its_predecessor_is_reported() -> None:
    entries = (entry(1), entry(2, 60, iteration=6))
    faults = [struck(fsch.WORKER, lost_after=7), struck(fsch.OPERATOR, index=2, lost_after=8)]
    [problem] = fsch.redone_problems(entries, faults, {1: 8}, 2)
    assert "attempt 2 began ('why') with no fault to end attempt 1" in problem


def test_an_attempt_resumed_from_older_than_the_store_held_is_reported() -> None:
    entries = (entry(1), entry(2, 60, iteration=4))
    faults = [struck(fsch.HEAD_DURING_UPLOAD, lost_after=7, stored_before=6, store_down=True)]
    [problem] = fsch.redone_problems(entries, faults, {1: 7}, 2)
    assert "older than the checkpoint of iteration 6 stored whole" in problem


def test_a_stopped_store_may_cost_what_it_had_not_taken() -> None:
    entries = (entry(1), entry(2, 60, iteration=6))
    faults = [struck(fsch.HEAD_DURING_UPLOAD, lost_after=9, stored_before=6, store_down=True)]
    assert fsch.redone_problems(entries, faults, {1: 9}, 2) == []


# ---- retention, writes in progress ------------------------------------------------------


def test_the_newest_kept_the_best_and_one_in_progress_hold() -> None:
    assert fsch.retention_excess(stored((2, 4, 6, 8, 10, 12), partial=(14,)), 5) == []


def test_more_checkpoints_stored_than_retention_keeps_are_reported() -> None:
    excess = fsch.retention_excess(stored((2, 4, 6, 8, 10, 12, 14), partial=(16,)), 5)
    assert excess == [name(i) for i in range(2, 17, 2)]


def test_every_checkpoint_kept_has_no_limit() -> None:
    assert fsch.retention_excess(stored(tuple(range(2, 40, 2))), None) == []


def test_a_write_in_progress_stored_is_reported() -> None:
    partial = "checkpoints/.partial-ab12cd34-checkpoint_000004/x.pkl"
    assert fsch.partial_files(stored((2,), extra=(partial, "metrics.csv"))) == [partial]


# ---- the supervisor's Job at its end --------------------------------------------------


def pod(name: str, phase: str, uid: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid or name}, "status": {"phase": phase}}


COMPLETE = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}


def test_a_job_complete_with_one_pod_succeeded_holds() -> None:
    assert fsch.supervisor_end_problems(COMPLETE, [pod("s-1", "Succeeded")], set()) == []


def test_a_supervisor_pod_the_schedule_deleted_may_have_failed() -> None:
    status = COMPLETE | {"failed": 1}
    pods = [pod("s-1", "Failed", "u1"), pod("s-2", "Succeeded")]
    assert fsch.supervisor_end_problems(status, pods, {"u1"}) == []


def test_a_supervisor_pod_that_failed_on_its_own_and_was_run_again_is_reported() -> None:
    status = COMPLETE | {"failed": 1}
    problems = fsch.supervisor_end_problems(
        status, [pod("s-1", "Failed"), pod("s-2", "Succeeded")], set()
    )
    assert problems == [
        "1 of the Job's pods failed and the schedule deleted 0: a supervisor failed and was "
        "run again",
        "pod s-1 Failed: not one the schedule deleted",
    ]


def test_two_supervisor_pods_succeeded_are_reported() -> None:
    status = COMPLETE | {"succeeded": 2}
    problems = fsch.supervisor_end_problems(
        status, [pod("s-1", "Succeeded"), pod("s-2", "Succeeded")], set()
    )
    assert "2 of the Job's pods succeeded, not 1" in problems


def test_a_job_that_did_not_complete_is_reported() -> None:
    status = {"conditions": [{"type": "Failed", "status": "True"}], "failed": 1}
    problems = fsch.supervisor_end_problems(status, [pod("s-1", "Failed", "u1")], {"u1"})
    assert problems[0].startswith("the Job did not complete")


# ---- the checker ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Readers:
    """What the checker reads, set by each test; a reader set to an exception raises it."""

    def __init__(self) -> None:
        self.store: Any = stored()
        self.jobs: Any = []
        self.head_ready = True
        self.view = fsch.LogView()

    def read_store(self) -> Any:
        if isinstance(self.store, Exception):
            raise self.store
        return self.store

    def read_jobs(self) -> Any:
        if isinstance(self.jobs, Exception):
            raise self.jobs
        return self.jobs


def checker(readers: Readers, clock: Clock, *, partials_allowed: bool = False, **kw: Any) -> Any:
    options: dict[str, Any] = {
        "keep": 5, "checkpoint_every": 2, "interval_s": 0.01, "settle_s": 30.0,
        "unanswered_limit_s": 60.0, "partials_allowed": partials_allowed,
    } | kw  # fmt: skip
    return fsch.Checker(
        RUN,
        read_store=readers.read_store,
        read_jobs=readers.read_jobs,
        head_ready=lambda: readers.head_ready,
        logs=lambda: readers.view,
        clock=clock,
        wall=lambda: EPOCH + clock.now - 1000.0,
        **options,
    )


def test_the_checker_keeps_a_broken_invariant_once_with_when_it_was_first_seen() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.store = stored((2,), metrics=(1, 2, 4))
    clock.now += 12.0
    check.check_once()
    clock.now += 3.0
    check.check_once()
    assert [(v.at_s, v.invariant) for v in check.violations] == [(12.0, fsch.METRICS_ONCE)]


def test_the_checker_reports_retention_over_its_limit_only_once_it_lasts() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.store = stored((2, 4, 6, 8, 10, 12, 14, 16))
    check.check_once()
    clock.now += 29.0
    check.check_once()
    assert check.violations == []  # a round uploading what waited, deleting next
    clock.now += 2.0
    check.check_once()
    assert [v.invariant for v in check.violations] == [fsch.RETENTION]


def test_a_store_that_does_not_answer_starts_the_retention_wait_again() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.store = stored((2, 4, 6, 8, 10, 12, 14, 16))
    check.check_once()
    clock.now += 20.0
    readers.store, over = OSError("stopped"), readers.store
    check.check_once()
    clock.now += 20.0
    readers.store = over
    check.check_once()
    assert check.violations == [] and check.counts["store unread"] == 1


def test_the_job_api_unanswered_while_no_head_is_ready_is_tolerated() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.jobs, readers.head_ready = ConnectionError("no head"), False
    for _ in range(5):
        check.check_once()
        clock.now += 60.0
    assert check.violations == []


def test_the_job_api_unanswered_long_while_a_head_is_ready_is_reported() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.jobs = ConnectionError("refused")
    check.check_once()
    clock.now += 61.0
    check.check_once()
    [found] = check.violations
    assert found.invariant == fsch.ONE_JOB and "went unanswered over 60 s" in found.detail


def test_the_checker_reports_two_jobs_of_the_run_running() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.jobs = [job("uerl-r-1"), job("uerl-r-2")]
    check.check_once()
    assert [v.invariant for v in check.violations] == [fsch.ONE_JOB]


def test_an_attempt_that_started_while_the_checker_saw_the_last_running_is_reported() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    check.struck(struck(fsch.HEAD, lost_after=4, stored_before=4))  # what ended attempt 1
    clock.now += 90.0  # the wall clock: 00:01:30
    readers.jobs = [job("uerl-r-1")]
    check.check_once()
    readers.jobs = [job("uerl-r-2")]
    readers.store = stored(attempts=(entry(1, 0), entry(2, 60, iteration=4)))
    check.check_once()
    assert [v.invariant for v in check.violations] == [fsch.ATTEMPTS_APART]


def test_a_latest_gone_after_it_was_stored_is_reported() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.store = stored((2,), latest=2)
    check.check_once()
    readers.store = stored((2,))
    check.check_once()
    assert [v.detail for v in check.violations] == [
        "checkpoints/latest is gone after it was stored"
    ]


def test_a_write_in_progress_is_reported_in_a_bucket_not_on_a_claim() -> None:
    partial = ("checkpoints/.partial-ab12cd34-checkpoint_000004/x.pkl",)
    for allowed, reported in ((False, [fsch.NO_PARTIAL]), (True, [])):
        readers, clock = Readers(), Clock()
        check = checker(readers, clock, partials_allowed=allowed)
        readers.store = stored((2,), extra=partial)
        check.check_once()
        assert [v.invariant for v in check.violations] == reported


def test_a_fault_given_to_the_checker_accounts_for_the_attempt_it_ends() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.store = stored((6,), latest=6, attempts=(entry(1), entry(2, 60, iteration=6)))
    readers.view = fsch.LogView((("pod-a", SUPERVISOR_LOG),))
    check.struck(struck(fsch.HEAD, lost_after=7, stored_before=6))
    check.check_once()
    assert check.violations == []


def test_the_checker_tells_the_newest_checkpoint_it_read_stored_whole() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock)
    readers.store = stored((4, 6), partial=(8,), latest=6)
    check.check_once()
    assert check.stored_iteration() == 6


def test_a_check_that_fails_is_reported_as_the_checkers_own() -> None:
    readers, clock = Readers(), Clock()

    def broken() -> Any:
        raise KeyError("status")

    check = fsch.Checker(
        RUN, keep=5, checkpoint_every=2, read_store=readers.read_store, read_jobs=lambda: [],
        head_ready=lambda: True, logs=broken, interval_s=0.01, settle_s=30.0,
        unanswered_limit_s=60.0, partials_allowed=False, clock=clock,
    )  # fmt: skip
    check.stop(1.0)  # never started: only its last round
    assert [v.invariant for v in check.violations] == [fsch.CHECKER]


def test_the_checker_checks_on_its_thread_until_stopped() -> None:
    readers = Readers()
    rounds = threading.Semaphore(0)

    def read_jobs() -> list[Any]:
        rounds.release()
        return []

    check = fsch.Checker(
        RUN, keep=5, checkpoint_every=2, read_store=readers.read_store, read_jobs=read_jobs,
        head_ready=lambda: True, logs=lambda: readers.view, interval_s=0.01, settle_s=30.0,
        unanswered_limit_s=60.0, partials_allowed=False,
    )  # fmt: skip
    check.start()
    assert all(rounds.acquire(timeout=10) for _ in range(3))  # a hang guard, not a speed
    check.stop(10.0)
    answered = check.counts["job API answered"]
    time.sleep(0.05)
    assert check.counts["job API answered"] == answered  # stopped: no round after


def test_latest_naming_a_checkpoint_a_file_of_which_is_missing_or_short_breaks_it() -> None:
    # "Whole" as the product reads it (listing.holds_whole): each file uerl.json names.
    meta = '{"iteration": 2, "env_steps_total": 200, "algo": "PPO", "files": {"m.pkl": 7}}'
    at = "checkpoints/checkpoint_000002/"
    whole = {f"{at}uerl.json": 90, f"{at}m.pkl": 7}
    short, missing = {**whole, f"{at}m.pkl": 3}, {f"{at}uerl.json": 90}
    for sizes, broken in ((whole, False), (short, True), (missing, True)):
        stored = fsch.StoredRun(files=frozenset(sizes), latest="checkpoint_000002",
                                latest_meta=meta, sizes=sizes)  # fmt: skip
        assert bool(fsch.latest_problems(stored)) is broken, sizes


def lease_text(generation: int, holder: str) -> str:
    return json.dumps({"holder": holder, "generation": generation, "beat": 0})


def test_a_lease_generation_going_back_or_changing_holder_breaks_the_fence() -> None:
    holders: dict[int, str] = {}
    first = fsch.StoredRun(leases={1: lease_text(1, "a")})
    assert fsch.lease_problems(first, holders, 0) == []
    taken = fsch.StoredRun(leases={1: lease_text(1, "a"), 2: lease_text(2, "b")})
    assert fsch.lease_problems(taken, holders, 1) == []
    back = fsch.StoredRun(leases={1: lease_text(1, "a")})
    assert fsch.lease_problems(back, holders, 2) == [
        "the lease's newest generation is 1, after 2 was seen"
    ]
    overwritten = fsch.StoredRun(leases={2: lease_text(2, "a")})
    assert fsch.lease_problems(overwritten, holders, 2) == ["lease 2 was held by b, then by a"]


def test_retention_losing_one_of_the_newest_checkpoints_breaks_it() -> None:
    def stored(*iterations: int, latest: int) -> fsch.StoredRun:
        files = {f"checkpoints/checkpoint_{i:06d}/uerl.json" for i in iterations}
        return fsch.StoredRun(files=frozenset(files), latest=f"checkpoint_{latest:06d}")

    seen: set[str] = set()
    assert fsch.newest_kept_problems(stored(2, 4, 6, latest=6), seen, 2) == []
    assert fsch.newest_kept_problems(stored(4, 6, 8, latest=8), seen, 2) == []  # 2 pruned
    assert fsch.newest_kept_problems(stored(4, 8, latest=8), seen, 2) == [
        "checkpoint_000006, among the newest 2, is gone"
    ]
    # Stored whole past `latest` (its pointer not up yet): not counted until named.
    assert fsch.newest_kept_problems(stored(6, 8, 10, latest=8), seen, 2) == []


# ---- gaps in the checker's reads ------------------------------------------------------


def test_a_gap_in_the_store_reads_over_the_limit_is_reported_with_when() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock, gap_limit_s=30.0)
    check.check_once()
    clock.now += 45.0  # a round that hung, the store up
    check.check_once()
    [found] = check.violations
    assert found.invariant == fsch.READ_GAPS
    assert "no read of the store for 45 s (0 s to 45 s)" in found.detail
    assert check.longest_gap_s == 45.0


def test_a_gap_over_an_outage_of_the_schedule_is_no_gap_of_the_checker() -> None:
    readers, clock = Readers(), Clock()
    check = checker(readers, clock, gap_limit_s=30.0)
    check.check_once()
    readers.store = OSError("connection refused")
    with check.store_outage():
        clock.now += 40.0
        check.check_once()  # fails: the store is down on purpose
    readers.store = stored()
    clock.now += 5.0
    check.check_once()
    assert check.violations == [] and check.counts["store unread"] == 1
    assert check.longest_gap_s == 45.0


def test_a_woken_checker_reads_at_once_not_at_its_next_interval() -> None:
    readers = Readers()
    rounds = threading.Semaphore(0)

    def read_jobs() -> list[Any]:
        rounds.release()
        return []

    check = fsch.Checker(
        RUN, keep=5, checkpoint_every=2, read_store=readers.read_store, read_jobs=read_jobs,
        head_ready=lambda: True, logs=lambda: readers.view, interval_s=3600.0, settle_s=30.0,
        unanswered_limit_s=60.0, partials_allowed=False,
    )  # fmt: skip
    check.start()
    try:
        assert rounds.acquire(timeout=10)  # its first round, at start
        check.wake()
        assert rounds.acquire(timeout=10)  # not an hour later
    finally:
        check.stop(10.0, final=False)


def test_a_job_api_that_hangs_delays_no_read_of_the_store() -> None:
    readers = Readers()
    hung, store_reads = threading.Event(), threading.Semaphore(0)

    def read_jobs() -> list[Any]:
        hung.wait(30)  # a request to a head gone mid-way
        return []

    def read_store() -> Any:
        store_reads.release()
        return readers.store

    check = fsch.Checker(
        RUN, keep=5, checkpoint_every=2, read_store=read_store, read_jobs=read_jobs,
        head_ready=lambda: True, logs=lambda: readers.view, interval_s=0.01, settle_s=30.0,
        unanswered_limit_s=60.0, partials_allowed=False,
    )  # fmt: skip
    check.start()
    try:
        assert all(store_reads.acquire(timeout=10) for _ in range(3))
    finally:
        hung.set()
        check.stop(10.0, final=False)
    assert check.violations == []


def test_the_checkers_own_layout_names_are_the_products() -> None:
    # The checker reads the stored run on its own; the names are the contract between.
    from training.runstore import atomic, attempts, listing, retention

    assert (fsch.CHECKPOINTS, fsch.LATEST, fsch.META, fsch.LEASE_DIR) == (
        listing.CHECKPOINTS, listing.LATEST, listing.META, listing.LEASE,
    )  # fmt: skip
    assert (fsch.METRICS, fsch.ATTEMPTS_FILE) == (retention.METRICS, attempts.FILE)
    assert fsch.PARTIAL_PREFIX == atomic.PARTIAL_PREFIX
    assert fsch.lease_generation(listing.lease_name(7)) == 7
    assert fsch.iteration_of("checkpoint_000012") == retention.iteration_of("checkpoint_000012")


def test_a_checkpoint_whose_meta_names_no_files_is_not_whole_to_the_checker() -> None:
    meta = '{"iteration": 2, "env_steps_total": 200, "algo": "PPO"}'
    sizes = {"checkpoints/checkpoint_000002/uerl.json": 60}
    assert not fsch.holds_whole("checkpoint_000002", meta, sizes)


def test_the_seed_replays_the_moment_each_fault_strikes_within_its_iteration() -> None:
    one = fsch.make_schedule(5, BUCKET_FAULTS, first=(2, 3), gap=(1, 2), salt="bucket")
    again = fsch.make_schedule(5, BUCKET_FAULTS, first=(2, 3), gap=(1, 2), salt="bucket")
    delays = [fault.delay_s for fault in one.faults]
    assert delays == [fault.delay_s for fault in again.faults]
    assert all(fsch.DELAY_S[0] <= d <= fsch.DELAY_S[1] for d in delays) and len(set(delays)) > 1
    assert f"and {delays[0]} s" in one.describe()
