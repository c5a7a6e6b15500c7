"""Conversion between Schola's protocol spaces/points and gymnasium spaces/numpy values.

Everything element-wise is done in bulk: numeric payloads go through numpy and
protobuf's repeated-field `extend`/`np.asarray`/`np.fromiter` (C-level iteration),
never through a Python loop per element. The only Python-level loops are over
the protocol's own structure (Dict keys, environments of a batch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

import gymnasium as gym
import numpy as np
from google.protobuf import json_format

from training.protocol._generated import schola_gym_pb2 as pb

# Wire enum <-> numpy dtype. The wire carries box values as float32 regardless.
DTYPE_TO_NUMPY: dict[int, np.dtype] = {
    pb.FLOAT32: np.dtype(np.float32),
    pb.UINT8: np.dtype(np.uint8),
    pb.UINT16: np.dtype(np.uint16),
    pb.UINT32: np.dtype(np.uint32),
    pb.UINT64: np.dtype(np.uint64),
    pb.INT8: np.dtype(np.int8),
    pb.INT16: np.dtype(np.int16),
    pb.INT32: np.dtype(np.int32),
    pb.INT64: np.dtype(np.int64),
    pb.FLOAT16: np.dtype(np.float16),
    pb.FLOAT64: np.dtype(np.float64),
    pb.BOOL: np.dtype(np.bool_),
}
NUMPY_TO_DTYPE: dict[np.dtype, int] = {v: k for k, v in DTYPE_TO_NUMPY.items()}

# One BoxSpace.dimensions entry as raw wire bytes: field 1 (len-delimited, 10 bytes)
# holding float field 1 (low) and float field 2 (high). Lets numpy write all
# dimensions at once instead of constructing one message per element.
_DIMENSION_WIRE = np.dtype(
    [
        ("tag", "u1"),
        ("length", "u1"),
        ("low_tag", "u1"),
        ("low", "<f4"),
        ("high_tag", "u1"),
        ("high", "<f4"),
    ]
)
_GET_LOW = attrgetter("low")
_GET_HIGH = attrgetter("high")


class CodecError(ValueError):
    """A space or point cannot be converted; the message says where (`path`) and why."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"{path}: {detail}" if path else detail)


# ---------------------------------------------------------------------------- spaces


def space_to_proto(space: gym.Space, out: pb.Space | None = None, path: str = "") -> pb.Space:
    """Encode a gymnasium space (Box, Discrete, MultiDiscrete, MultiBinary, Dict)."""
    msg = pb.Space() if out is None else out
    if isinstance(space, gym.spaces.Box):
        _box_space_to_proto(space, msg.box_space, path)
    elif isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise CodecError(path, f"Discrete with start={space.start} has no wire form")
        msg.discrete_space.high = int(space.n)
    elif isinstance(space, gym.spaces.MultiDiscrete):
        if space.nvec.ndim != 1 or np.any(space.start != 0):
            raise CodecError(path, "only 1-D MultiDiscrete starting at 0 has a wire form")
        msg.multi_discrete_space.SetInParent()
        msg.multi_discrete_space.high.extend(space.nvec.astype(np.int64).tolist())
    elif isinstance(space, gym.spaces.MultiBinary):
        if len(space.shape) != 1:
            raise CodecError(path, f"MultiBinary of shape {space.shape} has no wire form")
        msg.multi_binary_space.shape = int(space.shape[0])
    elif isinstance(space, gym.spaces.Dict):
        msg.dict_space.SetInParent()
        for key, sub in space.spaces.items():
            space_to_proto(sub, msg.dict_space.spaces[key], f"{path}[{key!r}]")
    else:
        raise CodecError(path, f"unsupported space type {type(space).__name__}")
    return msg


def _box_space_to_proto(space: gym.spaces.Box, msg: pb.BoxSpace, path: str) -> None:
    if space.dtype not in NUMPY_TO_DTYPE:
        raise CodecError(path, f"Box dtype {space.dtype} has no wire form")
    n = int(np.prod(space.shape, dtype=np.int64))
    wire = np.empty(n, dtype=_DIMENSION_WIRE)
    wire["tag"] = 0x0A
    wire["length"] = 10
    wire["low_tag"] = 0x0D
    wire["high_tag"] = 0x15
    wire["low"] = space.low.astype(np.float32).ravel()
    wire["high"] = space.high.astype(np.float32).ravel()
    msg.MergeFromString(wire.tobytes())
    msg.shape_dimensions.extend(list(space.shape))
    msg.dtype = NUMPY_TO_DTYPE[space.dtype]


