"""Between two iterations: follow the endpoints, remove the runners of games that left,
add runners for games that joined, report each change in one line and one event."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.endpoints import Endpoints
from training.policies.game_spec import GameSpec
from training.protocol.game_definition import same_agents
from training.rescale.admission import Admission
from training.rescale.endpoints_watch import EndpointsWatch
from training.rescale.plan import RescalePlan, Runner, game_name, plan_rescale
from training.rescale.runner_pool import JoinFailure, RunnerPool
from training.rllib.runner_registry import RunnerRegistry

Log = Callable[[str], None]
# A probe of a new game from the driver: short, it runs between iterations.
PROBE_TIMEOUT_S = 2.0
# Sidecar pattern, shrink: how long the runners wait for KubeRay to delete the pods it
# chose (then the runners on them leave); past it, the highest slots leave instead.
SHRINK_SETTLE_S = 120.0


class Rescaler:
    def __init__(
        self,
        algo: Any,
        endpoints: Endpoints,
        game: GameSpec,
        *,
        watch: EndpointsWatch | None,
        admission_timeout_s: float,
        log: Log,
        events_path: Path,
    ) -> None:
        self.endpoints = endpoints
        self.game = game
        self.watch = watch
        self.log = log
        self.events_path = events_path
        self.admission_timeout_s = admission_timeout_s
        self.registry = RunnerRegistry.of_this_job()
        self.pool = RunnerPool(algo, self.registry)
        self.admission = Admission(admission_timeout_s)
        self.registry.set_game(game.signature())
        self.registry.set_members(self.pool.worker_indices())
        self.rescales = 0  # rescales followed (runners joined or left)
        self._changed_at: float | None = None  # wall time the endpoints change was seen
        self._noticed: float | None = None  # the same, monotonic
        # The cluster's units of the custom resource, watched while games are given up on.
        self._units: float | None = None
        # Runners that joined and have not yet reported a sample: {worker index: slot}.
        self._joined_not_sampling: dict[int, int] = {}
        # Sidecar pattern: when a shrink was first seen (monotonic), until it is done.
        self._shrink_since: float | None = None

    @property
    def runners(self) -> int:
        return len(self.pool.runners)

    @property
    def wanted(self) -> int:
        return self.endpoints.num_env_runners

    def worker_indices(self) -> list[int]:
        return self.pool.worker_indices()

    def between_iterations(self) -> None:
        """Follow the endpoints: remove the runners of games that left, start runners for
        games that joined and answer, put in service those that came up since."""
        started = time.monotonic()
        if self.watch is not None:
            changed, lines = self.watch.poll()
            for line in lines:
                self.log(line)
            if changed is not None:
                self.endpoints = changed
                self._changed_at = time.time()
                self._noticed = started
                self.admission.endpoints_changed()
        self._retry_given_up_on_new_nodes()
        plan = (
            self._tied_plan()
            if self._tied_to_pods()
            else plan_rescale(self.pool.runners.values(), self.wanted)
        )
        self.admission.want(plan.add_slots)
        self.pool.cancel(set(self.pool.starting_slots()) - set(plan.add_slots))
        before = self.runners
        if plan.remove:
            self.pool.remove(list(plan.remove))
        failures = self._start_due()
        joined, failed = self.pool.collect()
        for runner in joined:
            self.admission.admitted(runner.slot)
        for failure in failures + failed:
            line = self.admission.failed(failure.slot, failure.error, refuse=failure.refused)
            if line is not None:
                self.log(line)
            if failure.slot in self.admission.given_up:
                kind = "game_refused" if failure.refused else "game_given_up"
                self._event(kind, slot=failure.slot, message=failure.error)
        if plan.remove or joined:
            self.registry.set_members(self.pool.worker_indices())
            self.pool.split_train_batch()
            # Joining takes the runners' start-up; it ran beside training since the change.
            since = self._noticed if joined and self._noticed is not None else started
            self._report(before, plan.remove, joined, time.monotonic() - since)
        self._joined_not_sampling.update({r.worker_index: r.slot for r in joined})

    def note_reports(self, reports: list[dict[str, Any]]) -> None:
        """Record when each runner that joined first sampled (from the health reports the
        driver reads after every iteration): the time a rescale took, end to end."""
        for report in reports:
            index = int(report["runner_index"])
            sampled_at = report.get("first_sample_at")
            if index in self._joined_not_sampling and sampled_at is not None:
                slot = self._joined_not_sampling.pop(index)
                since = None if self._changed_at is None else sampled_at - self._changed_at
                self._event(
                    "joined_sampling",
                    slot=slot,
                    runner_index=index,
                    first_sample_at=sampled_at,
                    seconds_since_change=None if since is None else round(since, 3),
                )

    # -- internals -------------------------------------------------------------

    def _tied_to_pods(self) -> bool:
        """Sidecar games on Kubernetes: each lives in its runner's pod (localhost), not at
        an address of its slot."""
        endpoints = self.endpoints
        routed = "{worker_index}" in endpoints.worker_url_template or (
            endpoints.port_offset_mode == "per_worker"
        )
        return endpoints.pattern == "sidecar" and not routed

    def _tied_plan(self) -> RescalePlan:
        """On a shrink KubeRay deletes the worker pods it chooses: wait (up to
        SHRINK_SETTLE_S) until the cluster has no more units of the custom resource than
        games wanted, and remove the runners whose pod went. Runners are never removed
        from pods that stay while others still go."""
        runners = list(self.pool.runners.values())
        if len(runners) <= self.wanted:
            self._shrink_since = None
            return plan_rescale(runners, self.wanted, tied_to_pods=True)
        from training.preflight.checks import node_rooms
        from training.rescale.runner_nodes import runners_whose_node_left

        now = time.monotonic()
        if self._shrink_since is None:
            self._shrink_since = now
        manager = self.pool.group._worker_manager
        index_of = {r.actor_id: r.worker_index for r in runners}
        actors = {aid: h for aid, h in manager.actors().items() if aid in index_of}
        found, unknown = runners_whose_node_left(actors, index_of)
        gone = frozenset(found)
        units = sum(room.custom_total for room in node_rooms(self.endpoints.custom_resource))
        settled = units <= self.wanted + 1e-9
        if not settled and now - self._shrink_since < SHRINK_SETTLE_S:
            # Only the runners whose pod already went; the rest wait for KubeRay.
            return plan_rescale(runners, len(runners) - len(gone), tied_to_pods=True, gone=gone)
        if not settled:
            self._by_highest_slots(
                f"the cluster still has {units:g} unit(s) of "
                f"{self.endpoints.custom_resource!r} after {SHRINK_SETTLE_S:.0f} s for "
                f"{self.wanted} game(s)",
                reason="settle_timeout",
            )
        elif unknown is not None and len(runners) - len(gone) > self.wanted:
            # The pods went, but which ones is not known: some runners that leave may be
            # on pods that stay (their games answer) and some that stay lost theirs.
            self._by_highest_slots(
                f"Ray's state API did not say which env runners' pods went ({unknown})",
                reason="state_api_failed",
            )
        return plan_rescale(runners, self.wanted, tied_to_pods=True, gone=gone)

    def _by_highest_slots(self, why: str, *, reason: str) -> None:
        """A shrink that removes runners by slot, not by the pods that went: one line, one
        event."""
        self.log(f"rescale: {why}; removing the runners of the highest slots")
        self._event("shrink_by_slot", reason=reason, message=why)

    def _start_due(self) -> list[JoinFailure]:
        """Probe the games that are due; start a runner for each that answers, as far as
        Ray nodes have free units of the custom resource."""
        failures: list[JoinFailure] = []
        answering: list[int] = []
        for slot in self.admission.due():
            problem = self._probe(slot)
            if problem is None:
                answering.append(slot)
            else:
                failures.append(problem)
        room = self._free_units() if answering else 0
        for slot in answering[room:]:
            failures.append(
                JoinFailure(
                    slot,
                    f"no Ray node has a free unit of {self.endpoints.custom_resource!r} yet",
                    refused=False,
                )
            )
        starting = answering[:room]
        # Ray places the runner, then its constructor waits for the game like at start.
        ready_timeout_s = self.admission_timeout_s + self.endpoints.simulator_startup_timeout_s
        self.pool.start(starting, ready_timeout_s=ready_timeout_s)
        for slot in starting:
            self.admission.starting(slot)
        return failures

    def _probe(self, slot: int) -> JoinFailure | None:
        """Ask a new game for its definition from the driver, where the driver can reach it
        (networked, local); a sidecar game is reached only from its node: its runner's
        constructor asks it instead."""
        from training.preflight.discovery import discover
        from training.tls.config import for_games

        endpoints = self.endpoints
        if self._tied_to_pods():
            return None
        endpoint = endpoints.worker_endpoint(slot)
        try:
            spec = discover(endpoint, timeout_s=PROBE_TIMEOUT_S, tls=for_games(endpoints.tls))
        except Exception as exc:  # no answer yet: retried with backoff
            return JoinFailure(slot, f"{endpoint} does not answer: {exc}", refused=False)
        if not same_agents(spec.signature(), self.game.signature()):
            return JoinFailure(
                slot,
                f"{endpoint} defines agents {sorted(spec.agents)} with other spaces than "
                f"the run's game (agents {sorted(self.game.agents)})",
                refused=True,
            )
        return None

    def _free_units(self) -> int:
        from training.preflight.checks import node_rooms

        rooms = node_rooms(self.endpoints.custom_resource)
        return sum(int(room.custom + 1e-9) for room in rooms)

    def _retry_given_up_on_new_nodes(self) -> None:
        """Games given up on get another chance when the cluster's units of the custom
        resource change (a worker node joined or left: a pod that took long came up)."""
        if not self.admission.given_up:
            self._units = None
            return
        from training.preflight.checks import node_rooms

        units = sum(room.custom_total for room in node_rooms(self.endpoints.custom_resource))
        if self._units is not None and units != self._units:
            self.log(
                f"rescale: the cluster now has {units:g} unit(s) of "
                f"{self.endpoints.custom_resource!r}; trying the games given up on again"
            )
            self.admission.endpoints_changed()
        self._units = units

    def _report(
        self, before: int, removed: tuple[Runner, ...], joined: list[Runner], seconds: float
    ) -> None:
        parts = []
        if joined:
            names = ", ".join(game_name(r.slot) for r in sorted(joined, key=lambda r: r.slot))
            parts.append(f"{names} joined")
        if removed:
            names = ", ".join(game_name(r.slot) for r in sorted(removed, key=lambda r: r.slot))
            parts.append(f"{names} left")
        self.rescales += 1
        self.log(
            f"rescale: {before} -> {self.runners} env runners ({'; '.join(parts)}) "
            f"in {seconds:.1f} s"
        )
        self._event(
            "rescale",
            runners_before=before,
            runners_after=self.runners,
            joined=[r.slot for r in joined],
            left=[r.slot for r in removed],
            seconds=round(seconds, 3),
            endpoints_changed_at=self._changed_at,
        )

    def _event(self, kind: str, **fields: Any) -> None:
        self.events_path.parent.mkdir(parents=True, exist_ok=True)
        with self.events_path.open("a") as fh:
            fh.write(json.dumps({"kind": kind, "at": time.time(), **fields}) + "\n")
