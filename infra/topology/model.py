"""`Topology`: a whole uerl deployment, its fields and the checks across them.

Each group of fields is a model of its own (ray_spec.py, simulator_spec.py, runs_spec.py,
cluster_spec.py); what a topology implies (names, pods, endpoints) is derived_names.py's.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from infra import k8s_rules
from infra.config_path import format_path
from infra.endpoints import Pattern
from infra.s3_rules import store_address
from infra.topology.cluster_spec import MetricsSpec, OperatorSpec, SecuritySpec
from infra.topology.derived_names import DerivedNames
from infra.topology.pods import ServiceAccountSpec
from infra.topology.ray_spec import LearnerSpec, RaySpec, WorkerSpec
from infra.topology.runs_spec import RunsSpec
from infra.topology.simulator_spec import ExecutablesSpec, SimulatorSpec
from infra.topology.validation_errors import FieldError, TopologyError, validation_problems
from infra.topology.value_types import ImagePullPolicy, NamespaceName, Spec, Text

# The topology's name names the RayCluster, its Services (`<name>-head-svc`, `<name>-ue`:
# a Service's name starts with a letter) and the pods KubeRay names after it (suffixes
# added): at most this long.
NAME_MAX = 40


class Topology(DerivedNames, Spec):
    """A whole uerl deployment."""

    name: Text = "uerl"
    """Prefix of every object; the RayCluster's name. A letter first (it names Services:
    `<name>-head-svc`), and short enough that KubeRay's derived names (pods with suffixes) stay
    valid."""
    namespace: NamespaceName = "uerl"
    """The namespace of every object (a DNS-1123 label)."""
    create_namespace: bool = True
    """Create the namespace; false: it must exist (e.g. a second stack in it)."""
    pattern: Pattern = "sidecar"
    """`sidecar`: each game runs in its worker pod; `networked`: one StatefulSet of games behind a
    headless Service."""
    image_pull_policy: ImagePullPolicy = "IfNotPresent"
    """Applied to every container uerl creates. IfNotPresent: images loaded into kind/k3d/minikube
    are used as loaded; a rebuilt image needs a new tag."""
    image_pull_timeout_s: int = Field(default=600, ge=0, le=7200)
    """Time allowed for pulling images on top of every start-up wait `pulumi up` makes (UE and Ray
    images are several GB)."""
    ray: RaySpec = RaySpec()
    learners: LearnerSpec = LearnerSpec()
    workers: WorkerSpec = WorkerSpec()
    simulator: SimulatorSpec = SimulatorSpec()
    executables: ExecutablesSpec = ExecutablesSpec()
    operator: OperatorSpec = OperatorSpec()
    security: SecuritySpec = SecuritySpec()
    runs: RunsSpec = RunsSpec()
    metrics: MetricsSpec = MetricsSpec()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return k8s_rules.dns1035_label(value, "topology", max_len=NAME_MAX)

    @model_validator(mode="after")
    def _two_custom_resources(self) -> Topology:
        if self.learners.custom_resource == self.workers.custom_resource:
            raise FieldError(
                ("learners", "custom_resource"),
                f"{self.learners.custom_resource!r} is also workers.custom_resource: "
                "learners and env runners need resources of their own, or a learner "
                "could take a worker node's place",
            )
        return self

    @model_validator(mode="after")
    def _tls_has_a_server(self) -> Topology:
        if self.simulator.tls is not None and self.game_tls_server is None:
            raise FieldError(
                ("simulator", "tls"),
                "a stock Schola build serves plaintext gRPC, so uerl's forwarder "
                "terminates TLS in front of it: that needs pattern 'networked' with "
                "simulator.listen 'loopback' (a sidecar game on loopback is reached only "
                "from inside its own pod; simulator.kind 'mock' serves TLS itself)",
            )
        return self

    @model_validator(mode="after")
    def _no_open_api_beyond_the_stack(self) -> Topology:
        if self.security.allowed_cidrs and self.ray.auth.mode == "disabled":
            raise FieldError(
                ("security", "allowed_cidrs"),
                "would let those addresses reach Ray's job API and GCS with no token "
                "(ray.auth.mode is 'disabled'): set ray.auth.mode 'token', or leave "
                "allowed_cidrs empty",
            )
        return self

    @model_validator(mode="after")
    def _pod_fields_have_a_pod(self) -> Topology:
        # A field that places no pod would be ignored without a word.
        games = self.simulator.pod_fields_set()
        if self.pattern == "sidecar" and games:
            raise FieldError(
                ("simulator", games[0]),
                "sidecar games run in the workers' pods, which the workers' fields place "
                "and name: pattern 'networked' gives games pods of their own",
            )
        loader = self.executables.loader.pod_fields_set()
        if not self.has_loader and loader:
            raise FieldError(
                ("executables", "loader", loader[0]),
                "no loader Job runs: it runs for executables.source_url with an unreal game",
            )
        return self

    @model_validator(mode="after")
    def _one_account_per_name(self) -> Topology:
        created: dict[str, tuple[tuple[str, ...], ServiceAccountSpec]] = {}
        for path, group in self.pod_groups().items():
            account = group.service_account
            if account is None or not account.create:
                continue
            first_path, first = created.setdefault(account.name, (path, account))
            if first.annotations != account.annotations:
                raise FieldError(
                    (*path, "service_account", "annotations"),
                    f"{account.name!r} is created for {format_path(first_path)} too, with "
                    "other annotations: give both the same",
                )
        return self

    @model_validator(mode="after")
    def _egress_reaches_the_run_store(self) -> Topology:
        # Else every `uerl train` stops at its storage check (exit 2).
        security, s3 = self.security, self.runs.s3
        if not (security.network_policies and security.restrict_egress) or s3 is None:
            return self
        if self.runs.store == "s3" and store_address(s3.endpoint) is None:
            where = s3.endpoint or f"none (AWS S3 in {s3.region})"
            raise FieldError(
                ("security", "restrict_egress"),
                f"admits the Ray head to no run store out of the cluster, and "
                f"runs.s3.endpoint is {where}: give the store as an IP address or an "
                "in-cluster Service (http://<service>.<namespace>.svc:<port>), or set "
                "restrict_egress false",
            )
        return self

    @model_validator(mode="after")
    def _scraper_reaches_the_metrics(self) -> Topology:
        metrics, fenced = self.metrics, self.security.network_policies
        if metrics.pod_monitor and fenced and metrics.scraper is None:
            raise FieldError(
                ("metrics", "scraper"),
                "is needed with metrics.pod_monitor: the stack's NetworkPolicies admit only "
                "its own pods, so name the Prometheus that scrapes them (namespace, and "
                "the labels of its pods), or its scrapes are refused",
            )
        if metrics.scraper is not None and not fenced:
            raise FieldError(
                ("metrics", "scraper"),
                "admits a scraper through the stack's NetworkPolicies, and "
                "security.network_policies is false: every pod may reach the metrics "
                "port already; remove metrics.scraper",
            )
        if self.pattern == "sidecar" and metrics.port == self.simulator.port:
            raise FieldError(
                ("metrics", "port"),
                f"{metrics.port} is a port of the sidecar games in the workers' pods: "
                "choose another",
            )
        return self

    @classmethod
    def parse(cls, data: Any, *, root: str = "topology") -> Topology:
        """Validate raw config; raise TopologyError naming each bad path."""
        if data is None:
            data = {}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise TopologyError(validation_problems(exc, root, cls)) from None
