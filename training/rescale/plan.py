"""Which env runners leave and which game slots need one: a pure function of the two sets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Runner:
    """A remote env runner: RLlib's actor id, the worker index it was built with, its game."""

    actor_id: int
    worker_index: int
    slot: int


@dataclass(frozen=True)
class RescalePlan:
    remove: tuple[Runner, ...] = ()
    add_slots: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.remove and not self.add_slots


def plan_rescale(
    runners: Iterable[Runner],
    games: int,
    *,
    tied_to_pods: bool = False,
    gone: frozenset[int] = frozenset(),
) -> RescalePlan:
    """Games are slots 1..`games` (StatefulSet ordinals, local ports): a runner whose slot
    left goes, a slot without a runner gets one. A second runner on one slot goes too:
    two clients must never share a game.

    `tied_to_pods` (the sidecar pattern on Kubernetes): each game lives in its runner's
    own pod, and on a shrink KubeRay, not the slot number, decides which pods go. The
    runners whose pod went (`gone`, worker indices) leave first, whatever their slot;
    only then, if there are still more runners than `games`, the highest slots."""
    if tied_to_pods:
        return _plan_tied(list(runners), games, gone)
    remove: list[Runner] = []
    held: set[int] = set()
    for runner in sorted(runners, key=lambda r: (r.slot, r.worker_index)):
        if runner.slot > games or runner.slot < 1 or runner.slot in held:
            remove.append(runner)
        else:
            held.add(runner.slot)
    add = tuple(slot for slot in range(1, games + 1) if slot not in held)
    return RescalePlan(tuple(remove), add)


def _plan_tied(runners: list[Runner], games: int, gone: frozenset[int]) -> RescalePlan:
    ordered = sorted(runners, key=lambda r: (r.slot, r.worker_index))
    remove = [r for r in ordered if r.worker_index in gone]
    kept = [r for r in ordered if r.worker_index not in gone]
    if len(kept) > games:
        remove += kept[games:]
        kept = kept[:games]
    held = {r.slot for r in kept}
    free = (slot for slot in range(1, games + len(ordered) + 1) if slot not in held)
    add = tuple(next(free) for _ in range(games - len(kept)))
    return RescalePlan(tuple(remove), add)


def game_name(slot: int) -> str:
    """How lines name a game: its slot, as the local games and the StatefulSet pods end."""
    return f"ue-{slot}"
