"""The Kubernetes Job `uerl submit --supervise` makes: one pod running `uerl supervise`
for one run, in the stack's namespace, so the run is carried on across a lost head with
nobody acting (training.supervise.supervisor says how).

Built from the head pod as the cluster runs it: its image (it has `uerl` and Ray's job
client), its pull secrets, node selector, affinity and tolerations (a node the head may
use), the stack's instance label (the stack's NetworkPolicy `<name>-ray-head-supervisor`
admits pods with it and the app name SUPERVISOR_APP to the job API, and nothing else).
Its giving up ends the Job; a pod lost otherwise is replaced (pod_failure_policy). The
pod passes the `restricted` Pod Security Standard, calls no Kubernetes API (no token
mounted; the Ray API's token comes from its Secret as RAY_AUTH_TOKEN) and asks for
little: it polls the job API every few seconds.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from infra.contract import SUPERVISOR_APP
from infra.endpoints import Endpoints
from infra.manifests import pod_security
from infra.manifests.pod_security import RAY_GID, RAY_UID
from training.ray_auth.token_client import RAY_AUTH_TOKEN_FILE_ENV, RAY_AUTH_TOKEN_KEY
from training.runstore.attempts import SUPERVISION_VARIABLE

# The label the Job controller gives each pod of a Job: the Job's uid.
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_UID_FIELD = f"metadata.labels['{JOB_UID_LABEL}']"

INSTANCE_LABEL = "app.kubernetes.io/instance"
RUN_LABEL = "uerl.dev/run"
RUN_ANNOTATION = "uerl.dev/run-name"  # the exact name: the label may be cut to fit
CONTAINER = "supervisor"
# A pod that failed otherwise (deleted by a person, OOM-killed, crashed): the Job makes
# another, which finds the running attempt and follows it, this many times at most.
BACKOFF_LIMIT = 6
# `uerl supervise`'s own ends (training.commands.supervise): restarts used up or no head
# (1), bad input (2). Another pod would only start over: resubmitting a run that gave up.
GIVE_UP_EXIT_CODES = [1, 2]
TTL_AFTER_FINISHED_S = 7 * 24 * 3600


def _run_hash(run_name: str) -> str:
    return hashlib.sha256(run_name.encode()).hexdigest()[:8]


def _fitted(kept: str, run_name: str, limit: int = 63) -> str:
    """`kept` (what of the run name fits), then `-<hash of the run name>`, in `limit`:
    two run names that fit to the same text still get different results."""
    return f"{kept[: limit - 9].rstrip('-._')}-{_run_hash(run_name)}"


def job_name(cluster_name: str, run_name: str) -> str:
    """`<cluster>-supervise-<run>`, a valid object name (lower case, `-`, 63 at most: the
    Job's pods carry it as a label value). A run name changed to fit (case, `.`, `_`, its
    length) gets its hash appended, so run names differing only there get Jobs of their
    own rather than the 409 of an existing one."""
    run = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-") or "run"
    name = f"{cluster_name}-supervise-{run}"
    if run == run_name and len(name) <= 63:
        return name
    return _fitted(name, run_name)


def run_label(run_name: str) -> str:
    """The run name as a label value (63 at most, a letter or digit at both ends); a run
    name that does not fit so is cut, with its hash appended (the exact name is the
    RUN_ANNOTATION)."""
    if len(run_name) <= 63 and run_name[-1].isalnum():
        return run_name
    return _fitted(run_name, run_name)


def pod_labels(instance: str, run_name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": SUPERVISOR_APP,
        INSTANCE_LABEL: instance,
        "app.kubernetes.io/component": "supervisor",
        "app.kubernetes.io/part-of": "uerl",
        RUN_LABEL: run_label(run_name),
    }


# Where the supervisor's pod mounts the stack's token Secret: the kubelet refreshes a
# mounted Secret when it changes (an env var from it is fixed at the pod's start).
TOKEN_VOLUME = "ray-token"
TOKEN_DIR = "/var/run/uerl/ray-token"


def _token_env(endpoints: Endpoints) -> list[dict[str, Any]]:
    if endpoints.ray.token_secret is None:
        return []
    return [{"name": RAY_AUTH_TOKEN_FILE_ENV, "value": f"{TOKEN_DIR}/{RAY_AUTH_TOKEN_KEY}"}]


def _token_volume(endpoints: Endpoints) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the pod's volumes, the container's mounts) for the token Secret; none without."""
    secret = endpoints.ray.token_secret
    if secret is None:
        return [], []
    volume = {
        "name": TOKEN_VOLUME,
        "secret": {
            "secretName": secret,
            "items": [{"key": RAY_AUTH_TOKEN_KEY, "path": RAY_AUTH_TOKEN_KEY}],
            "defaultMode": 0o444,  # the supervisor runs as the Ray user, not the owner
        },
    }
    return [volume], [{"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}]


def pod_failure_policy() -> dict[str, Any]:
    """The supervisor's giving up ends the Job; a pod lost to a disruption (its node
    drained or lost, evicted, preempted: the DisruptionTarget condition) is replaced
    without counting against BACKOFF_LIMIT. The first rule that matches applies."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": GIVE_UP_EXIT_CODES,
                },
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        ]
    }


def build(
    endpoints: Endpoints,
    head_pod: dict[str, Any],
    run_name: str,
    train_args: list[str],
    *,
    max_restarts: int,
) -> dict[str, Any]:
    """The Job (the API's JSON shape) for `head_pod` (as the API serves it)."""
    spec = head_pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    labels = pod_labels(str((head_pod["metadata"].get("labels") or {})[INSTANCE_LABEL]), run_name)
    annotations = {RUN_ANNOTATION: run_name}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": CONTAINER,
                "image": container["image"],
                "imagePullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
                "command": [
                    "uerl",
                    "supervise",
                    "--address",
                    endpoints.ray.dashboard_url,
                    "--run-name",
                    run_name,
                    "--max-restarts",
                    str(max_restarts),
                    "--",
                    *train_args,
                ],
                # The token the head's job API asks for: the file of the Secret KubeRay
                # gives the Ray pods, mounted (never in the Job's spec).
                "env": [
                    *_token_env(endpoints),
                    # Its supervision: the Job's uid, the same in each pod it replaces.
                    {
                        "name": SUPERVISION_VARIABLE,
                        "valueFrom": {
                            "fieldRef": {"fieldPath": f"metadata.labels['{JOB_UID_LABEL}']"}
                        },
                    },
                ],
                "resources": {
                    "requests": {"cpu": "50m", "memory": "256Mi"},
                    "limits": {"memory": "512Mi"},
                },
                # The Ray image's user; its root stays writable as the Ray containers'
                # do (Ray's client may write under $HOME, where the image keeps Python).
                "securityContext": {
                    "runAsUser": RAY_UID,
                    "runAsGroup": RAY_GID,
                    "readOnlyRootFilesystem": False,
                },
            }
        ],
    }
    volumes, mounts = _token_volume(endpoints)
    if volumes:
        pod_spec["volumes"] = volumes
        pod_spec["containers"][0]["volumeMounts"] = mounts
    pod_security.restrict(pod_spec)  # as every pod of the stack: `restricted`
    for key in ("imagePullSecrets", "nodeSelector", "affinity", "tolerations"):
        if spec.get(key):
            pod_spec[key] = spec[key]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(endpoints.cluster_name, run_name),
            "namespace": endpoints.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "podFailurePolicy": pod_failure_policy(),  # with the pod's restartPolicy Never
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }
