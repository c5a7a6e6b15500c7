"""The component package (infra/package): its schema comes from TrainingCluster's typed
arguments, which are generated from the topology's models, so the two cannot drift."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ProviderServicer

from infra.components._generated import topology_args
from infra.components.training_cluster import TYPE, TrainingCluster
from infra.package import generate
from infra.topology_reference import rows

PACKAGE = Path(__file__).resolve().parent.parent / "infra" / "package"


@cache
def schema() -> dict[str, Any]:
    return json.loads(ComponentProvider([TrainingCluster], "uerl").schema)


def test_the_generated_input_types_are_those_of_the_topology_as_it_is() -> None:
    # After a topology change: python -m infra.package.generate
    assert Path(topology_args.__file__).read_text() == generate.source()


def test_the_package_has_one_resource_the_training_cluster() -> None:
    assert list(schema()["resources"]) == [TYPE]


def test_its_input_is_the_topology_and_its_outputs_what_a_user_reads() -> None:
    resource = schema()["resources"][TYPE]
    assert resource["inputProperties"]["topology"]["$ref"] == "#/types/uerl:index:Topology"
    assert set(resource["properties"]) == {"endpoints", "namespace", "rayTokenSecret", "runsClaim"}


def _property(path: str) -> dict[str, Any]:
    """A topology field's schema property by the component's spelling of its path
    (`runs.claim.keepOnDestroy`), as the topology reference gives it."""
    types = schema()["types"]
    node: dict[str, Any] = types["uerl:index:Topology"]
    parts = path.replace("[]", "").split(".")
    for index, part in enumerate(parts):
        prop = node["properties"][part]
        if index == len(parts) - 1:
            return prop
        ref = prop.get("$ref") or prop.get("items", {}).get("$ref")
        node = types[ref.removeprefix("#/types/")]
    raise AssertionError(path)


def test_every_topology_field_is_an_input_property_spelled_as_the_reference_says() -> None:
    fields = rows()
    assert len(fields) > 150
    for row in fields:
        prop = _property(row.component_path)
        if row.comment:
            assert prop.get("description"), row.path


def test_number_and_switch_fields_keep_their_kinds() -> None:
    assert _property("workers.replicas")["type"] == "integer"
    assert _property("learners.cpus")["type"] == "number"
    assert _property("runs.claim.keepOnDestroy")["type"] == "boolean"
    assert _property("workers.nodeSelector")["additionalProperties"]["type"] == "string"


def test_the_plugin_runs_the_host_in_the_projects_virtualenv() -> None:
    plugin = yaml.safe_load((PACKAGE / "PulumiPlugin.yaml").read_text())
    assert plugin["runtime"]["name"] == "python"
    venv = (PACKAGE / plugin["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == (PACKAGE.parent.parent / ".venv").resolve()


def test_a_topology_the_component_refuses_is_an_input_error_of_one_line() -> None:
    # The host would wrap the RunError with its traceback (ComponentInitError).
    import runpy

    host = runpy.run_path(str(PACKAGE / "__main__.py"), run_name="uerl_package")
    provider = host["UerlProvider"]([TrainingCluster], "uerl", None, "0.0.0")
    bad = {"topology": {"workers": {"replicas": -1}}}
    with pytest.raises(pulumi.InputPropertiesError) as refused:
        provider.construct("rl", TYPE, bad, None)
    message = refused.value.message
    assert "topology.workers.replicas: Input should be greater than or equal to 0" in message
    assert "Traceback" not in message and 'File "' not in message
    (error,) = refused.value.errors or []
    assert error["property_path"] == "topology.workers.replicas"
    # The status Pulumi's provider server aborts with must carry them (else it fails
    # with an AttributeError in the message's place).
    status = ProviderServicer.create_grpc_invalid_properties_status(
        None, message, refused.value.errors
    )
    assert status.details == message and status.trailing_metadata


def test_the_kubeconfig_and_context_uerl_reaches_the_cluster_by_are_optional_inputs() -> None:
    resource = schema()["resources"][TYPE]
    for name in ("kubeconfig", "context"):
        assert resource["inputProperties"][name]["type"] == "string"
        assert resource["inputProperties"][name]["description"]
    assert "kubeconfig" not in resource.get("requiredInputs", [])


def test_a_refused_kubeconfig_is_an_input_error_at_that_input() -> None:
    import runpy

    host = runpy.run_path(str(PACKAGE / "__main__.py"), run_name="uerl_package")
    provider = host["UerlProvider"]([TrainingCluster], "uerl", None, "0.0.0")
    bad = {"topology": {}, "kubeconfig": "/nowhere/kubeconfig"}
    with pytest.raises(pulumi.InputPropertiesError) as refused:
        provider.construct("rl", TYPE, bad, None)
    assert refused.value.message == "kubeconfig: no such file /nowhere/kubeconfig"
    (error,) = refused.value.errors or []
    assert error == {"property_path": "kubeconfig", "reason": "no such file /nowhere/kubeconfig"}
