"""The typed topology spec: the one source of truth for a uerl deployment.

It decides what Kubernetes runs (the Pulumi program) and what RLlib is told
(through the endpoints contract). Read from Pulumi config key `uerl:topology`;
every field has its default here, so a stack file holds only overrides. A value
Kubernetes would refuse (a name, a label, an image, a pod's placement) is refused here,
when the topology is read (infra/k8s_rules.py), so `uerl render`, `pulumi preview` and
the tests refuse alike. Imports only pydantic.
"""

from __future__ import annotations

import ipaddress
import math
import re
import string
import typing
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from infra import k8s_rules
from infra.config_path import format_path
from infra.endpoints import Endpoints, GameTLS, RayAddresses, Resources, RunStorage
from infra.k8s_rules import (
    DNS1123_SUBDOMAIN,
    QUALIFIED_NAME,
    Invalid,
    described,
    did_you_mean,
)

# The Ray version the training package is pinned to (pyproject: ray[default,rllib]==...).
# The default Ray image follows it so head, workers and driver agree.
RAY_VERSION = "2.60.0"
PYTHON_TAG = "py311"
KUBERAY_CHART_VERSION = "1.7.0"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"

# KubeRay's head Service ports (fixed by the operator).
GCS_PORT = 6379
CLIENT_PORT = 10001
DASHBOARD_PORT = 8265
# How long Ray gives a job after `ray job stop`'s SIGTERM before it SIGKILLs it (Ray's
# default is 3 s): `uerl train` finishes its iteration and writes a final checkpoint,
# which on a loaded cluster takes longer than that. Set on the Ray head.
JOB_STOP_GRACE_S = 120
JOB_STOP_GRACE_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
# The pods of `uerl submit --supervise` (`uerl supervise`, keeping a run going across a
# lost head) carry this app name and the stack's instance label; the stack's
# NetworkPolicies let them reach the head's job API, nothing else.
SUPERVISOR_APP = "uerl-supervisor"
# Ray's token authentication (Ray >= 2.52, KubeRay >= 1.5): the variable every Ray
# process and client reads the token from, and the Secret's key KubeRay reads it under.
RAY_AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
RAY_AUTH_TOKEN_KEY = "auth_token"
RAY_AUTH_MIN_VERSION = (2, 52, 0)

# Kubernetes resource.Quantity, e.g. 500m, 2, 1.5, 4Gi, 1e3.
QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# CPUs of one container, at most: no node offers more (the largest cloud machines have
# 448 to 896 vCPUs), so a larger figure is a typo (`1e9`) that would leave every pod
# pending for ever rather than a real request.
MAX_CPUS = 1024
# What a container's GPUs are called unless the topology says otherwise (NVIDIA's device plugin).
GPU_RESOURCE = "nvidia.com/gpu"
# /dev/shm of a Ray container, as a fraction of its memory unless sized: Ray's object
# store takes this share of the memory by default and lives in /dev/shm.
SHM_MEMORY_FRACTION = 0.3
# The labels uerl puts on every object and pod (infra/manifests/common.py): the games'
# Service and the NetworkPolicies select pods by them, so no group's `labels` may set one.
OWN_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)
# KubeRay labels the Ray pods `ray.io/...` and finds them by those labels; a pod
# template's own value replaces some of KubeRay's (and is ignored for others).
KUBERAY_LABEL_PREFIX = "ray.io/"
# The labels a networked game's topology spread constraint selects by, unless it says
# (infra/manifests/simulator.py: the stack's games).
GAME_SELECTOR_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/name")
# The topology's name names the RayCluster, its Services (`<name>-head-svc`, `<name>-ue`:
# a Service's name starts with a letter) and the pods KubeRay names after it (suffixes
# added): at most this long.
NAME_MAX = 40
# Binary and decimal suffixes of a Kubernetes quantity, as multipliers.
QUANTITY_SUFFIXES = {
    **{s: 1024 ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: 1000.0 ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{s: 1000.0 ** -(i + 1) for i, s in enumerate("mun")},
    "": 1,
}

Pattern = Literal["sidecar", "networked"]


ImagePullPolicy = Literal["IfNotPresent", "Always", "Never"]
# The forwarder (networked pattern, loopback games) runs this image's `python`.
FORWARDER_IMAGE = "python:3.11-slim"


def _config_text(value: Any) -> Any:
    """`pulumi config set --path` stores `true`/`false` as booleans and digits as
    integers; in a string field they are the text the user typed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return value


# Every string field of the spec: accepts what `pulumi config set --path` typed.
Text = Annotated[str, BeforeValidator(_config_text)]


class TopologyError(ValueError):
    """Invalid topology; the message names every config path at fault."""


class FieldError(Invalid):
    """A check across fields, reported at the field it is about (`path` below the model)."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 in a number field; `--set workers.replicas=true` (or
        # `replicas: yes` in YAML) is a mistake, not one replica.
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if annotation in (int, float) or set(typing.get_args(annotation)) & {int, float}:
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


def _quantity(value: str) -> str:
    match = QUANTITY.fullmatch(value)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 512Mi, 4Gi, 500m, 2)")
    if float(match.group(1)) == 0:  # every quantity here is a size a container needs
        raise ValueError(f"{value!r} is zero: give a size (e.g. 512Mi, 4Gi)")
    return value


Quantity = Annotated[str, BeforeValidator(_config_text), AfterValidator(_quantity)]


def _resource_name(value: str) -> str:
    if not RESOURCE_NAME.fullmatch(value) or value in ("CPU", "GPU", "memory"):
        raise ValueError(
            f"{value!r} is not a usable Ray custom resource name "
            "(letters, digits and '_', not starting with a digit, not CPU/GPU/memory)"
        )
    return value


ResourceName = Annotated[str, BeforeValidator(_config_text), AfterValidator(_resource_name)]


def quantity_value(value: str) -> float:
    """A valid quantity's amount in its unit: "4Gi" -> 4294967296.0, "1e3" -> 1000.0."""
    match = QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix = float(match.group(1)), match.group(3) or ""
    if suffix[:1] in ("e", "E") and suffix[1:2] not in ("", "i"):  # an exponent, not exa
        return number * 10.0 ** int(suffix[1:])
    return number * QUANTITY_SUFFIXES[suffix]


def _object_name(kind: str) -> Any:
    return Annotated[
        str,
        BeforeValidator(_config_text),
        AfterValidator(partial(k8s_rules.dns1123_subdomain, kind=kind)),
    ]


SecretName = _object_name("Secret")
AccountName = _object_name("ServiceAccount")
PriorityClassName = _object_name("PriorityClass")
ClaimName = _object_name("PersistentVolumeClaim")


def _storage_class(value: str) -> str:
    # "" is Kubernetes' "no class" (a claim bound to a volume made by hand).
    return value if value == "" else k8s_rules.dns1123_subdomain(value, "StorageClass")


