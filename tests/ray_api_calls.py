"""Calls to a Ray head's job API and GCS, for the checks that a token is asked for (on a
local head and on a stack's pods)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any


def http_status(url: str, headers: dict[str, str], *, timeout_s: float = 30) -> int | None:
    """The answer's status, an error status included; None when nothing answers."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None  # nothing listening (yet)


def gcs_nodes(address: str, token: str | None = None, *, timeout_s: float = 30) -> list[Any]:
    """The GCS's node table, asked with the token as Ray's clients send it (or without one);
    a refusal raises grpc.RpcError with the GCS's status."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    bearer = (("authorization", f"Bearer {token}"),) if token is not None else None
    with grpc.insecure_channel(address) as channel:
        nodes = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        request = gcs_service_pb2.GetAllNodeInfoRequest()
        return list(
            nodes.GetAllNodeInfo(request, timeout=timeout_s, metadata=bearer).node_info_list
        )
