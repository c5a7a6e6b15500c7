"""The Ray image's Ray, torch and Python follow the topology and the venv."""

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


def test_dockerfile_base_is_a_build_arg_defaulting_to_the_topology_python() -> None:
    """No registry on the machines that build it: the base is BASE_IMAGE (build.py passes
    its debootstrap base); with Docker, python:<the topology's Python>-slim."""
    base = re.search(r"^FROM (\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert base and base.group(1) == "${BASE_IMAGE}"
    major, minor = PYTHON_TAG.removeprefix("py")[0], PYTHON_TAG.removeprefix("py")[1:]
    assert _default_arg("BASE_IMAGE") == f"python:{major}.{minor}-slim"


def test_default_ray_image_is_the_image_this_dockerfile_builds() -> None:
    assert RaySpec().image_ref == f"uerl/ray:{RAY_VERSION}-{PYTHON_TAG}-cpu"
