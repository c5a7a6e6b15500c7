"""Pulumi.yaml runs infra/ in the project venv; stack files hold only overrides."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import yaml
from infra_fixtures import PROJECT_ROOT, PULUMI_PROJECT_SCHEMA, dev_stack_topology

from infra.topology import Topology


def project() -> dict[str, Any]:
    return yaml.safe_load((PROJECT_ROOT / "Pulumi.yaml").read_text())


def test_pulumi_yaml_validates_against_pulumis_project_schema() -> None:
    schema = json.loads(PULUMI_PROJECT_SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema).validate(project())


def test_pulumi_yaml_runs_infra_with_the_project_virtualenv() -> None:
    p = project()
    assert p["name"] == "uerl" and p["main"] == "infra/"
    assert p["runtime"] == {
        "name": "python",
        "options": {"virtualenv": ".venv", "toolchain": "pip"},
    }
    assert (PROJECT_ROOT / "infra" / "__main__.py").is_file()


def test_dev_stack_holds_only_the_topology_key() -> None:
    config = yaml.safe_load((PROJECT_ROOT / "Pulumi.dev.yaml").read_text())["config"]
    assert set(config) == {"uerl:topology"}


def test_dev_stack_topology_is_valid_and_uses_the_mock_game() -> None:
    assert Topology.parse(dev_stack_topology()).simulator.kind == "mock"


def _overrides_only(value: Any, default: Any, path: str) -> list[str]:
    if isinstance(value, dict):
        return [
            p
            for k, v in value.items()
            for p in _overrides_only(v, getattr(default, k), f"{path}.{k}")
        ]
    return [path] if value == default else []


def test_dev_stack_sets_no_value_equal_to_its_default() -> None:
    assert _overrides_only(dev_stack_topology(), Topology(), "topology") == []
