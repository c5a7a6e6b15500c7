"""Process-level gRPC setting for lower per-RPC cost, applied before grpc is first imported.

Stepping a game is one small unary RPC after another, so per-call overhead dominates.
gRPC Python's EventEngine client/listener hand every call between more threads than
the classic epoll poller; disabling those two experiments cut CPU per unary RPC by
roughly a third on our 2-core benchmark machine (client and server side alike).

It only takes effect if grpc has not been imported yet in this process, and never
overrides an explicit GRPC_EXPERIMENTS (set it, even to "", to opt out).
"""

from __future__ import annotations

import os
import sys

LOW_LATENCY_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def apply_low_latency_defaults() -> bool:
    """Prefer the classic poller for this process; True if the setting was applied."""
    if "grpc" in sys.modules or "GRPC_EXPERIMENTS" in os.environ:
        return False
    os.environ["GRPC_EXPERIMENTS"] = LOW_LATENCY_EXPERIMENTS
    return True
