"""TrainingCluster (`uerl:index:TrainingCluster`): the whole uerl stack as one Pulumi
component, from one typed topology. uerl's own program (`infra/__main__.py`) makes one; a
team's program makes one beside its cluster, registry and buckets, in any language
(`pulumi package add`, infra/package/).

Every resource uerl makes is the component's child, so a Kubernetes provider given to the
component (`providers`/`provider`) reaches each of them, and `protect` and transformations
pass down as Pulumi passes them. Resources that were top-level before the component
existed carry an alias to their old place: a stack made by an earlier uerl moves under it
with nothing replaced.
"""

# No `from __future__ import annotations`: the component package's schema is inferred
# from these annotations as types (infra/package).
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import pulumi
import yaml

from infra import manifests
from infra.components._generated import topology_args
from infra.components.instances import UeGames
from infra.components.k8s import ClusterAccess, kubeconfig_is_text, register, stack_provider
from infra.components.metrics_component import StackMetrics, require_pod_monitor_crd
from infra.components.network_policies import StackNetworkPolicies
from infra.components.operator_component import KubeRayOperator
from infra.components.raycluster_component import UerlRayCluster
from infra.components.runs_component import RunStorage
from infra.components.service_accounts import StackServiceAccounts
from infra.components.volume_component import UeExecutablesVolume
from infra.topology import Topology, TopologyError

TYPE = "uerl:index:TrainingCluster"
# Where the children sat before the component (uerl's own program, top-level).
WAS_TOP_LEVEL = [pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)]


