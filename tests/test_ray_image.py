"""The Ray image's base tag follows the Ray version the topology and the venv use."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from infra.topology import PYTHON_TAG, RAY_VERSION, RaySpec

DOCKERFILE = Path(__file__).resolve().parents[1] / "docker" / "ray.Dockerfile"


def _default_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"{DOCKERFILE} has no default for ARG {name}"
    return match.group(1)


def test_dockerfile_ray_version_is_the_topology_ray_version() -> None:
    assert _default_arg("RAY_VERSION") == RAY_VERSION


def test_dockerfile_ray_version_is_the_installed_ray() -> None:
    assert _default_arg("RAY_VERSION") == version("ray")


def test_dockerfile_torch_version_is_the_installed_torch() -> None:
    assert _default_arg("TORCH_VERSION") == version("torch").split("+")[0]


def test_dockerfile_base_is_rayproject_ray_for_the_topology_python() -> None:
    base = re.search(r"^FROM (\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert base and base.group(1) == f"rayproject/ray:${{RAY_VERSION}}-{PYTHON_TAG}-cpu"


def test_default_ray_image_is_the_image_this_dockerfile_builds() -> None:
    assert RaySpec().image_ref == f"uerl/ray:{RAY_VERSION}-{PYTHON_TAG}-cpu"
