"""The game: its container (shared by both patterns) and, in the networked
pattern, one Deployment + ClusterIP Service per instance (`ue-1`..`ue-Y`,
plus `ue-disc`)."""

from __future__ import annotations

import math
from typing import Any

from infra.manifests import volume
from infra.manifests.common import UE_INSTANCE_LABEL, K8sObject, fixed_resources, metadata
from infra.topology import Topology

APP_NAME = "ue"
COMPONENT = "simulator"
CONTAINER_NAME = "ue"
PORT_NAME = "schola"
PROBE_PERIOD_S = 5
# Packaged Unreal games refuse to run as root, and write config and logs under
# $HOME (the build itself is mounted read-only).
UNREAL_UID = 1000
UNREAL_ENV = {"HOME": "/tmp"}


def container(topology: Topology) -> dict[str, Any]:
    """The UE container: the game, its gRPC port probed over TCP, the build read-only."""
    sim = topology.simulator
    command, args = sim.render_command(topology.executables.mount_path)
    out: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": sim.image_ref,
        "command": command,
        "args": args,
        "ports": [{"name": PORT_NAME, "containerPort": sim.port, "protocol": "TCP"}],
        "resources": fixed_resources(sim.cpus, sim.memory, sim.gpus),
        # The startup probe gives the game `startup_timeout_s` to open its port
        # (then it is restarted); readiness gates the Service afterwards.
        "startupProbe": {
            "tcpSocket": {"port": sim.port},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": max(1, math.ceil(sim.startup_timeout_s / PROBE_PERIOD_S)),
        },
        "readinessProbe": {"tcpSocket": {"port": sim.port}, "periodSeconds": PROBE_PERIOD_S},
    }
    env = {**UNREAL_ENV, **sim.env} if sim.kind == "unreal" else dict(sim.env)
    if env:
        out["env"] = [{"name": key, "value": value} for key, value in sorted(env.items())]
    if sim.kind == "unreal":
        out["securityContext"] = {
            "runAsNonRoot": True,
            "runAsUser": UNREAL_UID,
            "runAsGroup": UNREAL_UID,
        }
    if topology.uses_executables:
        out["volumeMounts"] = [volume.mount(topology)]
    return out


def pod_volumes(topology: Topology) -> list[dict[str, Any]]:
    return [volume.pod_volume(topology)] if topology.uses_executables else []


def instance_names(topology: Topology) -> list[str]:
    """Networked instances in a stable order: discovery first, then ue-1..ue-Y."""
    if topology.pattern != "networked":
        return []
    names = [topology.ue_instance_name("disc")] if topology.has_dedicated_discovery else []
    return names + [topology.ue_instance_name(i) for i in range(1, topology.workers.replicas + 1)]


def _selector(topology: Topology, instance: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": topology.name, UE_INSTANCE_LABEL: instance}


def deployment(topology: Topology, instance: str) -> K8sObject:
    meta = metadata(topology, instance, name=APP_NAME, component=COMPONENT)
    meta["labels"][UE_INSTANCE_LABEL] = instance
    pod_spec: dict[str, Any] = {"containers": [container(topology)]}
    init = volume.wait_for_build(topology)
    if init:
        pod_spec["initContainers"] = init
    volumes = pod_volumes(topology)
    if volumes:
        pod_spec["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            # One game per Service: a game serves one client at a time.
            "replicas": 1,
            # Never two games behind one Service, even during a rollout.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector(topology, instance)},
            "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": pod_spec},
        },
    }


def service(topology: Topology, instance: str) -> K8sObject:
    meta = metadata(topology, instance, name=APP_NAME, component=COMPONENT)
    meta["labels"][UE_INSTANCE_LABEL] = instance
    port = topology.simulator.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(topology, instance),
            "ports": [
                {"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }
