"""Where a training's artefacts go (`runs`): the runs claim, mounted on the Ray head where
the driver runs, or the object store's credentials given to the head.

The endpoints (`Topology.endpoints().runs`) tell the driver the same place, so
`uerl train` on the cluster needs no path flag.
"""

from __future__ import annotations

from typing import Any

from infra.manifests.common import K8sObject, claim
from infra.topology import RUNS_MOUNT_PATH, S3_SECRET_KEYS, Topology

VOLUME_NAME = "uerl-runs"
COMPONENT = "runs"


def pvc(topology: Topology) -> K8sObject | None:
    """The runs claim, unless runs go to object storage or the topology names a claim."""
    name = topology.runs_claim_name
    spec = topology.runs.claim
    if name is None or spec.existing_claim is not None:
        return None
    return claim(
        topology,
        name,
        name=VOLUME_NAME,
        component=COMPONENT,
        access_mode=spec.access_mode,
        size=spec.size,
        storage_class=spec.storage_class,
    )


def add_to_head(topology: Topology, pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """The head reaches the runs: the claim mounted at RUNS_MOUNT_PATH, or the store's
    credentials as the variables every S3 client reads."""
    name = topology.runs_claim_name
    if name is not None:
        pod_spec.setdefault("volumes", []).append(
            {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": name}}
        )
        container.setdefault("volumeMounts", []).append(
            {"name": VOLUME_NAME, "mountPath": RUNS_MOUNT_PATH}
        )
        return
    s3 = topology.runs.s3
    if s3 is None or s3.credentials_secret is None:
        return
    container.setdefault("env", []).extend(
        {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": s3.credentials_secret, "key": key}},
        }
        for key in S3_SECRET_KEYS
    )
