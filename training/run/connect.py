"""Connecting a run (training or evaluation) to Ray and the games it will use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.endpoints import Endpoints
from training.rllib.ray_output import RayConsole

if TYPE_CHECKING:
    from training.preflight.checks import PreflightReport


def connect(
    endpoints: Endpoints,
    console: RayConsole,
    *,
    timeout_s: float,
    ray_address: str | None,
    nodes_wait_s: float = 0.0,
) -> PreflightReport:
    """Preflight (Ray connected with the console's runtime env, resources and the
    discovery game checked), then the workers' output captured as the console says."""
    from training.preflight.checks import preflight  # imports Ray

    report = preflight(
        endpoints,
        timeout_s=timeout_s,
        ray_address=ray_address,
        runtime_env=console.runtime_env(ray_address or endpoints.ray.gcs_address),
        nodes_wait_s=nodes_wait_s,
    )
    console.capture_worker_output()
    return report
