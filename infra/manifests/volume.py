"""The shared volume holding the packaged game, and the Job that fills it.

The loader Job (or whoever copies a build in by hand) writes READY_MARKER
last; UE pods wait for it in an init container, so no game starts on a missing
or half-unpacked build, and the claim may be created together with the games.
"""

from __future__ import annotations

import shlex
from typing import Any

from infra.manifests import placement, pod_security
from infra.manifests.common import K8sObject, await_annotations, claim, metadata
from infra.topology import Topology

VOLUME_NAME = "ue-executables"
READY_MARKER = ".uerl-ready"
COMPONENT = "executables"
LOADER_APP = "ue-loader"


def loader_job_name(topology: Topology) -> str:
    return f"{topology.name}-ue-loader"


def pvc(topology: Topology) -> K8sObject | None:
    """The claim, unless the topology names an existing one or needs no build."""
    spec = topology.executables
    if not topology.uses_executables or spec.existing_claim is not None:
        return None
    return claim(
        topology,
        topology.claim_name,
        name=VOLUME_NAME,
        component=COMPONENT,
        access_mode=spec.access_mode,
        size=spec.size,
        storage_class=spec.storage_class,
    )


def pod_volume(topology: Topology, *, read_only: bool = True) -> dict[str, Any]:
    return {
        "name": VOLUME_NAME,
        "persistentVolumeClaim": {"claimName": topology.claim_name, "readOnly": read_only},
    }


def mount(topology: Topology, *, read_only: bool = True) -> dict[str, Any]:
    return {
        "name": VOLUME_NAME,
        "mountPath": topology.executables.mount_path,
        "readOnly": read_only,
    }


def _loader_script(topology: Topology) -> str:
    spec = topology.executables
    url = shlex.quote(spec.source_url or "")
    root = spec.mount_path.rstrip("/") or "/"
    dest = shlex.quote(root)
    marker = f"{dest}/{READY_MARKER}"
    launcher = shlex.quote(f"{root}/{topology.simulator.executable}")
    # Idempotent: a re-run (Job replaced, pod retried) with the same URL is a no-op.
    return f"""set -eu
url={url}
if [ -f {marker} ] && [ "$(cat {marker})" = "$url" ]; then
  echo "build from $url already unpacked"; exit 0
fi
rm -f {marker}
tmp=$(mktemp -d)
case "$url" in
  s3://*) aws s3 cp "$url" "$tmp/build" ;;
  gs://*) gsutil cp "$url" "$tmp/build" ;;
  *) wget -q -O "$tmp/build" "$url" ;;
esac
case "$url" in
  *.zip) unzip -q -o "$tmp/build" -d {dest} ;;
  *) tar -xf "$tmp/build" -C {dest} ;;
esac
rm -rf "$tmp"
# An archive made on Windows carries no execute bits, and the games mount this
# volume read-only: restore them now. Everything readable by the game's user;
# the launcher, scripts and whatever sits in a Binaries/Linux directory executable.
# Only what the loader owns (what it unpacked), below the root: the volume's root and
# what else is there belong to whoever made them (root on most storage, and a
# root-owned lost+found on ext4), and chmod of, or find in, those fails the Job. Those
# are pruned, not entered.
uid=$(id -u)
find {dest} -mindepth 1 ! -user "$uid" -prune -o -exec chmod u+rwX,go+rX {{}} +
find {dest} -mindepth 1 ! -user "$uid" -prune -o -type f \\( -name '*.sh' -o \\
  -path '*/Binaries/Linux/*' \\) -exec chmod a+x {{}} +
if [ -f {launcher} ]; then find {launcher} -user "$uid" -exec chmod a+x {{}} +; fi
printf '%s' "$url" > {marker}
echo "unpacked $url into {dest}"
"""


def loader_job(topology: Topology) -> K8sObject | None:
    """One-off Job unpacking `executables.source_url` into the volume (if set)."""
    spec = topology.executables
    if not topology.has_loader:
        return None
    meta = metadata(topology, loader_job_name(topology), name=LOADER_APP, component=COMPONENT)
    # Pulumi waits this long for the Job. A claim the storage class cannot bind
    # (e.g. no ReadWriteMany) leaves its pod Pending until then.
    meta["annotations"] = await_annotations(spec.loader_timeout_s)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 3,
            "template": {
                "metadata": placement.pod_metadata(
                    topology, spec.loader, name=LOADER_APP, component=COMPONENT
                ),
                "spec": {
                    "restartPolicy": "OnFailure",
                    "containers": [
                        {
                            "name": "loader",
                            "image": spec.loader_image,
                            "imagePullPolicy": topology.image_pull_policy,
                            "command": ["sh", "-c", _loader_script(topology)],
                            "volumeMounts": [mount(topology, read_only=False)],
                            "securityContext": pod_security.container_context(
                                pod_security.UNREAL_UID, pod_security.UNREAL_UID
                            ),
                        }
                    ],
                    "volumes": [pod_volume(topology, read_only=False)],
                },
            },
        },
    }
    pod_spec = job["spec"]["template"]["spec"]
    placement.place(pod_spec, spec.loader)
    # fsGroup: the claim's files are writable by the loader's group.
    pod_security.restrict(pod_spec, fs_group=pod_security.UNREAL_UID)
    return job


def wait_for_build(topology: Topology) -> list[dict[str, Any]]:
    """Init containers holding a UE pod until the build is complete on the volume:
    written by the loader Job, or by hand (docs/kubernetes.md: putting a build into the volume)."""
    spec = topology.executables
    if not topology.uses_executables:
        return []
    marker = shlex.quote(f"{spec.mount_path.rstrip('/')}/{READY_MARKER}")
    return [
        {
            "name": "wait-for-build",
            "image": spec.loader_image,
            "imagePullPolicy": topology.image_pull_policy,
            "command": [
                "sh",
                "-c",
                f"until [ -f {marker} ]; do echo waiting for {marker}; sleep 5; done",
            ],
            "volumeMounts": [mount(topology)],
            "securityContext": pod_security.container_context(pod_security.NOBODY_UID),
        }
    ]
