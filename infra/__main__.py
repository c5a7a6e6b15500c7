"""The uerl Pulumi program: reads `uerl:topology` and makes one TrainingCluster of it
(infra/components/training_cluster.py), the component a team's own program can make too.

Pulumi runs this with runpy.run_path("infra/"), which puts infra/ itself (not
the project root) first on sys.path; the project is normally installed in the
venv, and the fallback below covers a venv where it is not.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

try:
    import infra  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra.components.training_cluster import TrainingCluster, parse_topology
from infra.topology import Topology

# The project root (Pulumi.yaml): Pulumi runs this program in infra/, but
# relative paths in the topology are the user's, relative to the project.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def load_topology() -> Topology:
    """The stack's topology; invalid config stops `pulumi preview` with one message."""
    try:
        raw = pulumi.Config("uerl").get_object("topology")
    except pulumi.ConfigTypeError as exc:
        raise pulumi.RunError(f"topology: not a valid structured config value: {exc}") from None
    return parse_topology(raw)


def main() -> None:
    topology = load_topology()
    cluster = TrainingCluster(topology.name, {"topology": topology}, project_root=PROJECT_ROOT)
    pulumi.export("endpoints", cluster.endpoints)


# When an update fails, the engine interrupts the program while it still waits on the
# failed resource's outputs; the default KeyboardInterrupt would print the language
# host's traceback under the real error. Everything the program had to say is sent.
signal.signal(signal.SIGINT, lambda *_: os._exit(1))
main()
