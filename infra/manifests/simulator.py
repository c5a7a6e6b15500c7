"""The game: its container (shared by both patterns) and, in the networked pattern,
one StatefulSet `<name>-ue` behind a headless Service of the same name.

Networked games are StatefulSet pods `<name>-ue-1` ... `<name>-ue-Y` (and
`<name>-ue-0`, the dedicated discovery game), each reachable at
`<pod>.<name>-ue.<namespace>.svc.cluster.local`: stable per-game names from two
objects whatever Y is, and rescaling changes one field. Needs Kubernetes >= 1.27
for `spec.ordinals` (GA in 1.31).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from infra.manifests import game_tls, placement, pod_security, volume
from infra.manifests.common import (
    K8sObject,
    await_annotations,
    container_resources,
    metadata,
    sized_resources,
)
from infra.topology import LOOPBACK, Topology

APP_NAME = "ue"
COMPONENT = "simulator"
CONTAINER_NAME = "ue"
FORWARDER_NAME = "forward"
PORT_NAME = "schola"
PROBE_PERIOD_S = 5
# `simulator.probe: grpc`: docker/unreal-game.Dockerfile's probe (docker/schola_probe.py),
# given a deadline inside the kubelet's timeout (Python and grpc start in about 0.5 s).
SCHOLA_PROBE = "schola-probe"
GRPC_PROBE_DEADLINE_S, GRPC_PROBE_TIMEOUT_S = 3, 5
# Packaged Unreal games write config and logs under $HOME (the build itself is
# mounted read-only).
UNREAL_ENV = {"HOME": "/tmp"}
# The forwarder relays every gRPC message of its game. Its CPU is limited as the
# game's is (`simulator.cpu_limits`), so the pod's QoS is the game's.
FORWARDER_CPUS, FORWARDER_MEMORY = 0.5, "64Mi"
FORWARDER_SOURCE = (Path(__file__).resolve().parent.parent / "forwarder.py").read_text()


def _probe_action(topology: Topology) -> dict[str, Any]:
    """How the kubelet checks that the game accepts connections, where it listens."""
    port = topology.game_listen_port
    if topology.simulator.probe == "grpc":
        # From inside the game's container (loopback reaches a game bound to either);
        # its own deadline below the probe's timeout.
        return {
            "exec": {"command": [SCHOLA_PROBE, f"{LOOPBACK}:{port}", str(GRPC_PROBE_DEADLINE_S)]},
            "timeoutSeconds": GRPC_PROBE_TIMEOUT_S,
        }
    if topology.simulator.loopback:
        # TCP probes dial the pod IP, where a loopback-bound game is not; this
        # connects from inside the game's own container (the launcher of every
        # Linux UE build is a bash script, so the image has bash).
        return {"exec": {"command": ["bash", "-c", f"exec 3<>/dev/tcp/{LOOPBACK}/{port}"]}}
    return {"tcpSocket": {"port": port}}


def startup_failure_threshold(topology: Topology) -> int:
    return max(1, math.ceil(topology.simulator.startup_timeout_s / PROBE_PERIOD_S))


def container(topology: Topology, *, native_sidecar: bool = False) -> dict[str, Any]:
    """The UE container: the game, probed where it listens, the build read-only.

    `native_sidecar`: an init container with restartPolicy Always (Kubernetes
    >= 1.29): it starts before the pod's containers, which wait until its
    startup probe passes, and the kubelet restarts it whenever it exits.
    """
    sim = topology.simulator
    command, args = sim.render_command(
        topology.executables.mount_path, port=topology.game_listen_port
    )
    if topology.game_tls_server == "game":
        args = [*args, *game_tls.server_args(topology)]
    probe = _probe_action(topology)
    out: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": sim.image_ref,
        "imagePullPolicy": topology.image_pull_policy,
        "command": command,
        "args": args,
    }
    if native_sidecar:
        out["restartPolicy"] = "Always"
    if not sim.loopback:
        out["ports"] = [{"name": PORT_NAME, "containerPort": sim.port, "protocol": "TCP"}]
    out |= {
        "resources": sized_resources(sim, sim.gpus, sim.gpu_resource),
        # The startup probe gives the game `startup_timeout_s` to open its port
        # (then it is restarted); readiness gates its DNS name afterwards.
        "startupProbe": {
            **probe,
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": startup_failure_threshold(topology),
        },
        "readinessProbe": {**probe, "periodSeconds": PROBE_PERIOD_S},
    }
    env = {**UNREAL_ENV, **sim.env} if sim.kind == "unreal" else dict(sim.env)
    if env:
        out["env"] = [{"name": key, "value": value} for key, value in sorted(env.items())]
    uid = pod_security.UNREAL_UID if sim.kind == "unreal" else pod_security.MOCK_UID
    out["securityContext"] = pod_security.container_context(uid, uid)
    if topology.uses_executables:
        out["volumeMounts"] = [volume.mount(topology)]
    return out


def forwarder(topology: Topology) -> dict[str, Any]:
    """Serves `simulator.port` on the pod IP, relaying to the loopback-bound game."""
    sim = topology.simulator
    return {
        "name": FORWARDER_NAME,
        "image": sim.forwarder_image,
        "imagePullPolicy": topology.image_pull_policy,
        "command": ["python", "-c", FORWARDER_SOURCE],
        "args": [
            str(sim.port),
            LOOPBACK,
            str(topology.game_listen_port),
            *game_tls.server_args(topology),
        ],
        "ports": [{"name": PORT_NAME, "containerPort": sim.port, "protocol": "TCP"}],
        "resources": container_resources(
            FORWARDER_CPUS, FORWARDER_MEMORY, cpu_limit=sim.cpu_limits
        ),
        "readinessProbe": {"tcpSocket": {"port": sim.port}, "periodSeconds": PROBE_PERIOD_S},
        "securityContext": pod_security.container_context(
            pod_security.NOBODY_UID, pod_security.NOBODY_UID
        ),
    }


def pod_volumes(topology: Topology) -> list[dict[str, Any]]:
    return [volume.pod_volume(topology)] if topology.uses_executables else []


def add_tls_server(topology: Topology, pod_spec: dict[str, Any]) -> None:
    """Gives the container that serves the game's port to env runners its TLS files."""
    if topology.game_tls_server is None:
        return
    name = FORWARDER_NAME if topology.game_tls_server == "forwarder" else CONTAINER_NAME
    containers = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    game_tls.add_server(topology, pod_spec, next(c for c in containers if c["name"] == name))


