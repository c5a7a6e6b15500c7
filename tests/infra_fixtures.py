"""Shared helpers for the infra tests: topologies, rendering, schema validation, mock runs."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from infra.render import apply_sets, render
from infra.topology import Topology

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Upstream data the repository carries, unmodified (third_party/README.md).
THIRD_PARTY = PROJECT_ROOT / "third_party"
# The KubeRay operator chart 1.7.0, as a local chart (`topology.operator.chart_path`).
KUBERAY_CHART = THIRD_PARTY / "kuberay-operator-1.7.0"
CRD_ENV = "UERL_RAYCLUSTER_CRD"
# KubeRay v1.7.0's RayCluster CRD: the chart's copy is the operator's own, byte for byte.
DEFAULT_CRD = KUBERAY_CHART / "crds" / "ray.io_rayclusters.yaml"
PULUMI_PROJECT_SCHEMA = THIRD_PARTY / "pulumi-project-schema-v3.259.0" / "project.json"
HARNESS = Path(__file__).resolve().parent / "pulumi_harness.py"

# The groups whose pods a topology places, by config path (the networked games and the
# loader Job have pods of their own only in OWN_CLUSTER's pattern and with its build).
POD_GROUPS = ("ray.head", "learners", "workers", "simulator", "executables.loader")
SERVICE_ACCOUNT = "uerl-runner"
WORKLOAD_IDENTITY = {"iam.gke.io/gcp-service-account": "uerl@project.iam.gserviceaccount.com"}


def pod_fields(group: str) -> list[str]:
    """Every pod field of `group` set, as `pulumi config set --path` would."""
    prefix = f"topology.{group}"
    term = f"{prefix}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    expression = f"{term}.nodeSelectorTerms[0].matchExpressions[0]"
    ((annotation, identity),) = WORKLOAD_IDENTITY.items()
    return [
        f"{prefix}.node_selector.pool={group.split('.')[-1]}",
        f"{prefix}.tolerations[0].key=dedicated",
        f"{prefix}.tolerations[0].value=uerl",
        f"{prefix}.tolerations[0].effect=NoSchedule",
        f"{expression}.key=kubernetes.io/arch",
        f"{expression}.operator=In",
        f"{expression}.values[0]=amd64",
        f"{prefix}.priority_class_name=uerl-high",
        f"{prefix}.labels.team=rl",
        f'{prefix}.annotations["example.com/owner"]=rl-team',
        f"{prefix}.image_pull_secrets[0]=registry",
        f"{prefix}.service_account.name={SERVICE_ACCOUNT}",
        f"{prefix}.service_account.create=true",
        f'{prefix}.service_account.annotations["{annotation}"]={identity}',
    ]


# A team's own cluster: every pod placed and named, images per group, other GPUs.
OWN_CLUSTER = [
    "topology.pattern=networked",
    "topology.simulator.kind=unreal",
    "topology.executables.source_url=https://example.com/builds/game.tar.gz",
    "topology.learners.image=registry.example.com/uerl/ray:2.60.0-py311-rocm",
    "topology.learners.gpus=2",
    "topology.learners.gpu_resource=amd.com/gpu",
    "topology.simulator.gpus=1",
    "topology.simulator.gpu_resource=gpu.intel.com/i915",
    "topology.learners.cpu_limits=false",
    "topology.simulator.cpu_limits=false",
    "topology.workers.shm_size=256Mi",
    "topology.simulator.ephemeral_storage=10Gi",
    "topology.simulator.topology_spread_constraints[0].maxSkew=1",
    "topology.simulator.topology_spread_constraints[0].topologyKey=topology.kubernetes.io/zone",
    "topology.simulator.topology_spread_constraints[0].whenUnsatisfiable=ScheduleAnyway",
    "topology.ray.auth.secret_name=team-ray-token",
    *(field for group in POD_GROUPS for field in pod_fields(group)),
]

# Topologies exercising every builder branch.
TOPOLOGY_VARIANTS: dict[str, list[str]] = {
    "dev-sidecar": [],
    "dev-networked": ["topology.pattern=networked"],
    "unreal-sidecar-loader": [
        "topology.simulator.kind=unreal",
        "topology.executables.source_url=https://example.com/builds/game.tar.gz",
        "topology.executables.storage_class=nfs",
    ],
    "unreal-networked-gpu": [
        "topology.pattern=networked",
        "topology.simulator.kind=unreal",
        "topology.simulator.gpus=1",
        "topology.simulator.env.UE_LOG=verbose",
        "topology.executables.existing_claim=shared-builds",
        "topology.executables.source_url=https://example.com/builds/game.zip",
        "topology.learners.gpus=2",
        "topology.learners.node_selector.gpu=a100",
        "topology.learners.tolerations[0].key=nvidia.com/gpu",
        "topology.learners.tolerations[0].operator=Exists",
        "topology.learners.tolerations[0].effect=NoSchedule",
        "topology.workers.cpus=1.5",
    ],
    "networked-all-interfaces": [
        "topology.pattern=networked",
        "topology.simulator.listen=all_interfaces",
        "topology.image_pull_policy=IfNotPresent",
    ],
    "networked-worker1-discovery": [
        "topology.pattern=networked",
        "topology.simulator.discovery=worker1",
        "topology.operator.install=false",
        "topology.create_namespace=false",
    ],
    "own-cluster": OWN_CLUSTER,
}


def dev_stack_topology() -> dict[str, Any]:
    """The raw `uerl:topology` value of Pulumi.dev.yaml."""
    config = yaml.safe_load((PROJECT_ROOT / "Pulumi.dev.yaml").read_text())["config"]
    return copy.deepcopy(config.get("uerl:topology") or {})


def dev_topology(*sets: str) -> Topology:
    """The dev stack's topology after `pulumi config set --path` edits."""
    return Topology.parse(apply_sets(dev_stack_topology(), sets))


def split_documents(text: str) -> tuple[str, list[str]]:
    """`uerl render` output -> (leading comment, YAML document texts)."""
    header, *docs = text.split("---\n")
    return header, docs


def rendered(*sets: str) -> dict[tuple[str, str], str]:
    """(kind, name) -> the object's YAML text, as `uerl render --stack dev --set ...` prints."""
    _, docs = split_documents(render(dev_topology(*sets)))
    out = {}
    for doc in docs:
        obj = yaml.safe_load(doc)
        out[(obj["kind"], obj["metadata"]["name"])] = doc
    return out


# -- RayCluster CRD schema ------------------------------------------------------


def crd_path() -> Path:
    return Path(os.environ.get(CRD_ENV) or DEFAULT_CRD)


def strict_structural(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that rejects unknown fields.

    The API server prunes fields a structural schema does not name; a test
    must fail on them instead, so objects with `properties` get
    additionalProperties: false unless they preserve unknown fields.
    `x-kubernetes-int-or-string` comes with anyOf[int, string] in
    controller-gen output; add it where missing.
    """
    if isinstance(schema, list):
        return [strict_structural(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict_structural(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


@cache
def raycluster_validator() -> jsonschema.Draft7Validator:
    path = crd_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"RayCluster CRD not found at {path}: set {CRD_ENV} to a ray.io_rayclusters.yaml "
            "(e.g. `kubectl get crd rayclusters.ray.io -o yaml`)"
        )
    crd = yaml.safe_load(path.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(strict_structural(v1["schema"]["openAPIV3Schema"]))


def raycluster_errors(obj: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in err.absolute_path)}: {err.message}"
        for err in raycluster_validator().iter_errors(obj)
    ]


# -- Pulumi program under mocks --------------------------------------------------


def run_program(
    *sets: str,
    topology: Any = None,
    config: dict[str, str] | None = None,
    program: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run infra/__main__.py (or `program`) under mocks in a fresh process, as `pulumi up`
    runs it, with `env` added to the environment.

    Config: Pulumi.dev.yaml's `uerl:topology` after the `pulumi config set
    --path` edits in `sets` (or `topology` verbatim), and `config`'s other keys
    (e.g. `kubernetes:kubeconfig`), passed the way the Pulumi CLI passes them: JSON in
    PULUMI_CONFIG.
    """
    value = apply_sets(dev_stack_topology(), sets) if topology is None else topology
    values = {"uerl:topology": json.dumps(value), **(config or {})}
    proc = subprocess.run(
        [sys.executable, str(HARNESS), *([str(program)] if program else [])],
        cwd=PROJECT_ROOT,
        env={**os.environ, **(env or {}), "PULUMI_CONFIG": json.dumps(values)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"harness failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def resources_of(report: dict[str, Any], typ: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in report["resources"] if r["type"] == typ}


def integral_floats_to_int(value: Any) -> Any:
    """Pulumi's wire format (protobuf Struct) turns every number into a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral_floats_to_int(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_floats_to_int(v) for v in value]
    return value
