"""The uerl Pulumi program: reads `uerl:topology`, creates what infra.manifests builds.

Pulumi runs this with runpy.run_path("infra/"), which puts infra/ itself (not
the project root) first on sys.path; the project is normally installed in the
venv, and the fallback below covers a venv where it is not.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

try:
    import infra  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra import manifests
from infra.components import (
    KubeRayOperator,
    RunStorage,
    StackMetrics,
    StackNetworkPolicies,
    StackServiceAccounts,
    UeExecutablesVolume,
    UeGames,
    UerlRayCluster,
)
from infra.components.k8s import register, stack_provider
from infra.components.metrics_component import require_pod_monitor_crd
from infra.topology import Topology, TopologyError


def load_topology() -> Topology:
    """The stack's topology; invalid config stops `pulumi preview` with one message."""
    try:
        raw = pulumi.Config("uerl").get_object("topology")
    except pulumi.ConfigTypeError as exc:
        raise pulumi.RunError(f"topology: not a valid structured config value: {exc}") from None
    try:
        return Topology.parse(raw, root="topology")
    except TopologyError as exc:
        # RunError: Pulumi prints the message alone, without a traceback.
        raise pulumi.RunError(str(exc)) from None


def namespace_options(topology: Topology) -> pulumi.ResourceOptions:
    """The stack's own namespace outlives `pulumi destroy` when it holds a runs claim the
    destroy must leave (uerl's, kept by `runs.claim.keep_on_destroy`, or the user's own):
    deleting a namespace deletes every object in it, and on a `Delete` storage class every
    run on the claim. Then the next `pulumi up` takes it back, as it does the claim.

    Top-level, as it always was: a parent would change its URN, and the engine would
    replace it, deleting everything in it."""
    if topology.runs.store != "claim" or not topology.runs.claim.keep_on_destroy:
        return pulumi.ResourceOptions()
    return pulumi.ResourceOptions(
        retain_on_delete=True,
        provider=stack_provider("namespace-keep", None, upsert_existing_objects=True),
    )


# The project root (Pulumi.yaml): Pulumi runs this program in infra/, but
# relative paths in the topology are the user's, relative to the project.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    topology = load_topology()
    try:
        objects = manifests.build(topology, PROJECT_ROOT)
    except TopologyError as exc:
        raise pulumi.RunError(str(exc)) from None

    if objects.pod_monitor is not None:
        require_pod_monitor_crd()

    base: list[pulumi.Resource] = []
    if objects.namespace is not None:
        base.append(register(objects.namespace, namespace_options(topology)))
    # Pods may run as these: they exist before any pod does.
    accounts: list[pulumi.Resource] = []
    if objects.service_accounts:
        accounts += StackServiceAccounts(
            "service-accounts", objects.service_accounts, depends_on=base
        ).accounts

    operator_deps: list[pulumi.Resource] = []
    if objects.operator is not None:
        in_our_ns = objects.operator.namespace == topology.namespace
        operator = KubeRayOperator(
            "kuberay",
            objects.operator,
            (topology.namespace, topology.name),
            depends_on=base if in_our_ns else [],
        )
        operator_deps.append(operator.chart)

    game_deps = [*base, *accounts]
    if topology.uses_executables:
        volume = UeExecutablesVolume(
            "ue-executables",
            topology.claim_name,
            objects.pvc,
            objects.loader_job,
            depends_on=[*base, *accounts],
        )
        game_deps += volume.ready

    # The policies exist before any pod they guard does.
    if objects.network_policies:
        fence = StackNetworkPolicies("network-policies", objects.network_policies, depends_on=base)
        base = [*base, *fence.policies]
        game_deps += fence.policies

    # Sidecar games run inside the RayCluster's worker pods.
    pod_deps = game_deps if topology.pattern == "sidecar" else [*base, *accounts]
    cluster_deps = [*operator_deps, *pod_deps]
    # The head mounts the runs claim.
    if objects.runs_pvc is not None:
        keep = topology.runs.claim.keep_on_destroy
        cluster_deps.append(RunStorage("runs", objects.runs_pvc, keep, depends_on=base).pvc)
    UerlRayCluster(topology.name, objects.raycluster, objects.endpoints, depends_on=cluster_deps)

    if objects.pod_monitor is not None:
        StackMetrics("metrics", objects.pod_monitor, depends_on=base)

    if objects.ue_statefulset is not None and objects.ue_service is not None:
        UeGames("ue-games", objects.ue_statefulset, objects.ue_service, depends_on=game_deps)

    pulumi.export("endpoints", topology.endpoints().model_dump(mode="json"))


# When an update fails, the engine interrupts the program while it still waits on the
# failed resource's outputs; the default KeyboardInterrupt would print the language
# host's traceback under the real error. Everything the program had to say is sent.
signal.signal(signal.SIGINT, lambda *_: os._exit(1))
main()
