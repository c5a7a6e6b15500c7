"""The step path's codec in Python: actions -> `StateUpdate` bytes, `State` bytes -> columns.

The reference for the compiled codec (`training.clients.native.NativeStepCodec`): same
columns, same errors, checked against each other on the same replies by the tests.
Replies are checked environment by environment, agent by agent, so the first fault
found, and its message, are the compiled codec's too.
"""

from __future__ import annotations

from itertools import chain
from typing import Protocol

import numpy as np
from google.protobuf.message import DecodeError

from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.step_layout import (
    DISCRETE,
    POINT_FIELD,
    WIRE_DTYPE,
    ActionColumn,
    AgentColumns,
    Leaf,
    StepLayout,
    WireError,
)


class PythonStepCodec:
    name = "python"

    def __init__(self, layout: StepLayout) -> None:
        self.layout = layout

    def encode(self, num_envs: int, actions: list[ActionColumn]) -> bytes:
        update = pb.StateUpdate()
        envs = update.step.environments
        updates = [envs.add().updates for _ in range(num_envs)]
        layout = self.layout
        for column in actions:
            aid = layout.agents[column.agent]
            points = [updates[i][aid] for i in column.env.tolist()]
            space = layout.action_spaces[column.agent]
            codec.batch_to_points(space, layout.action_batch(column), points, f"action of {aid!r}")
        return update.SerializeToString()

    def decode(self, data: bytes) -> tuple[int, list[AgentColumns]]:
        try:
            state = pb.State.FromString(data)
        except (DecodeError, RuntimeWarning, ValueError) as exc:
            raise WireError(f"reply of {len(data)} bytes is not a State message ({exc})") from None
        if not state.HasField("training_state"):
            raise WireError("reply has no training_state")
        layout = self.layout
        count = len(layout.agents)
        rows: list[list[int]] = [[] for _ in range(count)]
        states: list[list[pb.AgentState]] = [[] for _ in range(count)]
        values: list[list[list]] = [[[] for _ in leaves] for leaves in layout.leaves]
        env_states = state.training_state.environment_states
        for i, env_state in enumerate(env_states):
            for aid, st in env_state.agent_states.items():
                k = layout.index.get(aid)
                if k is None:
                    raise WireError(f"environment {i}: unknown agent '{aid}'")
                reward = st.reward
                if reward != reward:
                    raise WireError(f"environment {i} agent '{aid}' reward is NaN")
                for leaf, sink in zip(layout.leaves[k], values[k], strict=True):
                    try:
                        sink.append(_leaf_values(leaf, st.observations))
                    except WireError as exc:
                        raise WireError(
                            f"environment {i} agent '{aid}' observations: {exc}"
                        ) from None
                rows[k].append(i)
                states[k].append(st)
        out = []
        for k in range(count):
            sts, n = states[k], len(states[k])
            leaves = [
                np.fromiter(
                    v if leaf.kind == DISCRETE else chain.from_iterable(v),
                    WIRE_DTYPE[leaf.kind],
                    count=n * leaf.size,
                )
                for leaf, v in zip(layout.leaves[k], values[k], strict=True)
            ]
            out.append(
                AgentColumns(
                    env=np.asarray(rows[k], np.int32),
                    reward=np.fromiter((st.reward for st in sts), np.float32, count=n),
                    terminated=np.fromiter((st.terminated for st in sts), np.bool_, count=n),
                    truncated=np.fromiter((st.truncated for st in sts), np.bool_, count=n),
                    leaves=leaves,
                    infos=[(r, dict(st.info)) for r, st in enumerate(sts) if st.info],
                )
            )
        return len(env_states), out


def _leaf_values(leaf: Leaf, point: pb.Point):
    """The leaf's values in `point` (a repeated field, or the discrete value)."""
    for depth, key in enumerate(leaf.path):
        got = point.WhichOneof("point")
        if got != "dict_point":
            raise WireError(
                _at(leaf.path[:depth], f"expected a dict_point, got {got or 'nothing'}")
            )
        entries = point.dict_point.values
        if key not in entries:
            raise WireError(_at(leaf.path[:depth], f"missing key '{key}'"))
        point = entries[key]
    expected = POINT_FIELD[leaf.kind]
    got = point.WhichOneof("point")
    if got != expected:
        raise WireError(_at(leaf.path, f"expected a {expected}, got {got or 'nothing'}"))
    if leaf.kind == DISCRETE:
        return point.discrete_point.value
    repeated = getattr(point, expected).values
    if len(repeated) != leaf.size:
        raise WireError(_at(leaf.path, f"expected {leaf.size} values, got {len(repeated)}"))
    return repeated


def _at(path: tuple[str, ...], message: str) -> str:
    # The same text as the compiled codec's (native/src/codec.rs, `located`).
    where = "".join(f"['{key}']" for key in path)
    return f"{where}: {message}" if path else message


class StepCodec(Protocol):
    name: str

    def encode(self, num_envs: int, actions: list[ActionColumn]) -> bytes: ...

    def decode(self, data: bytes) -> tuple[int, list[AgentColumns]]: ...
