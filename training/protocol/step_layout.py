"""The step path of a game, flat: per agent, its observation leaves and its action kind.

Both step codecs (`step_codec.PythonStepCodec` and the compiled
`training.clients.native.NativeStepCodec`) speak in these terms: actions go in as one
`ActionColumn` per agent, replies come out as one `AgentColumns` per agent, with
every leaf's values flat in the wire's element type. What a space means (shape,
dtype, Dict nesting) is applied here, once, for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from training.protocol import spaces as codec

# Leaf kinds; the compiled codec numbers them the same way (native/src/codec.rs).
BOX, DISCRETE, MULTI_DISCRETE, MULTI_BINARY = range(4)
POINT_FIELD = {
    BOX: "box_point",
    DISCRETE: "discrete_point",
    MULTI_DISCRETE: "multi_discrete_point",
    MULTI_BINARY: "multi_binary_point",
}
# The wire's element type of each kind's values, as the columns carry them.
WIRE_DTYPE = {
    BOX: np.dtype(np.float32),
    DISCRETE: np.dtype(np.int64),
    MULTI_DISCRETE: np.dtype(np.int64),
    MULTI_BINARY: np.dtype(np.bool_),
}


class WireError(ValueError):
    """A reply the layout does not fit; the message names the environment and agent."""


@dataclass(frozen=True)
class Leaf:
    """One non-Dict part of an observation: where it sits (Dict keys) and its size."""

    path: tuple[str, ...]
    kind: int
    size: int
    space: gym.Space

    @property
    def where(self) -> str:
        return "".join(f"['{key}']" for key in self.path)


class AgentColumns(NamedTuple):
    """One agent's part of a step reply: a row per environment it appeared in.
    (A tuple, in the compiled codec's order, so it crosses into Rust as is.)"""

    env: np.ndarray  # int32: environment index of each row, ascending
    reward: np.ndarray  # float32
    terminated: np.ndarray  # bool
    truncated: np.ndarray  # bool
    leaves: list[np.ndarray]  # flat, one per observation leaf, in WIRE_DTYPE
    infos: list[tuple[int, dict[str, str]]]  # (row, info) where the info is not empty


@dataclass(frozen=True)
class ActionColumn:
    """One agent's actions for a step: the environments it acts in and the values."""

    agent: int
    env: np.ndarray  # int32
    values: Any  # flat, float32 (Box) or int64; a stacked batch for Dict action spaces


def _kind(space: gym.Space) -> tuple[int, int]:
    if isinstance(space, gym.spaces.Box):
        return BOX, math.prod(space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return DISCRETE, 1
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MULTI_DISCRETE, int(space.nvec.size)
    if isinstance(space, gym.spaces.MultiBinary):
        return MULTI_BINARY, int(space.n)
    raise codec.CodecError("", f"unsupported space type {type(space).__name__}")


def leaves_of(space: gym.Space, path: tuple[str, ...] = ()) -> list[Leaf]:
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in leaves_of(sub, (*path, key))]
    kind, size = _kind(space)
    return [Leaf(path, kind, size, space)]


class StepLayout:
    """Agents in sorted order (the `agent` index of the columns), with their spaces."""

    def __init__(
        self, observation_spaces: Mapping[str, gym.Space], action_spaces: Mapping[str, gym.Space]
    ) -> None:
        self.agents = sorted(observation_spaces)
        self.index = {aid: k for k, aid in enumerate(self.agents)}
        self.observation_spaces = [observation_spaces[a] for a in self.agents]
        self.action_spaces = [action_spaces[a] for a in self.agents]
        self.leaves = [leaves_of(s) for s in self.observation_spaces]
        self.action_kinds = [
            None if isinstance(s, gym.spaces.Dict) else _kind(s) for s in self.action_spaces
        ]

    @property
    def flat_actions(self) -> bool:
        """Every action space is one leaf: what the compiled encoder takes."""
        return all(kind is not None for kind in self.action_kinds)

    def native(self) -> list[tuple[str, list[tuple[list[str], int, int]], Any]]:
        """The layout as `uerl_native.StepCodec` takes it."""
        out = []
        for aid, leaves, space, kind in zip(
            self.agents, self.leaves, self.action_spaces, self.action_kinds, strict=True
        ):
            action = None
            if kind is not None:
                box = isinstance(space, gym.spaces.Box)
                dtype = codec.NUMPY_TO_DTYPE[space.dtype] if box else 0
                action = (kind[0], kind[1], dtype, list(space.shape) if box else [])
            out.append((aid, [(list(leaf.path), leaf.kind, leaf.size) for leaf in leaves], action))
        return out

    def row_shapes(self) -> list[list[int] | None]:
        """Per agent, its observation's shape when it is one float32 Box: rows of such an
        agent need no Python (no cast, no nesting); None for every other space."""
        return [
            list(leaves[0].space.shape)
            if len(leaves) == 1
            and not leaves[0].path
            and leaves[0].kind == BOX
            and leaves[0].space.dtype == np.float32
            else None
            for leaves in self.leaves
        ]

    # ------------------------------------------------------------------ actions

    def gather(self, actions: Sequence[Mapping[str, Any]]) -> list[ActionColumn]:
        """RLlib's per-environment action dicts as one column per acting agent."""
        unknown = set().union(*actions).difference(self.index)
        if unknown:
            i = next(i for i, a in enumerate(actions) if not unknown.isdisjoint(a))
            raise ValueError(f"environment {i}: action for unknown agent {min(unknown)!r}")
        columns = []
        for k, aid in enumerate(self.agents):
            env = [i for i, a in enumerate(actions) if aid in a]
            if not env:
                continue
            values = [actions[i][aid] for i in env]
            columns.append(ActionColumn(k, np.asarray(env, np.int32), self._flat(k, values)))
        return columns

    def _flat(self, k: int, values: list[Any]) -> Any:
        space, kind = self.action_spaces[k], self.action_kinds[k]
        if kind is None:
            return codec.stack_values(space, values)
        if kind[0] == DISCRETE:
            return np.fromiter(values, np.int64, count=len(values))
        flat = np.asarray(values, np.float32 if kind[0] == BOX else np.int64).reshape(-1)
        if flat.size != len(values) * kind[1]:
            raise codec.CodecError(
                f"action of {self.agents[k]!r}",
                f"expected {kind[1]} values per environment, got {flat.size / len(values):g}",
            )
        return flat

    def action_batch(self, column: ActionColumn) -> Any:
        """A column's values shaped as `spaces.batch_to_points` takes them."""
        kind = self.action_kinds[column.agent]
        if kind is None:
            return column.values
        rows = len(column.env)
        return column.values.reshape((rows,) if kind[0] == DISCRETE else (rows, -1))

    # ------------------------------------------------------------------ observations

    def observations(self, k: int, leaves: list[np.ndarray], rows: int) -> Any:
        """Agent k's observation leaves as one batch of its space (first axis = row)."""
        out: Any = None
        for leaf, flat in zip(self.leaves[k], leaves, strict=True):
            value = _shaped(leaf, flat, rows)
            if not leaf.path:
                return value
            out = {} if out is None else out
            node = out
            for key in leaf.path[:-1]:
                node = node.setdefault(key, {})
            node[leaf.path[-1]] = value
        return _ordered(self.observation_spaces[k], out)


def _shaped(leaf: Leaf, flat: np.ndarray, rows: int) -> np.ndarray:
    space = leaf.space
    if leaf.kind == BOX:
        return codec._as_dtype(flat, space.dtype).reshape((rows, *space.shape))
    if leaf.kind == DISCRETE:
        return flat
    return flat.astype(space.dtype, copy=False).reshape((rows, *space.shape))


def _ordered(space: gym.Space, value: Any) -> Any:
    # Dict batches keep the space's key order, as `spaces.points_to_batch` returns them.
    if isinstance(space, gym.spaces.Dict):
        return {key: _ordered(sub, value[key]) for key, sub in space.spaces.items()}
    return value
