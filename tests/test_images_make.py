"""`make images` builds the images a dev stack runs, tagged as the topology's defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from host_speed import guard
from infra_fixtures import PROJECT_ROOT

from infra.topology import SIMULATOR_DEFAULTS, RaySpec, Topology


def _make_n(target: str) -> list[str]:
    venv_bin = Path(sys.executable).parent
    proc = subprocess.run(
        # -n: print the commands; the empty stamps skip the set-up prerequisites.
        ["make", "-n", target, f"BIN={venv_bin}", "STAMP=", "NATIVE_STAMP="],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in proc.stdout.splitlines() if "images/build.py" in line]


def test_make_images_builds_the_cpu_and_cuda_ray_images_and_the_mock_game() -> None:
    """With Docker: build.py stages the contexts (the Ray images' hold the native wheel)
    and runs `docker build` on the same Dockerfiles, tagged as the topology says: the CPU
    Ray image (the default `ray.image`) and the CUDA one for GPU learners."""
    (line,) = _make_n("images")
    only = line.split()[line.split().index("--only") + 1 :]
    proc = subprocess.run(
        [
            sys.executable,
            "tests/k8s/images/build.py",
            "--engine",
            "docker",
            "--dry-run",
            "--only",
            *only,
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    builds = [line.split() for line in proc.stdout.splitlines() if " build " in line]
    # The last word is the staged context directory (under the image cache).
    assert [" ".join(words[:-1]) for words in builds] == [
        f"docker build -f docker/ray.Dockerfile -t {Topology().ray.image_ref}"
        " --build-arg TORCH_CUDA=stub",
        f"docker build -f docker/ray.Dockerfile -t {RaySpec().built_image('cuda')}"
        " --build-arg TORCH_CUDA=pypi",
        f"docker build -f docker/mock-ue.Dockerfile -t {SIMULATOR_DEFAULTS['mock']['image']}",
    ]
    assert Topology().ray.image_ref.endswith("-py311-cpu")
    assert RaySpec().built_image("cuda").endswith("-py311-cuda")


def test_make_images_local_runs_the_engineless_build() -> None:
    (line,) = _make_n("images-local")
    assert line.split()[1:] == ["tests/k8s/images/build.py"]


def test_a_dry_run_does_not_wait_for_a_build_holding_the_image_cache(tmp_path: Path) -> None:
    """CI builds the images in the background while `make test` runs this file: the dry
    run reads nothing the build writes, so it must not queue behind it."""
    import fcntl

    cache = tmp_path / "images"
    cache.mkdir()
    with (cache / ".lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a build in progress
        proc = subprocess.run(
            [sys.executable, "tests/k8s/images/build.py", "--engine", "docker", "--dry-run",
             "--only", "mock-ue"],
            cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "UERL_IMAGE_CACHE": str(cache)},
            capture_output=True,
            text=True,
            timeout=guard(180),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "docker build -f docker/mock-ue.Dockerfile" in proc.stdout
