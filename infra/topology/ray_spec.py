"""The Ray cluster (`ray`: version, image, head, auth) and its node groups (`learners`,
`workers`): what KubeRay's RayCluster is made of."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from infra.topology.pods import PodSpec, SizedSpec
from infra.topology.validation_errors import FieldError
from infra.topology.value_types import (
    GPU_RESOURCE,
    MAX_CPUS,
    GpuResource,
    Image,
    Quantity,
    ResourceName,
    SecretName,
    Spec,
    Text,
    quantity_value,
)

# The Ray version the training package is pinned to (pyproject: ray[default,rllib]==...).
# The default Ray image follows it so head, workers and driver agree.
RAY_VERSION = "2.60.0"
PYTHON_TAG = "py311"
# Ray's token authentication needs Ray >= 2.52 (contract.py: where the token is read).
RAY_AUTH_MIN_VERSION = (2, 52, 0)
# /dev/shm of a Ray container, as a fraction of its memory unless sized: Ray's object
# store takes this share of the memory by default and lives in /dev/shm.
SHM_MEMORY_FRACTION = 0.3


class _RaySizedSpec(SizedSpec):
    ephemeral_storage: Quantity | None = "1Gi"
    """Node disk requested for the Ray container's writes: Ray's session logs and spilled objects in
    /tmp, runs started under $HOME (a request, not a limit). None: no request."""
    shm_size: Quantity | None = None
    """Size of the Ray container's /dev/shm (memory-backed: Ray's object store lives there, and it
    counts against `memory`). None: 30% of `memory`, the object store's default."""

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

    cpus: float = Field(default=1, gt=0, le=MAX_CPUS)
    """CPUs of the head container."""
    memory: Quantity = "4Gi"
    """Memory of the head container, a Kubernetes quantity."""


class RayAuthSpec(Spec):
    """Who may call Ray's dashboard, job API and GCS (KubeRay's `authOptions`)."""

    mode: Literal["token", "disabled"] = "token"
    """`token`: every call needs the token (Ray's token authentication, Ray >= 2.52, KubeRay >=
    1.5); `disabled`: open to whoever reaches the head's ports (the NetworkPolicies narrow who;
    `security.allowed_cidrs` then must stay empty)."""
    secret_name: SecretName | None = None
    """A Secret of yours holding the token under the key `auth_token`. None: KubeRay makes one named
    as the RayCluster (32 random bytes, deleted with the cluster)."""

    @model_validator(mode="after")
    def _secret_needs_token(self) -> RayAuthSpec:
        if self.mode == "disabled" and self.secret_name is not None:
            raise FieldError(("secret_name",), "ray.auth.mode is 'disabled': no token is asked for")
        return self


class RaySpec(Spec):
    """The Ray cluster (KubeRay RayCluster): its version, image, head and who may call it."""

    version: Text = Field(default=RAY_VERSION, pattern=r"^\d+\.\d+\.\d+$")
    """Ray version of the cluster; must equal the training package's pin."""
    image: Image | None = None
    """Ray image for head and workers, and learners unless `learners.image` (it needs uerl
    installed). None: `uerl/ray:<version>-py311-cpu` (docker/ray.Dockerfile)."""
    head: HeadSpec = HeadSpec()
    auth: RayAuthSpec = RayAuthSpec()
    start_timeout_s: int = Field(default=300, ge=10, le=7200)
    """How long `pulumi up` gives KubeRay to create the Ray pods and `ray start` to join, after the
    images are pulled (and sidecar games answer); `uerl local`, its Ray nodes to start and
    register (a busy host's may miss Ray's own 30 s, and are started again within this)."""

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
    cpus: float = Field(default=1, gt=0, le=MAX_CPUS)
    """CPUs of each node's Ray container (fractions become millicores)."""
    memory: Quantity = "2Gi"
    """Memory of each node's Ray container, a Kubernetes quantity."""


class LearnerSpec(_NodeGroupSpec):
    """X learner nodes. replicas 0 trains on the driver."""

    custom_resource: ResourceName = "uerl_learner"
    """The Ray resource each learner node advertises (one unit); every learner needs one, so
    learners run only on learner nodes (never on a worker node, whose pod a shrink may delete, or
    beside a game)."""

    replicas: int = Field(default=1, ge=0, le=256)
    """X: how many learner nodes (one RLlib learner each); 0 learns on the driver."""
    cpus: float = Field(default=2, gt=0, le=MAX_CPUS)
    """CPUs of each learner's Ray container."""
    memory: Quantity = "4Gi"
    """Memory of each learner's Ray container, a Kubernetes quantity."""
    gpus: int = Field(default=0, ge=0, le=16)
    """GPUs per learner, asked for as `gpu_resource`."""
    gpu_resource: GpuResource = GPU_RESOURCE
    """The extended resource the learners' GPUs are, e.g. `amd.com/gpu`."""
    image: Image | None = None
    """The learners' image, e.g. the CUDA build of the Ray image (`make images` tags it
    `uerl/ray:<version>-py311-cuda`: the same Ray, Python and uerl). None: the Ray image
    (`ray.image`)."""


class WorkerSpec(_NodeGroupSpec):
    """Y env-runner nodes, one UE instance each, each advertising `custom_resource`.

    replicas 0 leaves no game: a training that is running pauses until games return."""

    replicas: int = Field(default=2, ge=0, le=1000)
    """Y: how many env-runner nodes, one game and one env runner each."""
    custom_resource: ResourceName = "ue_worker"
    """The Ray resource each worker advertises (one unit); every env runner needs one."""
