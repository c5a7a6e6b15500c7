"""Sidecar games on Kubernetes: on a shrink the runners whose pods KubeRay deleted leave."""

from __future__ import annotations

from training.rescale.plan import Runner, plan_rescale


def _runners(*slots: int) -> list[Runner]:
    return [Runner(actor_id=slot, worker_index=slot, slot=slot) for slot in slots]


def test_the_runners_whose_pods_went_leave_whatever_their_slot() -> None:
    plan = plan_rescale(_runners(1, 2, 3), 1, tied_to_pods=True, gone=frozenset({1, 3}))
    assert [r.slot for r in plan.remove] == [1, 3]
    assert plan.add_slots == ()


def test_while_pods_still_go_only_the_runners_whose_pod_went_leave() -> None:
    # Three runners, one pod gone so far: the rescaler asks for the two that remain.
    plan = plan_rescale(_runners(1, 2, 3), 2, tied_to_pods=True, gone=frozenset({2}))
    assert [r.slot for r in plan.remove] == [2]
    assert plan.add_slots == ()


def test_past_the_wait_the_highest_slots_leave_besides_the_gone_ones() -> None:
    plan = plan_rescale(_runners(1, 2, 3, 4), 1, tied_to_pods=True, gone=frozenset({1}))
    assert [r.slot for r in plan.remove] == [1, 3, 4]


def test_a_grow_takes_the_lowest_free_slots_after_the_kept_runners() -> None:
    # After a shrink kept slots 2 and 3, two more games get slots 1 and 4.
    plan = plan_rescale(_runners(2, 3), 4, tied_to_pods=True)
    assert plan.remove == ()
    assert plan.add_slots == (1, 4)


def test_without_pods_the_slot_numbers_decide() -> None:
    plan = plan_rescale(_runners(1, 2, 3), 1, gone=frozenset({1}))
    assert [r.slot for r in plan.remove] == [2, 3]
