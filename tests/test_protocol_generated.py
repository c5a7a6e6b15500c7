"""The committed generated code matches the .proto, and the .proto matches Schola's wire layout."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from training.protocol._generated import schola_gym_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "training" / "protocol" / "_generated"


def _load_generator():
    path = ROOT / "protos" / "generate.py"
    spec = importlib.util.spec_from_file_location("uerl_protos_generate", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_regenerating_the_protos_reproduces_the_committed_code(tmp_path: Path) -> None:
    generator = _load_generator()
    written = generator.generate(tmp_path)
    names = sorted(p.name for p in written)
    committed = sorted(p.name for p in GENERATED.iterdir() if p.is_file())
    assert names == committed
    for name in names:
        assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), (
            f"{name} is stale: run `python protos/generate.py`"
        )


def test_service_methods_have_schola_http2_paths() -> None:
    service = pb.DESCRIPTOR.services_by_name["GymService"]
    assert service.full_name == "Schola.GymService"
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert methods == {
        "StartGymConnector": ("GymConnectorStartRequest", "GymConnectorStartResponse"),
        "RequestTrainingDefinition": ("TrainingDefinitionRequest", "TrainingDefinition"),
        "UpdateState": ("StateUpdate", "State"),
    }


def _fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (pb.BoxSpace, {"dimensions": 1, "shape_dimensions": 2, "dtype": 3}),
        (pb.BoxPoint, {"values": 1, "dtype": 2, "shape": 3}),
        (
            pb.Space,
            {
                "box_space": 1,
                "discrete_space": 2,
                "multi_discrete_space": 3,
                "multi_binary_space": 4,
                "dict_space": 5,
            },
        ),
        (
            pb.Point,
            {
                "box_point": 1,
                "discrete_point": 2,
                "multi_discrete_point": 3,
                "multi_binary_point": 4,
                "dict_point": 5,
            },
        ),
        (pb.AgentDefinition, {"obs_space": 1, "action_space": 2, "agent_type": 3}),
        (pb.StateUpdate, {"reset": 1, "step": 2, "status": 3}),
        (pb.EnvironmentSettings, {"seed": 1, "options": 2}),
        (
            pb.AgentState,
            {"observations": 1, "reward": 2, "terminated": 3, "truncated": 4, "info": 5},
        ),
        (pb.InitialAgentState, {"observations": 1, "info": 4}),
        (pb.State, {"training_state": 1, "initial_state": 2}),
    ],
)
def test_message_field_numbers_match_schola(message: type, expected: dict[str, int]) -> None:
    assert _fields(message) == expected


def test_state_has_two_separate_oneofs_so_both_parts_can_be_set() -> None:
    oneofs = {o.name: [f.name for f in o.fields] for o in pb.State.DESCRIPTOR.oneofs}
    assert oneofs == {
        "optional_training_state": ["training_state"],
        "optional_initial_state": ["initial_state"],
    }
    state = pb.State()
    state.training_state.SetInParent()
    state.initial_state.SetInParent()
    assert state.HasField("training_state") and state.HasField("initial_state")


def test_status_is_outside_the_update_oneof() -> None:
    (oneof,) = pb.StateUpdate.DESCRIPTOR.oneofs
    assert oneof.name == "update"
    assert [f.name for f in oneof.fields] == ["reset", "step"]


def test_enum_values_match_schola() -> None:
    assert dict(pb.DType.items()) == {
        "FLOAT32": 0,
        "UINT8": 1,
        "UINT16": 2,
        "UINT32": 3,
        "UINT64": 4,
        "INT8": 5,
        "INT16": 6,
        "INT32": 7,
        "INT64": 8,
        "FLOAT16": 9,
        "FLOAT64": 10,
        "BOOL": 11,
    }
    assert dict(pb.AutoResetType.items()) == {"SAME_STEP": 0, "NEXT_STEP": 1, "DISABLED": 2}
    assert dict(pb.CommunicatorStatus.items()) == {"GOOD": 0, "ERROR": 1, "CLOSED": 2}


def test_map_keys_have_the_protocol_types() -> None:
    reset_entry = pb.Reset.DESCRIPTOR.fields_by_name["environments"].message_type
    reset_key = reset_entry.fields_by_name["key"]
    initial_key = pb.InitialState.DESCRIPTOR.fields_by_name[
        "environment_states"
    ].message_type.fields_by_name["key"]
    assert reset_key.type == reset_key.TYPE_INT32
    assert initial_key.type == initial_key.TYPE_INT32


def test_box_values_and_rewards_travel_as_float32() -> None:
    values = pb.BoxPoint.DESCRIPTOR.fields_by_name["values"]
    reward = pb.AgentState.DESCRIPTOR.fields_by_name["reward"]
    assert values.type == values.TYPE_FLOAT
    assert reward.type == reward.TYPE_FLOAT