StorageClassName = Annotated[str, BeforeValidator(_config_text), AfterValidator(_storage_class)]
# An image reference the kubelet can pull.
Image = Annotated[str, BeforeValidator(_config_text), AfterValidator(k8s_rules.image_reference)]


def _extended_resource(value: str) -> str:
    domain, _, name = value.partition("/")
    if (
        not name
        or len(domain) > 253
        or not DNS1123_SUBDOMAIN.fullmatch(domain)
        or domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or len(name) > 63
        or not QUALIFIED_NAME.fullmatch(name)
    ):
        raise ValueError(
            f"{value!r} is not an extended resource name (a domain outside kubernetes.io, "
            "'/' and a name, e.g. nvidia.com/gpu or amd.com/gpu)"
        )
    return value


GpuResource = Annotated[str, BeforeValidator(_config_text), AfterValidator(_extended_resource)]


def _metadata_keys(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        k8s_rules.located((key,), k8s_rules.label_key, key, "a label or annotation key")
    return value


def _labels(value: dict[str, str]) -> dict[str, str]:
    _metadata_keys(value)
    for key in value:
        if key in OWN_LABELS:
            raise FieldError(
                (key,),
                f"{key!r} is one of uerl's own labels (the games' Service and the "
                "NetworkPolicies find the pods by them): choose another key",
            )
        if key.startswith(KUBERAY_LABEL_PREFIX):
            raise FieldError(
                (key,),
                f"{key!r}: labels starting {KUBERAY_LABEL_PREFIX!r} are KubeRay's (it finds "
                "the Ray pods by them): choose another key",
            )
    k8s_rules.labels(value)
    return value


def _node_selector(value: dict[str, str]) -> dict[str, str]:
    k8s_rules.labels(value)  # node labels: label keys and values
    return value


Labels = Annotated[dict[Text, Text], AfterValidator(_labels)]
Annotations = Annotated[dict[Text, Text], AfterValidator(_metadata_keys)]
NodeSelector = Annotated[dict[Text, Text], AfterValidator(_node_selector)]
# A Kubernetes affinity, checked against the core API's schema and the API server's rules.
Affinity = Annotated[dict[str, Any], AfterValidator(k8s_rules.affinity)]
# A Kubernetes topology spread constraint (the list is checked as a whole: SimulatorSpec).
SpreadConstraint = dict[str, Any]


class Toleration(_Spec):
    """A Kubernetes toleration of the group's pods (the pod spec's own fields)."""

    # The taint key tolerated, a label key (none with `Exists`: every taint).
    key: Text | None = None
    # `Equal`: the taint's value must be `value`; `Exists`: any value.
    operator: Literal["Exists", "Equal"] = "Equal"
    # The taint value tolerated with `Equal`, a label value.
    value: Text | None = None
    # The taint effect tolerated (none: every effect).
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    # With `NoExecute`: how long a pod stays on a node after the taint appears.
    toleration_seconds: int | None = Field(default=None, ge=0)

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return value if not value else k8s_rules.label_key(value, "a taint key")

    @field_validator("value")
    @classmethod
    def _value(cls, value: str | None) -> str | None:
        return value if value is None else k8s_rules.label_value(value, "a taint value")

    @model_validator(mode="after")
    def _seconds_need_no_execute(self) -> Toleration:
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise FieldError(
                ("toleration_seconds",),
                "counts only for effect NoExecute (a taint that evicts pods): set effect "
                "NoExecute, or leave toleration_seconds out",
            )
        return self

    @model_validator(mode="after")
    def _operator_fits(self) -> Toleration:
        # The API server refuses these at `pulumi up`, after other objects were created.
        if self.operator == "Exists" and self.value:
            raise FieldError(
                ("value",),
                f"operator Exists tolerates every value of the taint: leave out value "
                f"{self.value!r}, or use operator Equal",
            )
        if self.operator == "Equal" and not self.key:
            raise FieldError(
                ("key",),
                "operator Equal needs the taint's key (operator Exists without a key "
                "tolerates every taint)",
            )
        return self

    def to_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {"operator": self.operator}
        for key, value in (
            ("key", self.key),
            ("value", self.value),
            ("effect", self.effect),
            ("tolerationSeconds", self.toleration_seconds),
        ):
            if value is not None:
                out[key] = value
        return out


class ServiceAccountSpec(_Spec):
    """The Kubernetes service account the group's pods run as, e.g. one bound to a cloud
    identity (GKE Workload Identity, EKS IAM roles for service accounts, Azure Workload
    Identity)."""

    # The account's name, in the stack's namespace.
    name: AccountName
    # Create the account with the stack (and delete it with it); false: it must exist.
    create: bool = False
    # Annotations of the account the stack creates, e.g.
    # `{eks.amazonaws.com/role-arn: arn:aws:iam::123456789012:role/uerl}`.
    annotations: Annotations = {}
    # Mount the account's Kubernetes API token in the pods. Off: nothing uerl runs calls
    # the Kubernetes API, and cloud workload identity does without it.
    automount_token: bool = False

    @model_validator(mode="after")
    def _annotations_need_create(self) -> ServiceAccountSpec:
        if self.annotations and not self.create:
            raise FieldError(
                ("annotations",),
                f"the stack annotates only an account it creates: set create true, or "
                f"annotate {self.name!r} where it is made",
            )
        return self


class PodSpec(_Spec):
    """Where a group's pods run and as whom: every pod uerl makes has these fields."""

    # Node labels the group's pods must be scheduled on.
    node_selector: NodeSelector = {}
    # Taints the group's pods tolerate.
    tolerations: list[Toleration] = []
    # The pods' Kubernetes affinity (`nodeAffinity`, `podAffinity`, `podAntiAffinity`), in
    # Kubernetes' field names, checked as the API server would.
    affinity: Affinity | None = None
    # The PriorityClass of the group's pods (it must exist). None: the cluster's default.
    priority_class_name: PriorityClassName | None = None
    # Extra labels of the group's pods (not uerl's `app.kubernetes.io/` ones, nor KubeRay's
    # `ray.io/` ones).
    labels: Labels = {}
    # Extra annotations of the group's pods.
    annotations: Annotations = {}
    # Secrets (kubernetes.io/dockerconfigjson, in the stack's namespace) the kubelet pulls
    # every image of the group's pods with.
    image_pull_secrets: list[SecretName] = []
    # The account the group's pods run as. None: the namespace's `default`, its API token
    # mounted as the cluster does by default.
    service_account: ServiceAccountSpec | None = None

    @classmethod
    def pod_field_names(cls) -> tuple[str, ...]:
        """The fields of the group's pod (not of a container in it)."""
        return tuple(PodSpec.model_fields)

    def pod_fields_set(self) -> list[str]:
        """The pod fields given a value other than their default."""
        fields = type(self).model_fields
        return [n for n in self.pod_field_names() if getattr(self, n) != fields[n].get_default()]


class SizedSpec(_Spec):
    """The size of the container a group runs."""

    # CPUs of the container (fractions become millicores).
    cpus: float = Field(default=1, gt=0, le=MAX_CPUS)
    # Memory of the container, a Kubernetes quantity (requests = limits).
    memory: Quantity = "2Gi"
    # CPU limits equal to `cpus` (Guaranteed QoS: the container gets what it asked for and
    # no more); false: CPU requests only, so it may use idle CPUs of its node.
    cpu_limits: bool = True
    # Node disk requested for what the container writes (its root filesystem, /tmp), a
    # Kubernetes quantity; a request for the scheduler, not a limit. None: no request.
    ephemeral_storage: Quantity | None = None


class _RaySizedSpec(SizedSpec):
    # Node disk requested for the Ray container's writes: Ray's session logs and spilled
    # objects in /tmp, runs started under $HOME (a request, not a limit). None: no request.
    ephemeral_storage: Quantity | None = "1Gi"
    # Size of the Ray container's /dev/shm (memory-backed: Ray's object store lives there,
    # and it counts against `memory`). None: 30% of `memory`, the object store's default.
    shm_size: Quantity | None = None

    @model_validator(mode="after")
    def _shm_fits(self) -> _RaySizedSpec:
        if self.shm_size is not None and quantity_value(self.shm_size) >= quantity_value(
            self.memory
        ):
            raise FieldError(
                ("shm_size",),
                f"{self.shm_size} is not below memory {self.memory}: /dev/shm is memory "
                "the container's limit counts, Ray needs the rest",
            )
        return self

    @property
    def shm_ref(self) -> str:
        """`shm_size`, or SHM_MEMORY_FRACTION of `memory` in whole MiB."""
        if self.shm_size is not None:
            return self.shm_size
        amount = quantity_value(self.memory) * SHM_MEMORY_FRACTION
        mebibytes = math.floor(amount / 2**20)
        return f"{mebibytes}Mi" if mebibytes else str(math.floor(amount))


class RayGroupSpec(PodSpec, _RaySizedSpec):
    """A group of Ray pods: its container's size, where its pods run and as whom."""


class HeadSpec(RayGroupSpec):
    """The Ray head pod. It schedules no work (num-cpus 0): these are its container's size."""

    # CPUs of the head container.
    cpus: float = Field(default=1, gt=0, le=MAX_CPUS)
    # Memory of the head container, a Kubernetes quantity.
    memory: Quantity = "4Gi"


class RayAuthSpec(_Spec):
    """Who may call Ray's dashboard, job API and GCS (KubeRay's `authOptions`)."""

    # `token`: every call needs the token (Ray's token authentication, Ray >= 2.52,
    # KubeRay >= 1.5); `disabled`: open to whoever reaches the head's ports (the
    # NetworkPolicies narrow who; `security.allowed_cidrs` then must stay empty).
    mode: Literal["token", "disabled"] = "token"
    # A Secret of yours holding the token under the key `auth_token`. None: KubeRay
    # makes one named as the RayCluster (32 random bytes, deleted with the cluster).
    secret_name: SecretName | None = None

    @model_validator(mode="after")
    def _secret_needs_token(self) -> RayAuthSpec:
        if self.mode == "disabled" and self.secret_name is not None:
            raise FieldError(("secret_name",), "ray.auth.mode is 'disabled': no token is asked for")
        return self


class RaySpec(_Spec):
    """The Ray cluster (KubeRay RayCluster): its version, image, head and who may call it."""

    # Ray version of the cluster; must equal the training package's pin.
    version: Text = Field(default=RAY_VERSION, pattern=r"^\d+\.\d+\.\d+$")
    # Ray image for head and workers, and learners unless `learners.image` (it needs uerl
    # installed). None: `uerl/ray:<version>-py311-cpu` (docker/ray.Dockerfile).
    image: Image | None = None
    head: HeadSpec = HeadSpec()
    auth: RayAuthSpec = RayAuthSpec()
    # How long `pulumi up` gives KubeRay to create the Ray pods and `ray start`
    # to join, after the images are pulled (and sidecar games answer); `uerl local`, its
    # Ray nodes to start and register (a busy host's may miss Ray's own 30 s, and are
    # started again within this).
    start_timeout_s: int = Field(default=300, ge=10, le=7200)

    @model_validator(mode="after")
    def _token_needs_a_recent_ray(self) -> RaySpec:
        found = tuple(int(part) for part in self.version.split("."))
        if self.auth.mode == "token" and found < RAY_AUTH_MIN_VERSION:
            least = ".".join(map(str, RAY_AUTH_MIN_VERSION))
            raise FieldError(
                ("auth", "mode"),
                f"token authentication needs Ray >= {least} (ray.version is "
                f"{self.version}): set ray.auth.mode 'disabled', or a newer ray.version",
            )
        return self

    def built_image(self, flavor: Literal["cpu", "cuda"]) -> str:
        """The tag `make images` gives uerl's Ray image (docker/ray.Dockerfile: Ray at this
        version plus uerl and its training dependencies; env runners import uerl): `cpu`,
        torch without its CUDA libraries (head, workers, CPU learners); `cuda`, PyPI's
        torch with them (GPU learners: `learners.image`)."""
        return f"uerl/ray:{self.version}-{PYTHON_TAG}-{flavor}"

    @property
    def image_ref(self) -> str:
        return self.image or self.built_image("cpu")


class _NodeGroupSpec(RayGroupSpec):
    # CPUs of each node's Ray container (fractions become millicores).
    cpus: float = Field(default=1, gt=0, le=MAX_CPUS)
    # Memory of each node's Ray container, a Kubernetes quantity.
    memory: Quantity = "2Gi"


class LearnerSpec(_NodeGroupSpec):
    """X learner nodes. replicas 0 trains on the driver."""

    # The Ray resource each learner node advertises (one unit); every learner needs
    # one, so learners run only on learner nodes (never on a worker node, whose pod a
    # shrink may delete, or beside a game).
    custom_resource: ResourceName = "uerl_learner"

    # X: how many learner nodes (one RLlib learner each); 0 learns on the driver.
    replicas: int = Field(default=1, ge=0, le=256)
    # CPUs of each learner's Ray container.
    cpus: float = Field(default=2, gt=0, le=MAX_CPUS)
    # Memory of each learner's Ray container, a Kubernetes quantity.
    memory: Quantity = "4Gi"
    # GPUs per learner, asked for as `gpu_resource`.
    gpus: int = Field(default=0, ge=0, le=16)
    # The extended resource the learners' GPUs are, e.g. `amd.com/gpu`.
    gpu_resource: GpuResource = GPU_RESOURCE
    # The learners' image, e.g. the CUDA build of the Ray image (`make images` tags it
    # `uerl/ray:<version>-py311-cuda`: the same Ray, Python and uerl). None: the Ray
    # image (`ray.image`).
    image: Image | None = None


class WorkerSpec(_NodeGroupSpec):
    """Y env-runner nodes, one UE instance each, each advertising `custom_resource`.

    replicas 0 leaves no game: a training that is running pauses until games return."""

    # Y: how many env-runner nodes, one game and one env runner each.
    replicas: int = Field(default=2, ge=0, le=1000)
    # The Ray resource each worker advertises (one unit); every env runner needs one.
    custom_resource: ResourceName = "ue_worker"


class GameTLSSpec(_Spec):
    """TLS for the games' gRPC. The Secret (in the stack's namespace, made by you or
    cert-manager, or by `uerl tls-secret`) holds `ca.crt`, `tls.crt` and `tls.key`;
    the certificate names the hosts env runners dial (`uerl tls-secret` says which)."""

    # The Secret's name (it holds ca.crt, tls.crt, tls.key).
    secret: SecretName
    # Games accept only clients presenting a certificate the Secret's CA signed; env
    # runners present the Secret's own certificate (it must allow client auth).
    mutual: bool = False


SIMULATOR_DEFAULTS: dict[str, dict[str, Any]] = {
    # A packaged Linux UE build runs from the shared volume; `{executable}` is
    # the game's launcher inside it. Schola reads its port from -ScholaPort; the
    # address it binds comes from the build's project settings (`simulator.listen`).
    "unreal": {
        "image": "ubuntu:22.04",
        "command": ["{executable}"],
        "args": ["-ScholaPort={port}", "-nullrhi", "-unattended", "-nosplash", "-nosound"],
    },
    # The mock game (uerl mock-ue), for tests and dev clusters. It binds where
    # `simulator.listen` says a build binds, so dev clusters exercise that path.
    "mock": {
        "image": "uerl/mock-ue:0.1.0",
        "command": ["uerl", "mock-ue"],
        "args": ["--host", "{host}", "--port", "{port}"],
    },
}
PLACEHOLDERS = frozenset({"port", "executable", "host"})
LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"


class SimulatorSpec(PodSpec, SizedSpec):
    """The game: one instance per env runner (plus an optional discovery instance). Its
    pod fields (`node_selector` ... `service_account`, `topology_spread_constraints`) are
    the networked games' pods'; a sidecar game runs in the workers' pod."""

    # `unreal`: a packaged build on the shared volume; `mock`: `uerl mock-ue`, no volume.
    kind: Literal["unreal", "mock"] = "unreal"
    # The game container's image. None: `ubuntu:22.04` (unreal), `uerl/mock-ue:0.1.0` (mock).
    image: Image | None = None
    # Path of the game launcher relative to `executables.mount_path`.
    executable: Text = "Game.sh"
    # The game's command and arguments; placeholders `{port}` (where it listens),
    # `{host}` (127.0.0.1 or 0.0.0.0) and `{executable}`. None: the kind's default,
    # unreal `["{executable}"]` with `["-ScholaPort={port}", "-nullrhi", "-unattended",
    # "-nosplash", "-nosound"]`.
    command: list[Text] | None = None
    # The game's arguments, with the same placeholders (see `command`).
    args: list[Text] | None = None
    # The port env runners connect to (the endpoints' `port`).
    port: int = Field(default=50051, ge=1, le=65535)
    # Where the build's gRPC server binds. `loopback`: Schola's default
    # (RPCServerSettings.Address 127.0.0.1; -ScholaPort changes only the port).
    # `all_interfaces`: a build packaged to bind 0.0.0.0.
    listen: Literal["loopback", "all_interfaces"] = "loopback"
    # Networked pattern with a loopback game: the game listens on 127.0.0.1 on
    # this port and a forwarder in its pod serves `port` on the pod IP.
    # None: `port` + 1 (`port` - 1 for 65535).
    internal_port: int | None = Field(default=None, ge=1, le=65535)
    # The image running that forwarder (its `python`, standard library only).
    forwarder_image: Image = FORWARDER_IMAGE
    # CPUs of the game container.
    cpus: float = Field(default=2, gt=0, le=MAX_CPUS)
    # Memory of the game container, a Kubernetes quantity.
    memory: Quantity = "4Gi"
    # GPUs of the game container, asked for as `gpu_resource`.
    gpus: int = Field(default=0, ge=0, le=16)
    # The extended resource the game's GPUs are, e.g. `amd.com/gpu`.
    gpu_resource: GpuResource = GPU_RESOURCE
    # How the networked games spread over nodes or zones: Kubernetes topology spread
    # constraints, passed through; one without `labelSelector` selects the stack's games.
    topology_spread_constraints: list[SpreadConstraint] = []
    # Extra environment of the game (an unreal game also gets HOME=/tmp).
    env: dict[Text, Text] = {}
    # Time the game has to open its port before it is restarted (startup probe).
    startup_timeout_s: float = Field(default=120, gt=0, le=3600)
    # How the kubelet checks the game: `tcp`, its port takes connections; `grpc`, its
    # gRPC server answers (`schola-probe` in the game's container: the image
    # docker/unreal-game.Dockerfile builds has it). Unreal games only.
    probe: Literal["tcp", "grpc"] = "tcp"
    # TLS to the games (off by default): served by the forwarder where there is one,
    # else by the game itself (the mock game can; a stock Schola build cannot).
    tls: GameTLSSpec | None = None
    # `dedicated`: a separate instance (ordinal 0) answers discovery (networked);
    # `worker1`: discovery reuses instance 1 (a game serves one client at a time,
    # and discovery closes its session before training starts).
    discovery: Literal["dedicated", "worker1"] = "dedicated"

    @classmethod
    def pod_field_names(cls) -> tuple[str, ...]:
        return (*super().pod_field_names(), "topology_spread_constraints")

    @field_validator("topology_spread_constraints")
    @classmethod
    def _spread(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # One without a labelSelector is given the stack's games' (manifests/simulator.py).
        return k8s_rules.spread_constraints(value, set(GAME_SELECTOR_LABELS))

    @field_validator("command", "args")
    @classmethod
    def _placeholders(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            try:
                names = {f[1] for f in string.Formatter().parse(item) if f[1] is not None}
            except ValueError as exc:
                raise ValueError(f"{item!r} is not a valid template: {exc}") from None
            unknown = names - PLACEHOLDERS
            if unknown:
                raise ValueError(
                    f"{item!r} uses unknown placeholder(s) {sorted(unknown)}; "
                    f"allowed: {sorted(PLACEHOLDERS)} (write '{{{{' for a literal brace)"
                )
        return value

    @model_validator(mode="after")
    def _grpc_probe_needs_the_game_image(self) -> SimulatorSpec:
        if self.probe == "grpc" and self.kind != "unreal":
            raise FieldError(
                ("probe",),
                "the grpc probe runs schola-probe in the game's image "
                "(docker/unreal-game.Dockerfile), which the mock game's has not: use tcp",
            )
        return self

    @model_validator(mode="after")
    def _internal_port_differs(self) -> SimulatorSpec:
        if self.internal_port == self.port:
            raise ValueError(
                f"internal_port {self.internal_port} equals port: the forwarder serves "
                "`port`, the game must listen on another one"
            )
        return self

    @property
    def image_ref(self) -> str:
        return self.image or SIMULATOR_DEFAULTS[self.kind]["image"]

    @property
    def loopback(self) -> bool:
        return self.listen == "loopback"

    @property
    def host(self) -> str:
        return LOOPBACK if self.loopback else ALL_INTERFACES

    @property
    def forwarded_port(self) -> int:
        """The game's own port behind a forwarder."""
        if self.internal_port is not None:
            return self.internal_port
        return self.port + 1 if self.port < 65535 else self.port - 1

    def render_command(
        self, mount_path: str, *, port: int | None = None
    ) -> tuple[list[str], list[str]]:
        """(command, args) with `{port}` (the game's listening port, default `port`),
        `{host}` and `{executable}` substituted."""
        values = {
            "port": self.port if port is None else port,
            "host": self.host,
            "executable": f"{mount_path.rstrip('/')}/{self.executable}",
        }
        defaults = SIMULATOR_DEFAULTS[self.kind]
        command = self.command if self.command is not None else defaults["command"]
        args = self.args if self.args is not None else defaults["args"]
        return (
            [part.format(**values) for part in command],
            [part.format(**values) for part in args],
        )


class LoaderSpec(PodSpec):
    """The loader Job's pod (with `source_url`): where it runs and as whom."""


class ExecutablesSpec(_Spec):
    """The shared volume holding the packaged game, mounted read-only into every UE container."""

    # Use this PersistentVolumeClaim instead of creating one.
    existing_claim: ClaimName | None = None
    # Size of the claim uerl creates, a Kubernetes quantity.
    size: Quantity = "20Gi"
    # Storage class of that claim (it must provide the access mode). None: the
    # cluster's default; "": no class (a volume made for it).
    storage_class: StorageClassName | None = None
    # Every game pod mounts the volume at once, so one claim serves many nodes.
    access_mode: Literal["ReadWriteMany", "ReadOnlyMany"] = "ReadWriteMany"
    # Where every UE container mounts the volume (read-only), absolute.
    mount_path: Text = Field(default="/opt/ue", pattern=r"^/\S*$")
    # The build is in `simulator.image`, at `mount_path` (docker/unreal-game.Dockerfile
    # puts it there): no volume, no loader Job; the fields above and below are unused.
    in_image: bool = False
    # A build archive (.zip / .tar.gz) unpacked into the volume by a one-off Job.
    source_url: Text | None = Field(default=None, pattern=r"^(https?|s3|gs)://\S+$")
    # Image of that Job and of the init containers waiting for it (needs sh,
    # wget, tar, unzip: alpine has them; s3:// needs `aws`, gs:// `gsutil`).
    loader_image: Image = "alpine:3.20"
    # How long `pulumi up` waits for the loader Job. A claim the storage cannot
    # provide (no ReadWriteMany) keeps the Job pending for all of it.
    loader_timeout_s: int = Field(default=3600, ge=60, le=86400)
    loader: LoaderSpec = LoaderSpec()

    @model_validator(mode="after")
    def _a_build_in_the_image_needs_no_volume(self) -> ExecutablesSpec:
        volume = [name for name in ("existing_claim", "source_url") if getattr(self, name)]
        if self.in_image and volume:
            raise FieldError(
                (volume[0],),
                "executables.in_image is true: the build is in the game's image, so no "
                "volume is mounted and nothing is loaded into one",
            )
        return self


# An S3 bucket name: AWS's rules (MinIO refuses the same names).
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
BUCKET_RESERVED = (("xn--", "sthree-", "amzn-s3-demo-"), ("-s3alias", "--ol-s3", ".mrap", "--x-s3"))
# An S3 region: the AWS SDK puts it in host names and request signatures.
REGION = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# A host name of an S3 endpoint (RFC 1123 labels).
HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# Where the Ray head mounts the runs claim (`runs.store: claim`).
RUNS_MOUNT_PATH = "/uerl/runs"
# The keys of `runs.s3.credentials_secret`, passed to the head as the environment
# variables of the same names (what every S3 client reads).
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def _bucket_reason(value: str) -> str | None:
    if not 3 <= len(value) <= 63:
        return f"it is {len(value)} characters long"
    if any("A" <= c <= "Z" for c in value):
        return "it has upper-case letters"
    bad = sorted({c for c in value if not (c.isascii() and (c.isalnum() or c in ".-"))})
    if bad:
        return "it contains " + ", ".join(repr(c) for c in bad)
    if not BUCKET.fullmatch(value):
        return f"it starts or ends with {value[0] if value[0] in '.-' else value[-1]!r}"
    for pair in ("..", ".-", "-."):
        if pair in value:
            return f"it contains {pair!r}"
    if re.fullmatch(r"[0-9]+(\.[0-9]+){3}", value):
        return "it is formatted as an IP address"
    prefixes, suffixes = BUCKET_RESERVED
    if value.startswith(prefixes) or value.endswith(suffixes):
        return (
            "AWS reserves names starting "
            + ", ".join(map(repr, prefixes))
            + (" or ending " + ", ".join(map(repr, suffixes)))
        )
    return None


def _bucket(value: str) -> str:
    reason = _bucket_reason(value)
    if reason is not None:
        raise ValueError(
            f"{value!r} is not an S3 bucket name: {reason} (3 to 63 lower-case letters, "
            "digits, '.' and '-', starting and ending with a letter or digit, no '..', not "
            "an IP address)"
        )
    return value


def _prefix(value: str) -> str:
    if value.startswith("/") or value.endswith("/") or "//" in value:
        raise ValueError(f"{value!r}: a key prefix has no leading, trailing or double '/'")
    dots = [part for part in value.split("/") if part in (".", "..")]
    if dots:
        raise ValueError(
            f"{value!r}: a key prefix has no {dots[0]!r} part (a path reading it would leave "
            "the prefix)"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{value!r}: a key prefix has no control characters")
    return value


def _region(value: str) -> str:
    if not REGION.fullmatch(value):
        reason = k8s_rules.why_not_host_label(value)
        raise ValueError(
            f"{value!r} is not an S3 region: {reason} (at most 63 letters, digits and '-', "
            "starting and ending with a letter or digit, e.g. us-east-1)"
        )
    return value


def _endpoint_reason(value: str) -> str | None:
    if any(c.isspace() for c in value):
        return "it contains whitespace"
    try:
        url = urlsplit(value)
    except ValueError as exc:  # an unclosed '[' of an IPv6 address
        return str(exc)
    if url.scheme not in ("http", "https") or not value.startswith(f"{url.scheme}://"):
        return "it does not start with http:// or https://"
    if url.path not in ("", "/") or "?" in value or "#" in value:
        return "it has more than a host and a port"
    if "@" in url.netloc:
        return "it holds credentials: give them in runs.s3.credentials_secret"
    host_port = url.netloc
    if host_port.endswith(":"):
        return "its port is empty"
    try:
        port = url.port
    except ValueError:
        return f"port {host_port.rpartition(':')[2]!r} is not a port number (1 to 65535)"
    if port == 0:
        return "port 0 is not a port a store listens on (1 to 65535)"
    host = url.hostname or ""
    if not host:
        return "it has no host"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        if host_port.startswith("["):
            return f"[{host}] is not an IPv6 address"
    labels = host.removesuffix(".").split(".")
    bad = [label for label in labels if not HOST_LABEL.fullmatch(label)]
    if bad or len(host) > 253:
        return f"host {host!r} is not a host name (letters, digits and '-', in '.'-separated parts)"
    return None


def _http_url(value: str) -> str:
    reason = _endpoint_reason(value)
    if reason is not None:
        raise ValueError(
            f"{value!r} is not an S3 endpoint URL: {reason} (http:// or https://, a host and "
            "an optional port, no path, e.g. https://s3.example.com:9000)"
        )
    return value.rstrip("/")


BucketName = Annotated[str, BeforeValidator(_config_text), AfterValidator(_bucket)]
KeyPrefix = Annotated[str, BeforeValidator(_config_text), AfterValidator(_prefix)]
EndpointUrl = Annotated[str, BeforeValidator(_config_text), AfterValidator(_http_url)]
RegionName = Annotated[str, BeforeValidator(_config_text), AfterValidator(_region)]


class RunsClaimSpec(_Spec):
    """The PersistentVolumeClaim runs are stored on (`runs.store: claim`)."""

    # Use this PersistentVolumeClaim instead of creating one.
    existing_claim: ClaimName | None = None
    # Size of the claim uerl creates, a Kubernetes quantity.
    size: Quantity = "20Gi"
    # Storage class of that claim. None: the cluster's default; "": no class (a volume
    # made for it).
    storage_class: StorageClassName | None = None
    # Only the Ray head mounts it (the driver runs there).
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    # `pulumi destroy` leaves the claim uerl created, runs and all (the next `pulumi up`
    # takes it back); false: destroy deletes it with every run on it.
    keep_on_destroy: bool = True

    @model_validator(mode="after")
    def _keeps_only_its_own(self) -> RunsClaimSpec:
        # uerl never deletes a claim it did not create: the field would do nothing.
        if self.existing_claim is not None and "keep_on_destroy" in self.model_fields_set:
            raise FieldError(
                ("keep_on_destroy",),
                "runs.claim.existing_claim is set: uerl creates no claim, and never deletes it",
            )
        return self


class RunsS3Spec(_Spec):
    """An S3-compatible bucket runs are stored in (`runs.store: s3`)."""

    # The bucket; it must exist (a training refuses to start otherwise).
    bucket: BucketName
    # Key prefix of every run: `s3://<bucket>/<prefix>/<run>/...`.
    prefix: KeyPrefix = "uerl-runs"
    # The store's URL. None: AWS S3 in `region`.
    endpoint: EndpointUrl | None = None
    # The bucket's region (S3-compatible stores mostly ignore it).
    region: RegionName = "us-east-1"
    # A Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, given to the head as
    # those variables. None: the head's service account identity (IRSA, workload
    # identity) or the node's grants access.
    credentials_secret: SecretName | None = None


# An in-cluster Service's DNS name: `<service>.<namespace>.svc[.<cluster domain>]`.
_SERVICE_HOST = re.compile(r"^[a-z0-9-]+\.([a-z0-9-]+)\.svc(\.[a-z0-9.-]+)?$")


@dataclass(frozen=True)
class StoreAddress:
    """Where the head's traffic to the run store goes, as a NetworkPolicy can admit it:
    an address and port, or an in-cluster Service's namespace (any port: a Service's
    port is translated to its pods', which the endpoint does not say)."""

    ip: str | None = None
    port: int | None = None
    namespace: str | None = None


def store_address(endpoint: str | None) -> StoreAddress | None:
    """The run store's address at `endpoint`; None: a host name out of the cluster (or
    AWS S3), which no NetworkPolicy can name."""
    if endpoint is None:
        return None
    url = urlsplit(endpoint)
    host = url.hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        service = _SERVICE_HOST.fullmatch(host)
        return StoreAddress(namespace=service.group(1)) if service else None
    return StoreAddress(ip=str(ip), port=url.port or (443 if url.scheme == "https" else 80))


class RunsSpec(_Spec):
    """Where a training's artefacts go (checkpoints, metrics, curves, events, logs, ONNX):
    durable storage outside the Ray head, so a run outlives its pods."""

    # `claim`: a PersistentVolumeClaim mounted on the head; `s3`: an S3-compatible bucket.
    store: Literal["claim", "s3"] = "claim"
    claim: RunsClaimSpec = RunsClaimSpec()
    s3: RunsS3Spec | None = None
    # Checkpoints a run keeps: the newest this many, and also the one `latest` names and
    # the best (highest episode return mean); older ones are deleted from the claim, the
    # bucket and the head's staging as the run goes on. None: every one is kept.
    keep_checkpoints: int | None = Field(default=5, ge=1)
    # Size limit of the Ray head's /tmp (an emptyDir: Ray's session files, and a run
    # bound for a bucket is written there first), a Kubernetes quantity. Past it the
    # kubelet evicts the head (a supervised run resumes on the next).
    staging_size: Quantity = "10Gi"

    @model_validator(mode="after")
    def _store_is_described(self) -> RunsSpec:
        if self.store == "s3" and self.s3 is None:
            raise FieldError(("s3",), "runs.store is 's3': give at least s3.bucket")
        if self.store == "claim" and self.s3 is not None:
            raise FieldError(
                ("store",), "runs.s3 is set but runs.store is 'claim': set store to 's3'"
            )
        return self

    @property
    def uri(self) -> str:
        """Where runs go, as the head sees it."""
        if self.store == "s3":
            assert self.s3 is not None  # checked above
            return f"s3://{self.s3.bucket}/{self.s3.prefix}"
        return f"file://{RUNS_MOUNT_PATH}"


class OperatorSpec(_Spec):
    """The KubeRay operator (Helm chart `kuberay-operator`)."""

    # Install the chart; false on clusters that already run KubeRay.
    install: bool = True
    # The chart version, pinned.
    chart_version: Text = KUBERAY_CHART_VERSION
    # The Helm repository the chart comes from.
    repository: Text = KUBERAY_REPOSITORY
    # A local chart directory or .tgz, for air-gapped clusters (wins over
    # repository). Relative paths are relative to the project root (Pulumi.yaml).
    chart_path: Text | None = None
    # Helm values for the chart, e.g. {image: {repository: mirror/kuberay/operator}}.
    values: dict[str, Any] = {}
    # The chart's CRDs, one resource of the stack's. `install`: created before the chart
    # (refused, naming this field, if a former KubeRay left them: Helm never deletes
    # CRDs), deleted by `pulumi destroy` unless other stacks' RayClusters or RayJobs use
    # them; `adopt`: take over existing ones and update them to the chart's, left in place
    # by `pulumi destroy`; `skip`: leave them as they are.
    crds: Literal["install", "adopt", "skip"] = "install"
    # None: the topology's namespace.
    namespace: Text | None = None

    @field_validator("namespace")
    @classmethod
    def _ns(cls, value: str | None) -> str | None:
        return None if value is None else k8s_rules.dns1123_label(value, "namespace")


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a CIDR block (e.g. 10.0.0.0/8): {exc}") from None


Cidr = Annotated[str, BeforeValidator(_config_text), AfterValidator(_cidr)]


class SecuritySpec(_Spec):
    """Who may reach what, and how the pods run. Everything is on by default."""

    # Per-stack NetworkPolicies: games only from the stack's Ray pods, the Ray pods
    # only from each other (plus `allowed_cidrs` on the head's ports). Off only for a
    # CNI without NetworkPolicy support, where they would silently do nothing.
    network_policies: bool = True
    # Who else may reach the head's GCS, client and dashboard ports (job submission
    # from outside the cluster), e.g. ["10.20.0.0/16"]. Empty: nobody.
    allowed_cidrs: list[Cidr] = []
    # Egress only to the stack's own pods and DNS (the game or Ray then cannot
    # download anything at run time), and the head's to the run store: with `runs.store:
    # s3`, `runs.s3.endpoint` must then be an IP address or an in-cluster Service.
    restrict_egress: bool = False
    # The Pod Security Standard a namespace uerl creates enforces; every pod uerl
    # creates passes `restricted`.
    pod_security: Literal["restricted", "baseline", "privileged"] = "restricted"


# Ray's metrics export port on every Ray node (KubeRay's default, kept): each node's
# metrics agent serves Ray's and uerl's metrics there, in Prometheus' text format.
METRICS_PORT = 8080
# Prometheus' duration syntax as the PodMonitor's `interval` takes it: 30s, 1m, 1m30s.
DURATION = re.compile(r"^(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?$")


def _duration(value: str) -> str:
    match = DURATION.fullmatch(value)
    if not value or match is None:
        raise ValueError(f"{described(value)} is not a duration such as 30s, 1m or 1m30s")
    if not any(match.group(g) and int(match.group(g)) for g in (2, 4, 6)):
        raise ValueError(f"{described(value)}: a scrape interval must be longer than 0s")
    return value


Duration = Annotated[str, BeforeValidator(_config_text), AfterValidator(_duration)]


def _selector_labels(value: dict[str, str]) -> dict[str, str]:
    k8s_rules.labels(value)
    return value


SelectorLabels = Annotated[dict[Text, Text], AfterValidator(_selector_labels)]


class MetricsScraperSpec(_Spec):
    """The Prometheus that scrapes the stack's Ray pods: the stack's NetworkPolicies let
    its pods, and no others, reach the metrics port."""

    # The namespace its pods run in, e.g. monitoring.
    namespace: Text
    # Labels its pods carry, e.g. {app.kubernetes.io/name: prometheus}. Empty: every pod
    # of the namespace.
    labels: SelectorLabels = {}

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return k8s_rules.dns1123_label(value, "namespace")


class MetricsSpec(_Spec):
    """Ray's and uerl's metrics (docs/kubernetes.md, "Watching a training"): every Ray
    pod's metrics agent serves them on `port`."""

    # The port every Ray pod serves metrics on (Ray's --metrics-export-port), named
    # `metrics` in the pods.
    port: int = Field(default=METRICS_PORT, ge=1, le=65535)
    # Make a PodMonitor (the Prometheus Operator's CRD, which the cluster must have) that
    # selects the stack's Ray pods' metrics port.
    pod_monitor: bool = False
    # How often Prometheus scrapes the pods (the PodMonitor's interval).
    interval: Duration = "30s"
    # Labels of the PodMonitor itself, for a Prometheus that picks PodMonitors by label
    # (kube-prometheus-stack's: {release: <its Helm release>}).
    pod_monitor_labels: Labels = {}
    # Who scrapes: with `security.network_policies`, only the Ray pods of the stack may
    # reach each other, so a PodMonitor needs its Prometheus named here.
    scraper: MetricsScraperSpec | None = None

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        taken = {
            GCS_PORT: "Ray's GCS",
            CLIENT_PORT: "Ray's client",
            DASHBOARD_PORT: "Ray's dashboard",
        }
        if value in taken:
            raise ValueError(f"{value} is {taken[value]} port on the head: choose another")
        return value


class Topology(_Spec):
    """A whole uerl deployment."""

    # Prefix of every object; the RayCluster's name. A letter first (it names Services:
    # `<name>-head-svc`), and short enough that KubeRay's derived names (pods with
    # suffixes) stay valid.
    name: Text = "uerl"
    # The namespace of every object (a DNS-1123 label).
    namespace: Text = "uerl"
    # Create the namespace; false: it must exist (e.g. a second stack in it).
    create_namespace: bool = True
    # `sidecar`: each game runs in its worker pod; `networked`: one StatefulSet of
    # games behind a headless Service.
    pattern: Pattern = "sidecar"
    # Applied to every container uerl creates. IfNotPresent: images loaded into
    # kind/k3d/minikube are used as loaded; a rebuilt image needs a new tag.
    image_pull_policy: ImagePullPolicy = "IfNotPresent"
    # Time allowed for pulling images on top of every start-up wait `pulumi up`
    # makes (UE and Ray images are several GB).
    image_pull_timeout_s: int = Field(default=600, ge=0, le=7200)
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

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return k8s_rules.dns1123_label(value, "namespace")

    # -- derived names (stable: rescaling never renames anything) -------------

    @property
    def head_service_host(self) -> str:
        return f"{self.name}-head-svc.{self.namespace}.svc.cluster.local"

    @property
    def ray_token_secret(self) -> str | None:
        """The Secret holding the token Ray's API and GCS ask for; None: no token."""
        if self.ray.auth.mode == "disabled":
            return None
        # KubeRay names the Secret it makes after the RayCluster.
        return self.ray.auth.secret_name or self.name

    @property
    def claim_name(self) -> str:
        return self.executables.existing_claim or f"{self.name}-ue-executables"

    @property
    def runs_claim_name(self) -> str | None:
        """The claim runs are stored on; None when they go to object storage."""
        if self.runs.store != "claim":
            return None
        return self.runs.claim.existing_claim or f"{self.name}-runs"

    @property
    def uses_executables(self) -> bool:
        """Only an Unreal build lives on the shared volume, unless it is in the game's
        image; the mock game is in its image (and dev clusters often have no
        ReadWriteMany storage)."""
        return self.simulator.kind == "unreal" and not self.executables.in_image

    @property
    def has_loader(self) -> bool:
        """A Job unpacks `executables.source_url` into the volume."""
        return self.uses_executables and self.executables.source_url is not None

    def pod_groups(self) -> dict[tuple[str, ...], PodSpec]:
        """The groups whose pods this topology makes, by config path."""
        groups: dict[tuple[str, ...], PodSpec] = {
            ("ray", "head"): self.ray.head,
            ("learners",): self.learners,
            ("workers",): self.workers,
        }
        if self.pattern == "networked":
            groups[("simulator",)] = self.simulator
        if self.has_loader:
            groups[("executables", "loader")] = self.executables.loader
        return groups

    def created_service_accounts(self) -> list[ServiceAccountSpec]:
        """The accounts the stack creates, one per name."""
        out: dict[str, ServiceAccountSpec] = {}
        for group in self.pod_groups().values():
            account = group.service_account
            if account is not None and account.create:
                out.setdefault(account.name, account)
        return list(out.values())

    @property
    def has_dedicated_discovery(self) -> bool:
        return self.pattern == "networked" and self.simulator.discovery == "dedicated"

    @property
    def forwards_game_port(self) -> bool:
        """Networked games bound to loopback are reached through a forwarder in their pod."""
        return self.pattern == "networked" and self.simulator.loopback

    @property
    def game_tls_server(self) -> Literal["forwarder", "game"] | None:
        """Which container serves TLS to env runners (None: no TLS, or none can)."""
        if self.simulator.tls is None:
            return None
        if self.forwards_game_port:
            return "forwarder"
        return "game" if self.simulator.kind == "mock" else None

    @property
    def game_tls_hosts(self) -> list[str]:
        """The names env runners dial, which the games' certificate must hold."""
        if self.pattern == "sidecar":
            return ["localhost", LOOPBACK]
        return [f"*.{self.ue_set_name}.{self.namespace}.svc.cluster.local"]

    @property
    def game_listen_port(self) -> int:
        """The port the game itself listens on."""
        return self.simulator.forwarded_port if self.forwards_game_port else self.simulator.port

    @property
    def ue_set_name(self) -> str:
        """The networked games' StatefulSet and headless Service, `<name>-ue`.

        Prefixed with the topology's name so two stacks can share a namespace."""
        return f"{self.name}-ue"

    @property
    def ue_first_ordinal(self) -> int:
        """Ordinal 0 is the dedicated discovery game; env runner i's game is ordinal i."""
        return 0 if self.has_dedicated_discovery else 1

    @property
    def ue_replicas(self) -> int:
        return self.workers.replicas + (1 - self.ue_first_ordinal)

    def ue_instance_name(self, index: int | str) -> str:
        """Pod (and DNS) name of game `index`: `<name>-ue-1` ... `<name>-ue-Y`, `<name>-ue-0`."""
        return f"{self.ue_set_name}-{index}"

    def ue_instance_host(self, index: int | str) -> str:
        # A StatefulSet pod's DNS name under its headless Service.
        return (
            f"{self.ue_instance_name(index)}.{self.ue_set_name}.{self.namespace}.svc.cluster.local"
        )

    def endpoints(self) -> Endpoints:
        """The endpoints object for this topology deployed on Kubernetes."""
        port = self.simulator.port
        if self.pattern == "sidecar":
            template, discovery = "localhost", f"localhost:{port}"
        else:
            # The one place game host names are spelled: env runners expand the template.
            template = self.ue_instance_host("{worker_index}")
            discovery = f"{self.ue_instance_host(self.ue_first_ordinal)}:{port}"
        head = self.head_service_host
        return Endpoints(
            namespace=self.namespace,
            cluster_name=self.name,
            pattern=self.pattern,
            ray=RayAddresses(
                dashboard_url=f"http://{head}:{DASHBOARD_PORT}",
                client_address=f"ray://{head}:{CLIENT_PORT}",
                gcs_address=f"{head}:{GCS_PORT}",
                token_secret=self.ray_token_secret,
            ),
            discovery_endpoint=discovery,
            worker_url_template=template,
            port=port,
            port_offset_mode="fixed",
            num_env_runners=self.workers.replicas,
            num_learners=self.learners.replicas,
            custom_resource=self.workers.custom_resource,
            learner_custom_resource=self.learners.custom_resource,
            resources=Resources(
                cpus_per_learner=self.learners.cpus,
                gpus_per_learner=self.learners.gpus,
                cpus_per_env_runner=self.workers.cpus,
            ),
            simulator_startup_timeout_s=self.simulator.startup_timeout_s,
            tls=GameTLS.mounted(mutual=self.simulator.tls.mutual) if self.simulator.tls else None,
            runs=RunStorage(
                uri=self.runs.uri,
                s3_endpoint=self.runs.s3.endpoint if self.runs.s3 else None,
                s3_region=self.runs.s3.region if self.runs.s3 else None,
                keep_checkpoints=self.runs.keep_checkpoints,
            ),
        )

    # -- parsing with errors that name the config path ------------------------

    @classmethod
    def parse(cls, data: Any, *, root: str = "topology") -> Topology:
        """Validate raw config; raise TopologyError naming each bad path."""
        if data is None:
            data = {}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise TopologyError(format_validation_error(exc, root)) from None


def format_validation_error(exc: ValidationError, root: str) -> str:
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, Invalid):
            loc += cause.path
        path = format_path([root, *loc])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            fields = _fields_at(err["loc"][:-1])
            hint = did_you_mean(str(err["loc"][-1]), fields) if fields else ""
            msg = f"unknown key{hint or ' (not a topology field)'}"
        elif err["type"] in ("model_type", "model_attributes_type"):
            # pydantic names the model's class, which is no name of the user's.
            msg = f"expected a map of its fields, got {described(err.get('input'))}"
        lines.append(f"{path}: {msg.removeprefix('Value error, ')}")
    noun = "error" if len(lines) == 1 else "errors"
    return f"invalid topology ({len(lines)} {noun}):\n  " + "\n  ".join(lines)


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """The field names of the model at `loc` below the topology ([] if none is there)."""
    model: type[BaseModel] = Topology
    for part in loc:
        if isinstance(part, int):  # an item of a list of models: the same model
            continue
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return []
        model = inner
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, optionally, or as list items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        inner = _model_in(arg)
        if inner is not None:
            return inner
    return None