def startup_allowance_s(topology: Topology) -> float:
    """What the startup probe allows the game before restarting it (>= startup_timeout_s)."""
    return startup_failure_threshold(topology) * PROBE_PERIOD_S


def games_timeout_s(topology: Topology) -> float:
    """How long `pulumi up` waits for the games: pull, then the startup probe's allowance."""
    return topology.image_pull_timeout_s + startup_allowance_s(topology)


def instance_names(topology: Topology) -> list[str]:
    """Networked game pods in ordinal order: discovery (ordinal 0) first, then 1..Y."""
    if topology.pattern != "networked":
        return []
    first = topology.ue_first_ordinal
    return [topology.ue_instance_name(i) for i in range(first, first + topology.ue_replicas)]


def _selector(topology: Topology) -> dict[str, str]:
    return {"app.kubernetes.io/instance": topology.name, "app.kubernetes.io/name": APP_NAME}


def _metadata(topology: Topology) -> dict[str, Any]:
    meta = metadata(topology, topology.ue_set_name, name=APP_NAME, component=COMPONENT)
    meta["annotations"] = await_annotations(games_timeout_s(topology))
    return meta


def statefulset(topology: Topology) -> K8sObject | None:
    if topology.pattern != "networked":
        return None
    pod_spec: dict[str, Any] = {"containers": [container(topology)]}
    if topology.forwards_game_port:
        pod_spec["containers"].append(forwarder(topology))
    init = volume.wait_for_build(topology)
    if init:
        pod_spec["initContainers"] = init
    volumes = pod_volumes(topology)
    if volumes:
        pod_spec["volumes"] = volumes
    add_tls_server(topology, pod_spec)
    placement.place(pod_spec, topology.simulator)
    spread = topology.simulator.topology_spread_constraints
    if spread:
        # A constraint counts the pods its selector matches: by default the stack's games.
        selector = {"labelSelector": {"matchLabels": _selector(topology)}}
        pod_spec["topologySpreadConstraints"] = [selector | copy.deepcopy(c) for c in spread]
    pod_security.restrict(pod_spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(topology),
        "spec": {
            "serviceName": topology.ue_set_name,
            # One pod per game (a game serves one client at a time); rescaling
            # adds or removes the highest ordinals, never renames one.
            "replicas": topology.ue_replicas,
            "ordinals": {"start": topology.ue_first_ordinal},
            # Start and replace all games at once, not one after another.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _selector(topology)},
            "template": {
                "metadata": placement.pod_metadata(
                    topology, topology.simulator, name=APP_NAME, component=COMPONENT
                ),
                "spec": pod_spec,
            },
        },
    }


def service(topology: Topology) -> K8sObject | None:
    """Headless: each ready game pod gets its own DNS name, no load balancing."""
    if topology.pattern != "networked":
        return None
    port = topology.simulator.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(topology),
        "spec": {
            "clusterIP": "None",
            "selector": _selector(topology),
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
