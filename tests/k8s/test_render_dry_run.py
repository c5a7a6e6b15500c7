"""The real API server agrees with the topology on random values: the property test of
`make test` (tests/test_topology_oracle.py) with the tier's kube-apiserver as the oracle.

Random names, label keys and values, images, affinities and spread constraints, valid and
not, each at its place in a topology that uses every place (tests/k8s_value_cases.py;
seeded, the seed printed, UERL_DRY_RUN_SEED replays it). Rendered by the one renderer
`uerl render` and `pulumi up` use (infra.manifests.build), the objects go to
`kubectl create --dry-run=server` (strict field validation, kubectl's default), with the
Pods KubeRay would make of the RayCluster's templates (the API server validates a pod
spec only on a Pod). Every topology the model takes is taken whole by the API server;
for a value the model refuses, the objects it would have rendered with the raw value in
its place are refused, unless the API server is not that value's judge: an image only
the kubelet parses (the API server refuses only an empty one or whitespace at its ends),
or a rule of uerl's own (k8s_value_cases.uerl_stricter); those are counted and printed.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import ControlPlane
from host_speed import guard
from k8s_value_cases import (
    NAMESPACE,
    PLACES,
    Case,
    Verdict,
    cases,
    ray_pods,
    rendered,
    uerl_stricter,
)

# pyproject's limit, scaled here: tests/conftest.py scales the limits of tests/*.py only.
# One kubectl dry run a case (under a second each, idle) and a control plane's start
# (when this module is the first on the shared plane).
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(guard(900))]

SEED_ENV = "UERL_DRY_RUN_SEED"
CASES_ENV = "UERL_DRY_RUN_CASES"
# Seven of each kind of value, by default.
CASES = int(os.environ.get(CASES_ENV, str(7 * len(PLACES))))


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The shared control plane (KubeRay's CRDs established; its operator does nothing
    with a dry run) and the namespace every case's objects are in, its default
    ServiceAccount made (a Pod's admission looks it up). The namespace goes after the
    module, as the plane is shared."""
    cp = control_plane
    cp.kubectl("create", "namespace", NAMESPACE)
    cp.wait_until(
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False)
        .returncode == 0,
        guard(120),
        f"the ServiceAccount {NAMESPACE}/default",
    )  # fmt: skip
    yield cp
    cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found")


def sent(case: Case, verdict: Verdict) -> list[dict[str, Any]]:
    """What goes to the dry run: the Namespace alone when it is the value (the others
    would be in a namespace that does not exist), else every namespaced object and the
    Pods KubeRay would make."""
    if case.place.kind == "namespace":
        return [o for o in verdict.objects if o["kind"] == "Namespace"]
    objects = [o for o in verdict.objects if o["kind"] != "Namespace"]
    return objects + ray_pods(objects)


def dry_run(cp: ControlPlane, objects: list[dict[str, Any]]) -> list[str]:
    """The API server's refusals of `objects` ([]: every one taken). An object that exists
    already (a Namespace named `default`) passed validation, which comes first."""
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    result = cp.kubectl(
        "create", "--dry-run=server", "-o", "name", "-f", "-", input=listed, check=False
    )
    refusals = [
        line
        for line in result.stderr.splitlines()
        if line.lower().startswith("error") and "already exists" not in line.lower()
    ]
    if result.returncode != 0 and not refusals and "already exists" not in result.stderr:
        refusals = [result.stderr.strip() or f"kubectl exited {result.returncode}"]
    return refusals


def test_the_api_server_takes_the_base_and_refuses_a_known_bad_value(api: ControlPlane) -> None:
    by_kind = {place.kind: place for place in PLACES}
    good = Case(by_kind["label value"], "rl")
    verdict = rendered(good)
    assert verdict.error is None and dry_run(api, sent(good, verdict)) == []
    # A run name ending in `-` as a label value (a Job's, a pod's).
    bad = Case(by_kind["label value"], "rl-")
    verdict = rendered(bad)
    assert verdict.error is not None and "'rl-'" in verdict.error, verdict.error
    refusals = dry_run(api, sent(bad, verdict))
    assert any('"rl-"' in line for line in refusals), refusals


def test_the_api_server_refuses_exactly_what_the_topology_refuses(api: ControlPlane) -> None:
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))
    print(f"dry-run seed {seed} (replay: {SEED_ENV}={seed})")
    disagreements = []
    tally = {"accepted": 0, "refused": 0, "the kubelet's": 0, "uerl's own rule": 0}
    for case in cases(random.Random(seed), CASES):
        verdict = rendered(case)
        refusals = dry_run(api, sent(case, verdict))
        if verdict.error is None:
            tally["accepted"] += 1
            if refusals:
                disagreements.append(f"model took {case.describe()}, API server: {refusals[:2]}")
        elif refusals:
            tally["refused"] += 1
        elif case.refused_outside_kubernetes:
            tally["the kubelet's"] += 1
        elif uerl_stricter(case):
            tally["uerl's own rule"] += 1
        else:
            line = verdict.error.splitlines()[1].strip()
            disagreements.append(f"model refused {case.describe()} ({line}), API server took it")
    print(f"dry-run seed {seed}: {tally}")
    assert not disagreements, f"seed {seed} ({SEED_ENV}):\n" + "\n".join(disagreements[:10])
    assert tally["accepted"] > CASES // 5 and tally["refused"] > CASES // 5, tally
