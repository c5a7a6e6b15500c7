"""The typed topology spec: the one source of truth for a uerl deployment.

It decides what Kubernetes runs (the Pulumi program) and what RLlib is told
(through the endpoints contract). Read from Pulumi config key `uerl:topology`;
every field has its default here, so a stack file holds only overrides. A value
Kubernetes would refuse (a name, a label, an image, a pod's placement) is refused here,
when the topology is read (infra/k8s_rules.py), so `uerl render`, `pulumi preview` and
the tests refuse alike. Imports only pydantic.

`Topology` is model.py's; each group of fields has a module (pods.py, ray_spec.py,
simulator_spec.py, runs_spec.py, cluster_spec.py) on the shared value_types.py. The
names below are the spec's public ones, importable from here as they always were; the
run-time constants are infra/contract.py's, re-exported for the callers that took them
from here.
"""

from infra.contract import (
    CLIENT_PORT,
    DASHBOARD_PORT,
    GCS_PORT,
    JOB_STOP_GRACE_ENV,
    JOB_STOP_GRACE_S,
    RAY_AUTH_TOKEN_ENV,
    RAY_AUTH_TOKEN_KEY,
    SUPERVISOR_APP,
)
from infra.endpoints import Pattern
from infra.s3_rules import StoreAddress, store_address
from infra.topology.cluster_spec import (
    KUBERAY_CHART_VERSION,
    KUBERAY_REPOSITORY,
    METRICS_PORT,
    MetricsScraperSpec,
    MetricsSpec,
    OperatorSpec,
    SecuritySpec,
)
from infra.topology.model import NAME_MAX, Topology
from infra.topology.pods import PodSpec, ServiceAccountSpec, SizedSpec, Toleration
from infra.topology.ray_spec import (
    PYTHON_TAG,
    RAY_AUTH_MIN_VERSION,
    RAY_VERSION,
    SHM_MEMORY_FRACTION,
    HeadSpec,
    LearnerSpec,
    RayAuthSpec,
    RayGroupSpec,
    RaySpec,
    WorkerSpec,
)
from infra.topology.runs_spec import (
    RUNS_MOUNT_PATH,
    S3_SECRET_KEYS,
    RunsClaimSpec,
    RunsS3Spec,
    RunsSpec,
)
from infra.topology.simulator_spec import (
    ALL_INTERFACES,
    FORWARDER_IMAGE,
    GAME_SELECTOR_LABELS,
    LOOPBACK,
    PLACEHOLDERS,
    SIMULATOR_DEFAULTS,
    ExecutablesSpec,
    GameTLSSpec,
    LoaderSpec,
    SimulatorSpec,
)
from infra.topology.validation_errors import FieldError, TopologyError
from infra.topology.value_types import (
    GPU_RESOURCE,
    KUBERAY_LABEL_PREFIX,
    MAX_CPUS,
    OWN_LABELS,
    ImagePullPolicy,
    quantity_value,
)

__all__ = [
    "ALL_INTERFACES",
    "CLIENT_PORT",
    "DASHBOARD_PORT",
    "FORWARDER_IMAGE",
    "GAME_SELECTOR_LABELS",
    "GCS_PORT",
    "GPU_RESOURCE",
    "JOB_STOP_GRACE_ENV",
    "JOB_STOP_GRACE_S",
    "KUBERAY_CHART_VERSION",
    "KUBERAY_LABEL_PREFIX",
    "KUBERAY_REPOSITORY",
    "LOOPBACK",
    "MAX_CPUS",
    "METRICS_PORT",
    "NAME_MAX",
    "OWN_LABELS",
    "PLACEHOLDERS",
    "PYTHON_TAG",
    "RAY_AUTH_MIN_VERSION",
    "RAY_AUTH_TOKEN_ENV",
    "RAY_AUTH_TOKEN_KEY",
    "RAY_VERSION",
    "RUNS_MOUNT_PATH",
    "S3_SECRET_KEYS",
    "SHM_MEMORY_FRACTION",
    "SIMULATOR_DEFAULTS",
    "SUPERVISOR_APP",
    "ExecutablesSpec",
    "FieldError",
    "GameTLSSpec",
    "HeadSpec",
    "ImagePullPolicy",
    "LearnerSpec",
    "LoaderSpec",
    "MetricsScraperSpec",
    "MetricsSpec",
    "OperatorSpec",
    "Pattern",
    "PodSpec",
    "RayAuthSpec",
    "RayGroupSpec",
    "RaySpec",
    "RunsClaimSpec",
    "RunsS3Spec",
    "RunsSpec",
    "SecuritySpec",
    "ServiceAccountSpec",
    "SimulatorSpec",
    "SizedSpec",
    "StoreAddress",
    "Toleration",
    "Topology",
    "TopologyError",
    "WorkerSpec",
    "quantity_value",
    "store_address",
]
