"""The games' TLS Secret (`simulator.tls`) in the pods: who mounts which of its keys.

Least privilege per container: the container serving TLS (the forwarder, or a mock
game) gets the certificate and key, plus the CA under mutual TLS; the Ray pods that
dial games (head: discovery and evaluation from the driver; env-runner workers) get
only the CA, plus the certificate and key under mutual TLS. The Secret's files are
world-readable in the pod (0444): its containers run as different users.
"""

from __future__ import annotations

from typing import Any

from infra.endpoints import GAME_TLS_MOUNT_DIR, TLS_CA_KEY, TLS_CERT_KEY, TLS_KEY_KEY, GameTLS
from infra.topology import Topology

SERVER_VOLUME = "uerl-game-tls-server"
CLIENT_VOLUME = "uerl-game-tls-client"
FILE_MODE = 0o444


def _volume(topology: Topology, name: str, keys: list[str]) -> dict[str, Any]:
    assert topology.simulator.tls is not None
    return {
        "name": name,
        "secret": {
            "secretName": topology.simulator.tls.secret,
            "items": [{"key": key, "path": key} for key in keys],
            "defaultMode": FILE_MODE,
        },
    }


def _mount(name: str) -> dict[str, Any]:
    return {"name": name, "mountPath": GAME_TLS_MOUNT_DIR, "readOnly": True}


def _mutual(topology: Topology) -> bool:
    return topology.simulator.tls is not None and topology.simulator.tls.mutual


def server_args(topology: Topology) -> list[str]:
    """Arguments of the forwarder or mock game that serves TLS (empty: no TLS)."""
    if topology.simulator.tls is None:
        return []
    files = GameTLS.in_directory(GAME_TLS_MOUNT_DIR, mutual=True)
    args = ["--tls-cert", str(files.cert_path), "--tls-key", str(files.key_path)]
    if _mutual(topology):
        args += ["--tls-client-ca", files.ca_path]
    return args


def add_server(topology: Topology, pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """Mounts what `container` needs to serve TLS (no-op without `simulator.tls`)."""
    if topology.simulator.tls is None:
        return
    keys = [TLS_CERT_KEY, TLS_KEY_KEY] + ([TLS_CA_KEY] if _mutual(topology) else [])
    pod_spec.setdefault("volumes", []).append(_volume(topology, SERVER_VOLUME, keys))
    container.setdefault("volumeMounts", []).append(_mount(SERVER_VOLUME))


def add_client(topology: Topology, pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """Mounts what `container` needs to dial games over TLS (no-op without it)."""
    if topology.simulator.tls is None:
        return
    keys = [TLS_CA_KEY] + ([TLS_CERT_KEY, TLS_KEY_KEY] if _mutual(topology) else [])
    pod_spec.setdefault("volumes", []).append(_volume(topology, CLIENT_VOLUME, keys))
    container.setdefault("volumeMounts", []).append(_mount(CLIENT_VOLUME))