def space_from_proto(msg: pb.Space, path: str = "") -> gym.Space:
    """Decode a protocol space into the equivalent gymnasium space."""
    kind = msg.WhichOneof("space")
    if kind == "box_space":
        return _box_space_from_proto(msg.box_space, path)
    if kind == "discrete_space":
        if msg.discrete_space.high <= 0:
            raise CodecError(path, f"Discrete space with n={msg.discrete_space.high}")
        return gym.spaces.Discrete(int(msg.discrete_space.high))
    if kind == "multi_discrete_space":
        return gym.spaces.MultiDiscrete(np.asarray(msg.multi_discrete_space.high, np.int64))
    if kind == "multi_binary_space":
        return gym.spaces.MultiBinary(int(msg.multi_binary_space.shape))
    if kind == "dict_space":
        # Map order is unspecified on the wire; sort for a deterministic space.
        items = sorted(msg.dict_space.spaces.items())
        return gym.spaces.Dict({k: space_from_proto(v, f"{path}[{k!r}]") for k, v in items})
    raise CodecError(path, "Space message has no space set")


def _box_space_from_proto(msg: pb.BoxSpace, path: str) -> gym.spaces.Box:
    dtype = DTYPE_TO_NUMPY.get(msg.dtype)
    if dtype is None:
        raise CodecError(path, f"unknown Box dtype enum {msg.dtype}")
    n = len(msg.dimensions)
    shape = tuple(msg.shape_dimensions) or (n,)
    if int(np.prod(shape, dtype=np.int64)) != n:
        raise CodecError(path, f"Box shape {shape} does not match {n} dimensions")
    low = np.fromiter(map(_GET_LOW, msg.dimensions), np.float32, count=n).reshape(shape)
    high = np.fromiter(map(_GET_HIGH, msg.dimensions), np.float32, count=n).reshape(shape)
    return gym.spaces.Box(_bounds_as(low, dtype), _bounds_as(high, dtype), shape, dtype)


