"""Hand-encoded `State` replies: the training state of all environments in a few numpy ops.

Building the reply as protobuf messages costs a Python-level message, map entry and
field assignment per environment and agent, which rivals stepping CartPole itself.
For a Box observation space every `map<string, AgentState>` entry has the same byte
layout (fixed-width floats, 1-byte bools, constant tags and lengths), so the entries
of all environments are rows of one numpy structured array whose constant bytes are
written once per session. Other observation spaces fall back to serialising one small
message per entry. The bytes are plain protobuf wire format: any parser reads them
back as the equivalent `State` (explicit zero/false scalars included).
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field (message, string, packed repeated): tag, length, payload."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _head(number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field whose payload follows separately."""
    return varint(number << 3 | 2) + varint(length)


class AgentEntryEncoder:
    """Encodes one agent's `EnvironmentState.agent_states` entries (key + AgentState)."""

    def __init__(self, agent_id: str, space: gym.Space) -> None:
        self.agent_id = agent_id
        self.space = space
        self.fixed = isinstance(space, gym.spaces.Box) and space.dtype in codec.NUMPY_TO_DTYPE
        if self.fixed:
            self._init_layout(space)

    def _init_layout(self, space: gym.spaces.Box) -> None:
        size = codec._size(space)
        wire_dtype = codec.NUMPY_TO_DTYPE[space.dtype]
        # BoxPoint: 1 values (packed float), 2 dtype (omitted when 0), 3 shape (packed).
        box_tail = (bytes([0x10]) + varint(wire_dtype)) if wire_dtype else b""
        if space.shape:
            box_tail += length_delimited(3, b"".join(varint(d) for d in space.shape))
        box_len = len(_head(1, 4 * size)) + 4 * size + len(box_tail)
        point_len = len(_head(1, box_len)) + box_len  # Point.box_point
        # AgentState: 1 observations, 2 reward (fixed32), 3 terminated, 4 truncated.
        agent_len = len(_head(1, point_len)) + point_len + 5 + 2 + 2
        key = length_delimited(1, self.agent_id.encode())  # map entry: 1 key, 2 value
        entry_len = len(key) + len(_head(2, agent_len)) + agent_len
        self.prefix = (
            _head(1, entry_len)  # EnvironmentState.agent_states
            + key
            + _head(2, agent_len)
            + _head(1, point_len)
            + _head(1, box_len)
            + _head(1, 4 * size)
        )
        self.middle = box_tail + bytes([0x15])  # ... then reward's tag
        self.size = size
        self.entry_len = len(self.prefix) + 4 * size + len(self.middle) + 4 + 4

    def fields(self, suffix: str) -> list[tuple[str, str, tuple[int, ...]]]:
        """Structured-dtype fields of one entry; values go in obs/reward/term/trunc+suffix."""
        return [
            ("prefix" + suffix, "u1", (len(self.prefix),)),
            ("obs" + suffix, "<f4", (self.size,)),
            ("middle" + suffix, "u1", (len(self.middle),)),
            ("reward" + suffix, "<f4", ()),
            ("term_tag" + suffix, "u1", ()),
            ("term" + suffix, "u1", ()),
            ("trunc_tag" + suffix, "u1", ()),
            ("trunc" + suffix, "u1", ()),
        ]

    def fill_constants(self, rec: np.ndarray, suffix: str) -> None:
        rec["prefix" + suffix] = np.frombuffer(self.prefix, np.uint8)
        rec["middle" + suffix] = np.frombuffer(self.middle, np.uint8)
        rec["term_tag" + suffix] = 0x18
        rec["trunc_tag" + suffix] = 0x20

    def encode(
        self, obs: Sequence, rewards: Sequence[float], terms: Sequence, truncs: Sequence
    ) -> list[bytes]:
        """One serialised entry per environment (the general, slower path)."""
        n = len(rewards)
        if self.fixed:
            rec = np.empty(n, self.fields(""))
            self.fill_constants(rec, "")
            rec["obs"] = np.asarray(obs).astype(np.float32, copy=False).reshape(n, -1)
            rec["reward"], rec["term"], rec["trunc"] = rewards, terms, truncs
            return [row.tobytes() for row in rec]
        holders = [pb.EnvironmentState() for _ in range(n)]
        states = [h.agent_states[self.agent_id] for h in holders]
        codec.batch_to_points(self.space, np.asarray(obs), [s.observations for s in states])
        for st, r, te, tr in zip(states, rewards, terms, truncs, strict=True):
            st.reward = r
            st.terminated = te
            st.truncated = tr
        # An EnvironmentState holding one entry serialises to exactly that map entry.
        return [h.SerializeToString() for h in holders]


class FullReply:
    """Reply template for the common case: every environment holds every agent's entry.

    The whole training state is one structured array whose rows are environments;
    only observations, rewards and done flags change from step to step.
    """

    def __init__(self, encoders: Sequence[AgentEntryEncoder], num_envs: int) -> None:
        assert all(e.fixed for e in encoders)
        self.encoders = list(encoders)
        env_len = sum(e.entry_len for e in encoders)
        env_head = _head(1, env_len)  # TrainingState.environment_states
        fields: list[tuple[str, str, tuple[int, ...]]] = [("head", "u1", (len(env_head),))]
        for k, e in enumerate(encoders):
            fields += e.fields(str(k))
        self.rec = np.zeros(num_envs, fields)
        self.rec["head"] = np.frombuffer(env_head, np.uint8)
        for k, e in enumerate(encoders):
            e.fill_constants(self.rec, str(k))
        training_len = num_envs * self.rec.dtype.itemsize
        self.head = _head(1, training_len)  # State.training_state

    def set(
        self, k: int, obs: Sequence, rewards: Sequence[float], terms: Sequence, truncs: Sequence
    ) -> None:
        """Agent k's values for all environments (sequences of length num_envs)."""
        s = str(k)
        rec = self.rec
        rec["obs" + s] = obs
        rec["reward" + s] = rewards
        rec["term" + s] = terms
        rec["trunc" + s] = truncs

    def tobytes(self) -> bytes:
        return self.head + self.rec.tobytes()


def training_state(num_envs: int, entries: Sequence[Sequence[bytes]]) -> bytes:
    """`State` bytes with training_state set, from each environment's serialised entries."""
    assert len(entries) == num_envs
    payload = b"".join(length_delimited(1, b"".join(e)) for e in entries)
    return length_delimited(1, payload)  # State.training_state
