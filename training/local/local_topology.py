"""The topology `uerl local` runs: a stack's `uerl:topology`, like `uerl render` reads it.

Reuses infra.render's loaders (pure Python, no Pulumi) so `uerl local --stack
dev --set topology.workers.replicas=3` and `uerl render` with the same flags
agree on the topology.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infra.render import RenderError, apply_sets, file_topology, stack_topology
from infra.topology import Topology, TopologyError

ROOT = "topology"


class StackConfigError(ValueError):
    """The stack or topology file is missing or invalid; the message names it."""


def load_topology(
    *,
    stack: str | None = "dev",
    topology_file: Path | None = None,
    sets: Sequence[str] = (),
    cwd: Path | None = None,
) -> Topology:
    """`topology_file` if given, else the stack's; then `--set` overrides; validated."""
    try:
        if topology_file is not None:
            data = file_topology(topology_file)
        elif stack is not None:
            data = stack_topology(stack, cwd or Path.cwd())
        else:
            data = {}
        return Topology.parse(apply_sets(data, sets), root=ROOT)
    except (RenderError, TopologyError) as exc:
        raise StackConfigError(str(exc)) from None