class InputRefused(pulumi.RunError):
    """An input the component refuses. A RunError: Pulumi prints the message alone,
    without a traceback; `problems`, each (input path, reason), are what the component
    package gives Pulumi as input errors (infra/package/__main__.py)."""

    def __init__(self, message: str, problems: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.problems = problems

    @classmethod
    def at(cls, path: str, reason: str) -> "InputRefused":
        return cls(f"{path}: {reason}", [(path, reason)])

    @classmethod
    def of(cls, exc: TopologyError) -> "InputRefused":
        return cls(str(exc), list(exc.problems))


def _unknown_at(value: Any, path: str) -> str | None:
    """The first place in `value` holding an Output (another resource's, unknown at
    preview): uerl decides from the topology what to create, so it must be plain."""
    if isinstance(value, pulumi.Output):
        return path
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _unknown_at(item, f"{path}.{key}")
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _unknown_at(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def parse_topology(raw: Mapping[str, Any] | None, root: str = "topology") -> Topology:
    """The topology from its plain form; a bad one stops the program with one line."""
    unknown = _unknown_at(raw, root)
    if unknown is not None:
        raise InputRefused.at(
            unknown,
            "an output of another resource; the topology decides what uerl creates, so its "
            "values must be plain (known before anything is created)",
        )
    try:
        return Topology.parse(raw, root=root)
    except TopologyError as exc:
        raise InputRefused.of(exc) from None


def needs_cluster_access(topology: Topology) -> list[str]:
    """The topology's settings under which uerl reaches the cluster itself, beside the
    Kubernetes provider, each with what it does so."""
    needing = []
    operator = topology.operator
    if operator.install and operator.crds != "skip":
        needing.append(f"topology.operator.crds ({operator.crds}: uerl applies the CRDs)")
    if topology.runs.store == "claim" and topology.runs.claim.keep_on_destroy:
        needing.append(
            "topology.runs.claim.keep_on_destroy (a provider of uerl's takes the kept claim back)"
        )
    return needing


def check_kubeconfig(value: str) -> None:
    """A plain kubeconfig input is a file's text (a YAML map) or the path of a file;
    otherwise the refusal names the input, not a client library's error at `up`."""
    if kubeconfig_is_text(value):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise InputRefused.at("kubeconfig", f"not YAML{where}") from None
        if not isinstance(parsed, dict):
            raise InputRefused.at(
                "kubeconfig", "not a kubeconfig (a YAML map of clusters, users and contexts)"
            )
        return
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise InputRefused.at(
            "kubeconfig",
            f"{value!r} is a relative path; give an absolute one (uerl's package runs in a "
            "directory of its own) or the file's text",
        )
    if not path.is_file():
        raise InputRefused.at("kubeconfig", f"no such file {value}")


class TrainingClusterArgs(TypedDict):
    """What a TrainingCluster is made of."""

    topology: NotRequired[topology_args.Topology]
    """The topology: the fields, names and defaults of `uerl:topology` (docs/topology.md).
    Missing fields take their defaults; values are checked as `pulumi preview` checks
    `uerl:topology`, each error one line naming the field."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """The cluster's kubeconfig (the file's text, or an absolute path), as given to the
    Kubernetes provider passed in `providers`. uerl reaches the cluster itself for the
    KubeRay CRDs (`topology.operator.crds`) and to take back what a destroy kept
    (`topology.runs.claim.keep_on_destroy`); with a provider of its own and neither this
    nor `context`, a topology that needs them is refused. Without a provider, `kubernetes:`
    config as the default provider reads it."""
    context: NotRequired[pulumi.Input[str]]
    """The kubeconfig context, as given to that provider."""


class TrainingCluster(pulumi.ComponentResource):
    """uerl's training cluster on Kubernetes, from one topology: the KubeRay operator, a
    RayCluster (a head that schedules nothing, learners, env runners), the games (sidecars
    or a StatefulSet), the volumes, the NetworkPolicies and the run store."""

    endpoints: pulumi.Output[dict[str, Any]]
    """What `uerl train` and `uerl submit` read (`pulumi stack output endpoints`): the
    games, Ray's addresses, the run store."""
    namespace: pulumi.Output[str]
    """The namespace every object is in."""
    ray_token_secret: pulumi.Output[str | None]
    """The Secret holding the token Ray's API and GCS ask for (none without a token)."""
    runs_claim: pulumi.Output[str | None]
    """The claim runs are stored on (none when they go to a bucket)."""

    def __init__(
        self,
        name: str,
        args: TrainingClusterArgs,
        opts: pulumi.ResourceOptions | None = None,
        *,
        project_root: Path = manifests.PROJECT_ROOT,
    ) -> None:
        super().__init__(TYPE, name, None, opts)
        topology = args.get("topology")
        if not isinstance(topology, Topology):
            topology = parse_topology(topology)
        try:
            objects = manifests.build(topology, project_root)
        except TopologyError as exc:
            raise InputRefused.of(exc) from None
        self._access = self._cluster_access(args, topology)
        if objects.pod_monitor is not None and self._access is not None:
            require_pod_monitor_crd(self._access)
        self._make(topology, objects)
        endpoints = topology.endpoints().model_dump(mode="json")
        self.endpoints = pulumi.Output.from_input(endpoints)
        self.namespace = pulumi.Output.from_input(topology.namespace)
        self.ray_token_secret = pulumi.Output.from_input(topology.ray_token_secret)
        self.runs_claim = pulumi.Output.from_input(topology.runs_claim_name)
        self.register_outputs(
            {
                "endpoints": self.endpoints,
                "namespace": self.namespace,
                "ray_token_secret": self.ray_token_secret,
                "runs_claim": self.runs_claim,
            }
        )

    def _cluster_access(
        self, args: TrainingClusterArgs, topology: Topology
    ) -> ClusterAccess | None:
        """How uerl reaches the cluster itself: the `kubeconfig`/`context` inputs, else
        (no Kubernetes provider given) the default provider's config; None when a provider
        was given without them, refused if the topology needs it."""
        kubeconfig, context = args.get("kubeconfig") or None, args.get("context") or None
        if isinstance(kubeconfig, str):
            check_kubeconfig(kubeconfig)
        if kubeconfig is not None or context is not None:
            return ClusterAccess(kubeconfig, context)
        if "kubernetes" not in self._providers:
            return ClusterAccess.from_config()
        needing = needs_cluster_access(topology)
        if needing:
            raise InputRefused.at(
                "kubeconfig",
                f"this TrainingCluster has a Kubernetes provider of its own, and "
                f"{' and '.join(needing)} make uerl reach the cluster itself; give the "
                "component that provider's kubeconfig too (`kubeconfig`, and `context` if "
                "the provider sets one), or it would act on whatever cluster $KUBECONFIG "
                "names",
            )
        return None

    @property
    def _children_access(self) -> ClusterAccess:
        # None only where nothing below reaches the cluster itself (_cluster_access refused
        # the rest): then what the children are given is never used.
        return self._access or ClusterAccess()

    def _child(self, **options: Any) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, aliases=WAS_TOP_LEVEL, **options)

    def _namespace_options(self, topology: Topology) -> pulumi.ResourceOptions:
        """The stack's own namespace outlives `pulumi destroy` when it holds a runs claim
        the destroy must leave (uerl's, kept by `runs.claim.keep_on_destroy`, or the
        user's own): deleting a namespace deletes every object in it, and on a `Delete`
        storage class every run on the claim. Then the next `pulumi up` takes it back, as
        it does the claim."""
        if topology.runs.store != "claim" or not topology.runs.claim.keep_on_destroy:
            return self._child()
        keep = stack_provider(
            "namespace-keep", self, self._children_access, WAS_TOP_LEVEL,
            upsert_existing_objects=True,
        )  # fmt: skip
        return self._child(retain_on_delete=True, provider=keep)

    def _make(self, topology: Topology, objects: manifests.Manifests) -> None:
        base: list[pulumi.Resource] = []
        if objects.namespace is not None:
            base.append(register(objects.namespace, self._namespace_options(topology)))
        # Pods may run as these: they exist before any pod does.
        accounts: list[pulumi.Resource] = []
        if objects.service_accounts:
            accounts += StackServiceAccounts(
                "service-accounts", objects.service_accounts, depends_on=base, opts=self._child()
            ).accounts

        operator_deps: list[pulumi.Resource] = []
        if objects.operator is not None:
            in_our_ns = objects.operator.namespace == topology.namespace
            operator = KubeRayOperator(
                "kuberay",
                objects.operator,
                (topology.namespace, topology.name),
                self._children_access,
                depends_on=base if in_our_ns else [],
                opts=self._child(),
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
                opts=self._child(),
            )
            game_deps += volume.ready

        # The policies exist before any pod they guard does.
        if objects.network_policies:
            fence = StackNetworkPolicies(
                "network-policies", objects.network_policies, depends_on=base, opts=self._child()
            )
            base = [*base, *fence.policies]
            game_deps += fence.policies

        # Sidecar games run inside the RayCluster's worker pods.
        pod_deps = game_deps if topology.pattern == "sidecar" else [*base, *accounts]
        cluster_deps = [*operator_deps, *pod_deps]
        # The head mounts the runs claim.
        if objects.runs_pvc is not None:
            keep = topology.runs.claim.keep_on_destroy
            runs = RunStorage(
                "runs", objects.runs_pvc, keep, self._children_access,
                depends_on=base, opts=self._child(),
            )  # fmt: skip
            cluster_deps.append(runs.pvc)
        UerlRayCluster(
            topology.name,
            objects.raycluster,
            objects.endpoints,
            depends_on=cluster_deps,
            opts=self._child(),
        )
        if objects.pod_monitor is not None:
            StackMetrics("metrics", objects.pod_monitor, depends_on=base, opts=self._child())
        if objects.ue_statefulset is not None and objects.ue_service is not None:
            UeGames(
                "ue-games",
                objects.ue_statefulset,
                objects.ue_service,
                depends_on=game_deps,
                opts=self._child(),
            )
