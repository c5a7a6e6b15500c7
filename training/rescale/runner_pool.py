"""The algorithm's remote env runners, added and removed with RLlib's EnvRunnerGroup means.

New runners are built (in the background: training goes on meanwhile) as
`EnvRunnerGroup.add_workers` builds them (`_make_worker` with
the group's config reference), but numbered by this pool: `add_workers` numbers them
`num_actors() + i + 1`, which repeats the index of a live runner after a removal. Each
runner's game slot goes into the run's `RunnerRegistry` before it starts. A runner is
put in service only once it is up (its game answered in its constructor) and holds the
current weights and connector states, synced from the local env runner as RLlib's
`Algorithm.restore_env_runners` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.rescale.plan import Runner
from training.rllib.runner_registry import RunnerRegistry

# What the pool uses of RLlib beyond its public API (RLlib has no public way to add a
# runner numbered by the caller): {class: attributes}. Checked when a pool starts, and by
# tests/test_rescale_units.py against the installed RLlib, so a Ray upgrade that moves one
# fails naming it instead of in the middle of a rescale.
RLLIB_INTERNALS: dict[str, tuple[str, ...]] = {
    "EnvRunnerGroup": ("_worker_manager", "_make_worker", "_remote_config_obj_ref", "_env_creator"),
    "FaultTolerantActorManager": ("_next_id", "actor_ids", "actors", "add_actors", "remove_actor"),
}

STOP_TIMEOUT_S = 5.0
# How long runners that are up wait for the others started with them before joining.
JOIN_TOGETHER_S = 15.0


@dataclass(frozen=True)
class Starting:
    """A runner being built (Ray schedules it, its constructor opens its game)."""

    slot: int
    worker_index: int
    actor: Any
    deadline: float  # monotonic
    timeout_s: float


@dataclass(frozen=True)
class JoinFailure:
    slot: int
    error: str
    refused: bool  # the game answered, with other spaces: retrying cannot help


class RLlibInternalsChanged(RuntimeError):
    """The installed RLlib lacks an internal the pool relies on (a Ray upgrade moved it)."""


def check_rllib_internals(group: Any) -> None:
    """RLlibInternalsChanged naming every internal of RLLIB_INTERNALS `group` (an
    EnvRunnerGroup) or its actor manager lacks."""
    owners = {
        "EnvRunnerGroup": group,
        "FaultTolerantActorManager": getattr(group, "_worker_manager", None),
    }
    missing = [
        f"{owner}.{name}"
        for owner, names in RLLIB_INTERNALS.items()
        if owners[owner] is not None
        for name in names
        if not hasattr(owners[owner], name)
    ]
    if missing:
        import ray

        raise RLlibInternalsChanged(
            f"RLlib (ray {ray.__version__}) has no {', '.join(missing)}: live rescale "
            "(training/rescale/runner_pool.py) uses them; install the Ray version "
            "pyproject.toml pins, or port RunnerPool to this one"
        )


class RunnerPool:
    def __init__(self, algo: Any, registry: RunnerRegistry) -> None:
        self.algo = algo
        self.group = algo.env_runner_group
        check_rllib_internals(self.group)
        self.registry = registry
        # RLlib built runners 1..N as actors 1..N, each on the game of its own index.
        self.runners: dict[int, Runner] = {
            aid: Runner(aid, aid, aid) for aid in self._manager.actor_ids()
        }
        self._next_index = max(self.runners, default=0) + 1
        # Runners being built: {their readiness call: what they are for}.
        self.starting: dict[Any, Starting] = {}
        self._first_ready_at: float | None = None

    @property
    def _manager(self) -> Any:
        return self.group._worker_manager

    def worker_indices(self) -> list[int]:
        return sorted(r.worker_index for r in self.runners.values())

    def start(self, slots: list[int], *, ready_timeout_s: float) -> None:
        """Start one runner per slot; they join (`collect`) once up, while training goes on."""
        import time

        for slot in slots:
            index = self._next_index
            self._next_index += 1
            self.registry.assign(index, slot)
            actor = self.group._make_worker(
                env_creator=self.group._env_creator,
                validate_env=None,
                worker_index=index,
                num_workers=len(self.runners) + len(self.starting) + 1,
                config=self.group._remote_config_obj_ref,
            )
            ready = actor.assert_healthy.remote()
            deadline = time.monotonic() + ready_timeout_s
            self.starting[ready] = Starting(slot, index, actor, deadline, ready_timeout_s)

    def starting_slots(self) -> list[int]:
        return sorted(s.slot for s in self.starting.values())

    def cancel(self, slots: set[int]) -> None:
        """Stop runners still starting for games that left meanwhile."""
        import ray

        for ref, starting in list(self.starting.items()):
            if starting.slot in slots:
                del self.starting[ref]
                ray.kill(starting.actor, no_restart=True)

    def collect(self) -> tuple[list[Runner], list[JoinFailure]]:
        """Put in service the runners that came up (weights synced first); the ones that
        failed or outlived their deadline are stopped and reported."""
        import time

        import ray

        if not self.starting:
            return [], []
        refs = list(self.starting)
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
        # Only runners not up yet can outlive their start deadline: one that is up and held
        # back below to join with the others is waiting on them, not failing.
        late = set(pending)
        if ready and pending:
            # Runners started together join together (one change, one line), unless the
            # others lag behind the first by more than JOIN_TOGETHER_S.
            now = time.monotonic()
            self._first_ready_at = self._first_ready_at or now
            if now - self._first_ready_at < JOIN_TOGETHER_S:
                ready = []
        if ready:
            self._first_ready_at = None
        joined: list[Runner] = []
        failures: list[JoinFailure] = []
        for ref in ready:
            starting = self.starting.pop(ref)
            try:
                ray.get(ref)
            except Exception as exc:  # the constructor failed: its game refused or died
                ray.kill(starting.actor, no_restart=True)
                failures.append(JoinFailure(starting.slot, _first_line(exc), _refused(exc)))
                continue
            actor_id = self._manager._next_id
            self._manager.add_actors([starting.actor])
            joined.append(Runner(actor_id, starting.worker_index, starting.slot))
        now = time.monotonic()
        for ref, starting in list(self.starting.items()):
            if ref in late and now > starting.deadline:
                del self.starting[ref]
                ray.kill(starting.actor, no_restart=True)
                failures.append(
                    JoinFailure(
                        starting.slot,
                        f"its env runner was not up within {starting.timeout_s:g} s (no free "
                        "Ray node with the custom resource, or the game did not answer it)",
                        refused=False,
                    )
                )
        if joined:
            self._sync_state([r.actor_id for r in joined])
            for runner in joined:
                self.runners[runner.actor_id] = runner
        return joined, failures

    def wait_for_starting(self, timeout_s: float) -> None:
        """Block until a starting runner is up or failed (the driver has nothing else to
        do while no runner samples), at most `timeout_s`."""
        import ray

        if self.starting:
            ray.wait(list(self.starting), num_returns=1, timeout=timeout_s)

    def remove(self, runners: list[Runner]) -> None:
        """Take runners out of service and stop them; episodes they had going are dropped
        with them (never returned, so never counted)."""
        import ray

        handles = []
        for runner in runners:
            self.runners.pop(runner.actor_id, None)
            if runner.actor_id in self._manager.actor_ids():
                handles.append(self._manager.remove_actor(runner.actor_id))
        # stop() closes the game session cleanly; a runner whose node is gone cannot.
        stops = [h.stop.remote() for h in handles]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=STOP_TIMEOUT_S)
        for handle in handles:
            ray.kill(handle, no_restart=True)

    def split_train_batch(self) -> None:
        """Give each runner its share of the train batch for the runners there are now,
        as RLlib's "auto" rollout fragment length would for a run built with this many."""
        lengths = fragment_lengths(self.algo.config, self.worker_indices())
        if not lengths:
            return
        self.registry.set_fragment_lengths(lengths)  # for runners Ray restarts
        self.group.foreach_env_runner(
            func=lambda env_runner: env_runner.follow_fragment_lengths(lengths),
            local_env_runner=False,
            timeout_seconds=self.algo.config.env_runner_restore_timeout_s,
        )

    def _sync_state(self, actor_ids: list[int]) -> None:
        """The new runners get the local env runner's state: module weights and connector
        states (kept current by every iteration's weight sync)."""
        import ray

        source = self.group.local_env_runner
        state_ref = ray.put(source.get_state())

        def _set_state(env_runner: Any) -> None:
            env_runner.set_state(ray.get(state_ref))

        self.group.foreach_env_runner(
            func=_set_state,
            remote_worker_ids=actor_ids,
            local_env_runner=False,
            timeout_seconds=self.algo.config.env_runner_restore_timeout_s,
        )


def fragment_lengths(config: Any, worker_indices: list[int]) -> dict[int, int]:
    """{worker index: rollout fragment length} for this many runners; {} unless "auto"."""
    if config.rollout_fragment_length != "auto" or not worker_indices:
        return {}
    resized = config.copy(copy_frozen=False)
    resized.num_env_runners = len(worker_indices)
    return {
        index: resized.get_rollout_fragment_length(worker_index=position)
        for position, index in enumerate(sorted(worker_indices), start=1)
    }


def _first_line(exc: BaseException) -> str:
    """The constructor's own error out of Ray's wrapping (traceback and all)."""
    text = str(exc)
    for marker in ("GameChangedError:", "UEConnectionError:", "UEProtocolError:"):
        if marker in text:
            return text.split(marker, 1)[1].strip().splitlines()[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _refused(exc: BaseException) -> bool:
    return "GameChangedError" in str(exc)
