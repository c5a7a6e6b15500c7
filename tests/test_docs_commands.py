"""The commands the docs show that no other test runs, run as shown (`tests/doc_blocks.py`
checks each shown command's words are in the file that runs it)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from doc_blocks import PROJECT_ROOT
from host_speed import guard


def uerl(command: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    """`uerl ...` as the docs show it, through this interpreter's `training.cli`."""
    words = shlex.split(command)
    assert words[0] == "uerl"
    return subprocess.run(
        [sys.executable, "-m", "training.cli", *words[1:]],
        cwd=cwd, capture_output=True, text=True, timeout=guard(300),
    )  # fmt: skip


def kinds(manifest: str) -> list[str]:
    return [doc["kind"] for doc in yaml.safe_load_all(manifest) if doc]


def test_render_of_the_dev_stack_prints_its_objects() -> None:
    done = uerl("uerl render --stack dev")
    assert done.returncode == 0, done.stderr
    assert "RayCluster" in kinds(done.stdout)


def test_render_with_set_applies_the_config_paths() -> None:
    done = uerl(
        "uerl render --stack dev --set topology.workers.replicas=4 --set topology.pattern=networked"
    )
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    games = next(o for o in objects if o and o["kind"] == "StatefulSet")
    assert games["spec"]["replicas"] == 5  # 4 games and the discovery one


def test_render_of_a_topology_file(tmp_path: Path) -> None:
    (tmp_path / "my-topology.yaml").write_text(
        yaml.safe_dump({"workers": {"replicas": 3}, "simulator": {"kind": "mock"}})
    )
    done = uerl("uerl render --topology my-topology.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "RayCluster" in kinds(done.stdout)
