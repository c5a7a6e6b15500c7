#!/usr/bin/env python3
"""schola-probe HOST:PORT [TIMEOUT_S]: does a game's gRPC server answer? Exit 0 if so.

The game image's probe (docker/unreal-game.Dockerfile; `simulator.probe: grpc`), run by
the kubelet inside the game's container, so it reaches a game bound to loopback. It asks
the standard gRPC health service (grpc.health.v1.Health/Check, empty service name):
SERVING is healthy, any other status is not. A stock Schola build registers no health
service: its answer UNIMPLEMENTED still comes from a running gRPC server (HTTP/2, the
gRPC framing, a status), which is more than an open port shows, so it counts as
healthy too. No answer within the timeout, a refused connection or a peer that does not
speak gRPC is unhealthy (exit 1, the reason on stderr).
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

USAGE = "usage: schola-probe HOST:PORT [TIMEOUT_S]"


def check(target: str, timeout_s: float) -> str | None:
    """Why the game at `target` is not healthy; None when it is."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return None  # a gRPC server without the health service: Schola's own
            return f"{target}: {code.name}: {exc.details()}"  # type: ignore[attr-defined]
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        return f"{target}: the game says {status}"
    return None


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2 or ":" not in argv[0]:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        timeout_s = float(argv[1]) if len(argv) == 2 else 3.0
    except ValueError:
        print(f"{USAGE}: {argv[1]!r} is not a number of seconds", file=sys.stderr)
        return 2
    problem = check(argv[0], timeout_s)
    if problem is not None:
        print(f"schola-probe: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
