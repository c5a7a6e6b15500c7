"""Where `uerl train` gets the endpoints object from, in order.

1. `--endpoints FILE`: `pulumi stack output endpoints --json`, or the whole
   `pulumi stack output --json`.
2. The ConfigMap the Pulumi program mounts on the Ray head.
3. Otherwise an error that says how to provide it.
"""

from __future__ import annotations

from pathlib import Path

from infra.endpoints import HEAD_ENDPOINTS_PATH, Endpoints, EndpointsError


def endpoints_file(path: str | Path | None, *, head_path: str | Path = HEAD_ENDPOINTS_PATH) -> Path:
    """The file the endpoints come from; a running training re-reads it to follow a
    rescale (on the head a ConfigMap the kubelet updates in place)."""
    if path is not None:
        return Path(path)
    if Path(head_path).is_file():
        return Path(head_path)
    raise EndpointsError(
        "no endpoints object: pass --endpoints FILE, written with\n"
        "  pulumi stack output endpoints --json > endpoints.json\n"
        f"or run on the Ray head, where the stack mounts it at {head_path}\n"
        "(e.g. `ray job submit --working-dir . -- uerl train`).\n"
        "To run everything on this machine instead: `uerl local`."
    )


def load_endpoints(
    path: str | Path | None, *, head_path: str | Path = HEAD_ENDPOINTS_PATH
) -> Endpoints:
    return Endpoints.from_file(endpoints_file(path, head_path=head_path))
