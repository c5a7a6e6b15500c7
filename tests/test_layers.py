"""The house: imports point down, the contract says so, and the docs draw the same layers."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

from host_speed import guard

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _contract(contract_id: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c.get("id") == contract_id]
    return contract


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=guard(300),
    )


def test_the_import_contracts_are_kept() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_import_pointing_up_fails_naming_the_line(tmp_path: Path) -> None:
    for part in ("training", "infra"):
        shutil.copytree(
            ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", ".venv")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    errors = tmp_path / "training" / "protocol" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom training.run import driver  # noqa\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1
    assert "training.protocol.errors -> training.run.driver" in result.stdout
    assert "BROKEN" in result.stdout


def test_infra_importing_training_fails(tmp_path: Path) -> None:
    for part in ("training", "infra"):
        shutil.copytree(
            ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", ".venv")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    topology = tmp_path / "infra" / "topology" / "model.py"
    topology.write_text(topology.read_text() + "\nimport training.protocol.errors  # noqa\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1
    assert "infra.topology.model -> training.protocol.errors" in result.stdout


def test_training_importing_the_spec_fails(tmp_path: Path) -> None:
    for part in ("training", "infra"):
        shutil.copytree(
            ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", ".venv")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    driver = tmp_path / "training" / "run" / "driver.py"
    driver.write_text(driver.read_text() + "\nfrom infra.topology import GCS_PORT  # noqa\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1
    assert "training.run.driver -> infra.topology" in result.stdout


def test_the_docs_draw_the_contracts_layers() -> None:
    text = (ROOT / "docs" / "development.md").read_text()
    table = text.split("<!-- layers: training-layers -->", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    # The room cell: cells split on pipes that are not escaped (`\\|` joins rooms).
    rooms = [re.split(r"(?<!\\)\|", row)[2] for row in rows]
    drawn = [" | ".join(re.findall(r"`(training\.[a-z_]+)`", cell)) for cell in rooms]
    assert drawn == _contract("training-layers")["layers"]


# Names a tool requires: a package's, and the Pulumi program's and plugin's entry points.
REQUIRED_NAMES = {"__init__.py", "__main__.py"}


def test_no_two_modules_share_a_file_name() -> None:
    names = Counter(
        path.name
        for part in ("training", "infra")
        for path in (ROOT / part).rglob("*.py")
        if path.name not in REQUIRED_NAMES and "_generated" not in path.parts
    )
    assert [name for name, count in names.items() if count > 1] == []
