"""Space and point codec: every gymnasium space type both ways, single values and batches."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb

BOX_DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.bool_,
]

NESTED = gym.spaces.Dict(
    {
        "camera": gym.spaces.Box(0, 255, (4, 3, 2), np.uint8),
        "state": gym.spaces.Dict(
            {
                "pose": gym.spaces.Box(-np.inf, np.inf, (7,), np.float32),
                "mode": gym.spaces.Discrete(5),
                "flags": gym.spaces.MultiBinary(3),
                "gear": gym.spaces.MultiDiscrete([2, 3, 4]),
            }
        ),
    }
)

SPACES: dict[str, gym.Space] = {
    "box_1d": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    "box_3d_mixed_bounds": gym.spaces.Box(
        np.array([[[-np.inf, 0.0], [-2.0, -1.0]]], np.float32),
        np.array([[[np.inf, 1.0], [2.0, np.inf]]], np.float32),
    ),
    "box_float64": gym.spaces.Box(-5.0, 5.0, (2,), np.float64),
    "discrete": gym.spaces.Discrete(7),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 5, 2]),
    "multi_binary": gym.spaces.MultiBinary(6),
    "dict_nested": NESTED,
}


def _assert_values_equal(space: gym.Space, a: Any, b: Any) -> None:
    if isinstance(space, gym.spaces.Dict):
        assert set(a) == set(b) == set(space.spaces)
        for key, sub in space.spaces.items():
            _assert_values_equal(sub, a[key], b[key])
        return
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    assert a_arr.shape == b_arr.shape
    if a_arr.dtype.kind == "f":  # box values travel as float32
        a_arr = a_arr.astype(np.float32)
        b_arr = b_arr.astype(np.float32)
    np.testing.assert_array_equal(a_arr, b_arr)


@pytest.mark.parametrize("name", list(SPACES))
def test_space_round_trips_through_proto(name: str) -> None:
    space = SPACES[name]
    wire = pb.Space.FromString(codec.space_to_proto(space).SerializeToString())
    assert codec.space_from_proto(wire) == space


@pytest.mark.parametrize("dtype", BOX_DTYPES, ids=lambda d: np.dtype(d).name)
def test_box_space_round_trips_every_dtype(dtype: type) -> None:
    if np.dtype(dtype).kind == "b":
        space = gym.spaces.Box(0, 1, (2, 3), dtype)
    else:
        low = 0 if np.dtype(dtype).kind == "u" else -3
        space = gym.spaces.Box(low, 100, (2, 3), dtype)
    back = codec.space_from_proto(codec.space_to_proto(space))
    assert back == space
    assert back.dtype == np.dtype(dtype)


def test_box_space_keeps_infinite_bounds_as_float32_infinities() -> None:
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    msg = codec.space_to_proto(space)
    lows = [d.low for d in msg.box_space.dimensions]
    assert lows == [float("-inf")] * 4
    back = codec.space_from_proto(msg)
    assert np.all(np.isneginf(back.low)) and np.all(np.isposinf(back.high))


def test_full_range_integer_box_bounds_saturate_instead_of_overflowing() -> None:
    info = np.iinfo(np.int64)
    space = gym.spaces.Box(info.min, info.max, (2,), np.int64)
    back = codec.space_from_proto(codec.space_to_proto(space))
    assert back.low.tolist() == [info.min] * 2
    assert back.high.tolist() == [info.max] * 2


def test_box_space_dimensions_are_written_flattened_row_major() -> None:
    low = np.arange(6, dtype=np.float32).reshape(2, 3)
    space = gym.spaces.Box(low, low + 10)
    msg = codec.space_to_proto(space).box_space
    assert [d.low for d in msg.dimensions] == [0, 1, 2, 3, 4, 5]
    assert [d.high for d in msg.dimensions] == [10, 11, 12, 13, 14, 15]
    assert list(msg.shape_dimensions) == [2, 3]


def test_box_space_without_shape_dimensions_is_one_dimensional() -> None:
    msg = pb.Space()
    msg.box_space.dimensions.add(low=-1, high=1)
    msg.box_space.dimensions.add(low=0, high=2)
    assert codec.space_from_proto(msg) == gym.spaces.Box(
        np.array([-1, 0], np.float32), np.array([1, 2], np.float32)
    )


def test_scalar_box_travels_as_one_element_box() -> None:
    # The wire reads empty shape_dimensions as 1-D, so shape () comes back as (1,).
    back = codec.space_from_proto(codec.space_to_proto(gym.spaces.Box(-1.0, 1.0, ())))
    assert back == gym.spaces.Box(-1.0, 1.0, (1,))


def test_box_space_zero_bounds_omitted_on_the_wire_decode_as_zero() -> None:
    # A C++ game omits float fields equal to 0 (proto3 defaults).
    msg = pb.Space()
    msg.box_space.dimensions.add(high=1)
    msg.box_space.dimensions.add(low=-1)
    back = codec.space_from_proto(msg)
    assert back.low.tolist() == [0, -1] and back.high.tolist() == [1, 0]


@pytest.mark.parametrize("name", list(SPACES))
def test_point_round_trips_through_proto(name: str) -> None:
    space = SPACES[name]
    space.seed(1)
    value = space.sample()
    wire = pb.Point.FromString(codec.value_to_point(space, value).SerializeToString())
    back = codec.point_to_value(space, wire)
    _assert_values_equal(space, value, back)
    assert space.contains(back)


@pytest.mark.parametrize("dtype", BOX_DTYPES, ids=lambda d: np.dtype(d).name)
def test_box_point_decodes_to_the_space_dtype(dtype: type) -> None:
    kind = np.dtype(dtype).kind
    space = (
        gym.spaces.Box(0, 1, (3, 2), dtype)
        if kind == "b"
        else gym.spaces.Box(0, 100, (3, 2), dtype)
    )
    value = space.sample()
    back = codec.point_to_value(space, codec.value_to_point(space, value))
    assert back.dtype == np.dtype(dtype)
    assert back.shape == (3, 2)
    # Box values travel as float32 (the protocol), so float64 keeps float32 precision.
    expected = value.astype(np.float32).astype(dtype) if kind == "f" else value
    np.testing.assert_array_equal(back, expected)


def test_box_point_carries_dtype_and_shape() -> None:
    space = gym.spaces.Box(0, 255, (2, 2), np.uint8)
    point = codec.value_to_point(space, np.full((2, 2), 7, np.uint8))
    assert point.box_point.dtype == pb.UINT8
    assert list(point.box_point.shape) == [2, 2]
    assert list(point.box_point.values) == [7.0] * 4


def test_dict_space_keys_are_sorted_whatever_the_wire_order() -> None:
    msg = pb.Space()
    msg.dict_space.spaces["zeta"].discrete_space.high = 2
    msg.dict_space.spaces["alpha"].discrete_space.high = 3
    assert list(codec.space_from_proto(msg).spaces) == ["alpha", "zeta"]


@pytest.mark.parametrize("name", list(SPACES))
def test_batch_of_points_round_trips(name: str) -> None:
    space = SPACES[name]
    space.seed(2)
    values = [space.sample() for _ in range(5)]
    batch = gym.vector.utils.concatenate(
        space, values, gym.vector.utils.create_empty_array(space, 5)
    )
    points = [pb.Point() for _ in range(5)]
    codec.batch_to_points(space, batch, points)
    for value, point in zip(values, points, strict=True):
        _assert_values_equal(space, value, codec.point_to_value(space, point))
    _assert_values_equal(space, batch, codec.points_to_batch(space, points))


def test_json_form_round_trips_infinite_bounds_and_nesting() -> None:
    import json

    text = json.dumps(codec.space_to_json(NESTED))
    assert codec.space_from_json(json.loads(text)) == NESTED
    box = codec.space_to_json(gym.spaces.Box(-np.inf, np.inf, (1,)))
    assert box["boxSpace"]["dimensions"][0] == {"low": "-Infinity", "high": "Infinity"}


def test_point_with_wrong_number_of_values_names_the_path() -> None:
    space = gym.spaces.Dict({"pose": gym.spaces.Box(-1, 1, (3,))})
    point = pb.Point()
    point.dict_point.values["pose"].box_point.values.extend([0.0, 0.0])
    with pytest.raises(codec.CodecError, match=r"\['pose'\]: expected 3 values"):
        codec.point_to_value(space, point)


def test_point_of_the_wrong_kind_is_rejected() -> None:
    point = pb.Point()
    point.discrete_point.value = 1
    with pytest.raises(codec.CodecError, match="expected a box_point"):
        codec.point_to_value(gym.spaces.Box(-1, 1, (1,)), point)


def test_dict_point_missing_a_key_is_rejected() -> None:
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)})
    point = pb.Point()
    point.dict_point.values["a"].discrete_point.value = 1
    with pytest.raises(codec.CodecError, match="missing key 'b'"):
        codec.point_to_value(space, point)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Tuple((gym.spaces.Discrete(2),)),
        gym.spaces.Discrete(3, start=1),
        gym.spaces.MultiBinary((2, 2)),
        gym.spaces.MultiDiscrete([[2, 2], [2, 2]]),
    ],
    ids=["tuple", "discrete_with_start", "multibinary_2d", "multidiscrete_2d"],
)
def test_spaces_without_a_wire_form_are_refused(space: gym.Space) -> None:
    with pytest.raises(codec.CodecError):
        codec.space_to_proto(space)