def _bounds_as(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    # Integer bounds travel as float32: saturate instead of overflowing (e.g. int64 max
    # rounds up to 2**63 in float32, and infinities mean "unbounded").
    if dtype.kind in "iu":
        return _saturating_int_cast(values, dtype)
    if dtype.kind == "b":
        return values.astype(np.bool_)
    return values.astype(dtype)


def _saturating_int_cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    as64 = np.rint(values.astype(np.float64))
    with np.errstate(invalid="ignore"):  # out-of-range lanes are overwritten just below
        out = np.clip(as64, info.min, info.max).astype(dtype)
    out[as64 >= float(info.max)] = info.max
    out[as64 <= float(info.min)] = info.min
    return out


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A JSON-able dict for a space (protobuf JSON mapping; infinities become "Infinity")."""
    return json_format.MessageToDict(space_to_proto(space))


def space_from_json(data: Mapping[str, Any]) -> gym.Space:
    return space_from_proto(json_format.ParseDict(data, pb.Space()))


# ---------------------------------------------------------------------------- points


def value_to_point(
    space: gym.Space, value: Any, out: pb.Point | None = None, path: str = ""
) -> pb.Point:
    """Encode one value of `space` (numpy array, int, dict...) into a Point."""
    msg = pb.Point() if out is None else out
    if isinstance(space, gym.spaces.Box):
        arr = np.asarray(value)
        if arr.size != _size(space):
            raise CodecError(path, f"expected {_size(space)} values for {space}, got {arr.size}")
        box = msg.box_point
        box.values.extend(arr.astype(np.float32, copy=False).ravel().tolist())
        box.dtype = NUMPY_TO_DTYPE[space.dtype]
        box.shape.extend(space.shape)
    elif isinstance(space, gym.spaces.Discrete):
        msg.discrete_point.value = int(value)
    elif isinstance(space, gym.spaces.MultiDiscrete):
        arr = np.asarray(value)
        if arr.size != space.nvec.size:
            raise CodecError(path, f"expected {space.nvec.size} values, got {arr.size}")
        msg.multi_discrete_point.SetInParent()
        msg.multi_discrete_point.values.extend(arr.astype(np.int64).ravel().tolist())
    elif isinstance(space, gym.spaces.MultiBinary):
        arr = np.asarray(value)
        if arr.size != space.n:
            raise CodecError(path, f"expected {space.n} values, got {arr.size}")
        msg.multi_binary_point.SetInParent()
        msg.multi_binary_point.values.extend(arr.astype(np.bool_).ravel().tolist())
    elif isinstance(space, gym.spaces.Dict):
        if not isinstance(value, Mapping):
            raise CodecError(path, f"expected a mapping for a Dict space, got {type(value)}")
        msg.dict_point.SetInParent()
        values = msg.dict_point.values
        for key, sub in space.spaces.items():
            if key not in value:
                raise CodecError(path, f"missing key {key!r}")
            value_to_point(sub, value[key], values[key], f"{path}[{key!r}]")
    else:
        raise CodecError(path, f"unsupported space type {type(space).__name__}")
    return msg


_KIND = {
    gym.spaces.Box: "box_point",
    gym.spaces.Discrete: "discrete_point",
    gym.spaces.MultiDiscrete: "multi_discrete_point",
    gym.spaces.MultiBinary: "multi_binary_point",
    gym.spaces.Dict: "dict_point",
}


def _check_kind(space: gym.Space, point: pb.Point, path: str) -> None:
    expected = _KIND.get(type(space))
    if expected is None:
        raise CodecError(path, f"unsupported space type {type(space).__name__}")
    got = point.WhichOneof("point")
    if got != expected:
        raise CodecError(path, f"expected a {expected} for {space}, got {got or 'nothing'}")


def point_to_value(space: gym.Space, point: pb.Point, path: str = "") -> Any:
    """Decode a Point into a value of `space` (numpy array, np.int64 or dict)."""
    _check_kind(space, point, path)
    if isinstance(space, gym.spaces.Box):
        values = point.box_point.values
        if len(values) != _size(space):
            raise CodecError(path, f"expected {_size(space)} values for {space}, got {len(values)}")
        return _as_dtype(np.asarray(values, np.float32), space.dtype).reshape(space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(point.discrete_point.value)
    if isinstance(space, gym.spaces.MultiDiscrete):
        values = point.multi_discrete_point.values
        if len(values) != space.nvec.size:
            raise CodecError(path, f"expected {space.nvec.size} values, got {len(values)}")
        return np.asarray(values, space.dtype).reshape(space.shape)
    if isinstance(space, gym.spaces.MultiBinary):
        values = point.multi_binary_point.values
        if len(values) != space.n:
            raise CodecError(path, f"expected {space.n} values, got {len(values)}")
        return np.asarray(values, space.dtype)
    entries = point.dict_point.values
    out: dict[str, Any] = {}
    for key, sub in space.spaces.items():
        if key not in entries:
            raise CodecError(path, f"missing key {key!r}")
        out[key] = point_to_value(sub, entries[key], f"{path}[{key!r}]")
    return out


def _size(space: gym.spaces.Box) -> int:
    return math.prod(space.shape)  # np.prod costs microseconds per call on the hot path


def _as_dtype(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if values.dtype == dtype:
        return values
    if dtype.kind in "iu":
        if dtype.itemsize <= 2:  # float32 represents every 8/16-bit integer exactly
            return np.rint(values).astype(dtype)
        return _saturating_int_cast(values, dtype)
    return values.astype(dtype)


# ---------------------------------------------------------------------------- batches
# The same conversions for N environments at once (first axis = environment): the
# numeric work happens once per batch, the Python loop only once per environment.


def batch_to_points(
    space: gym.Space, batch: Any, points: Sequence[pb.Point], path: str = ""
) -> None:
    """Fill `points[i]` with `batch[i]` (a stacked array, or a dict of them for Dict)."""
    n = len(points)
    if isinstance(space, gym.spaces.Box):
        rows = np.asarray(batch).astype(np.float32, copy=False).reshape(n, -1)
        if rows.shape[1] != _size(space):
            raise CodecError(path, f"expected {_size(space)} values per row, got {rows.shape[1]}")
        dtype, shape = NUMPY_TO_DTYPE[space.dtype], list(space.shape)
        for point, row in zip(points, rows.tolist(), strict=True):
            box = point.box_point
            box.values.extend(row)
            box.dtype = dtype
            box.shape.extend(shape)
    elif isinstance(space, gym.spaces.Discrete):
        for point, value in zip(points, np.asarray(batch).reshape(n).tolist(), strict=True):
            point.discrete_point.value = value
    elif isinstance(space, gym.spaces.MultiDiscrete):
        rows = np.asarray(batch).astype(np.int64).reshape(n, -1).tolist()
        for point, row in zip(points, rows, strict=True):
            point.multi_discrete_point.SetInParent()
            point.multi_discrete_point.values.extend(row)
    elif isinstance(space, gym.spaces.MultiBinary):
        rows = np.asarray(batch).astype(np.bool_).reshape(n, -1).tolist()
        for point, row in zip(points, rows, strict=True):
            point.multi_binary_point.SetInParent()
            point.multi_binary_point.values.extend(row)
    elif isinstance(space, gym.spaces.Dict):
        for point in points:
            point.dict_point.SetInParent()
        for key, sub in space.spaces.items():
            subs = [p.dict_point.values[key] for p in points]
            batch_to_points(sub, batch[key], subs, f"{path}[{key!r}]")
    else:
        raise CodecError(path, f"unsupported space type {type(space).__name__}")


def points_to_batch(space: gym.Space, points: Sequence[pb.Point], path: str = "") -> Any:
    """Decode N points into one stacked array (or a dict of them for Dict)."""
    n = len(points)
    for point in points:
        _check_kind(space, point, path)
    if isinstance(space, gym.spaces.Box):
        size = _size(space)
        flat = np.fromiter(chain.from_iterable(p.box_point.values for p in points), np.float32)
        if flat.size != n * size:
            raise CodecError(path, f"expected {size} values per point for {space}")
        return _as_dtype(flat, space.dtype).reshape((n, *space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return np.fromiter((p.discrete_point.value for p in points), np.int64, count=n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        flat = np.fromiter(
            chain.from_iterable(p.multi_discrete_point.values for p in points), np.int64
        )
        if flat.size != n * space.nvec.size:
            raise CodecError(path, f"expected {space.nvec.size} values per point")
        return flat.astype(space.dtype).reshape((n, *space.shape))
    if isinstance(space, gym.spaces.MultiBinary):
        flat = np.fromiter(
            chain.from_iterable(p.multi_binary_point.values for p in points), np.bool_
        )
        if flat.size != n * space.n:
            raise CodecError(path, f"expected {space.n} values per point")
        return flat.astype(space.dtype).reshape((n, space.n))
    out: dict[str, Any] = {}
    for key, sub in space.spaces.items():
        subs = []
        for p in points:
            if key not in p.dict_point.values:
                raise CodecError(path, f"missing key {key!r}")
            subs.append(p.dict_point.values[key])
        out[key] = points_to_batch(sub, subs, f"{path}[{key!r}]")
    return out


def stack_values(space: gym.Space, values: Sequence[Any]) -> Any:
    """Stack per-environment values into a batch (a dict of batches for Dict spaces)."""
    if isinstance(space, gym.spaces.Dict):
        return {key: stack_values(sub, [v[key] for v in values]) for key, sub in space.items()}
    if isinstance(space, gym.spaces.Discrete):
        return np.fromiter(values, np.int64, count=len(values))
    return np.stack([np.asarray(v) for v in values])


def batch_rows(space: gym.Space, batch: Any, count: int) -> list[Any]:
    """Split a batch back into `count` per-environment values (views, no copies)."""
    if isinstance(space, gym.spaces.Dict):
        columns = {key: batch_rows(sub, batch[key], count) for key, sub in space.items()}
        return [{key: col[k] for key, col in columns.items()} for k in range(count)]
    return list(batch)
