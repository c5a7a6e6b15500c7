"""`make images` builds the images a dev stack runs, tagged as the topology's defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra_fixtures import PROJECT_ROOT

from infra.topology import SIMULATOR_DEFAULTS, Topology


def test_make_images_builds_the_default_ray_and_mock_game_tags() -> None:
    venv_bin = Path(sys.executable).parent
    proc = subprocess.run(
        # -n: print the commands; the empty stamps skip the set-up prerequisites.
        ["make", "-n", "images", f"BIN={venv_bin}", "STAMP=", "NATIVE_STAMP="],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    builds = [line for line in proc.stdout.splitlines() if " build " in line]
    assert builds == [
        f"docker build -f docker/ray.Dockerfile -t {Topology().ray.image_ref} .",
        f"docker build -f docker/mock-ue.Dockerfile -t {SIMULATOR_DEFAULTS['mock']['image']} .",
    ]
