"""The Schola inference interface of one policy: named inputs and outputs, from its spaces.

A Schola game feeds one graph input per observation key and reads one output per
action key (the shape Schola v2.1.1's own exporters write: `schola/core/model.py` and
`schola/rllib/export.py` of its Python package); a space that is not a `Dict` is named
`obs` / `action`. This module decides those names and how each named input maps onto
what the trained RLlib module takes:

- `direct`: the module was built on the game's own observation space (what `uerl
  train` does: it never flattens), so the one input `obs` is the module's input.
- `flattened`: the module was built on `gymnasium.spaces.flatten_space(game space)`
  (a game with `Dict` observations trained behind a flattening connector); the
  graph flattens each named input and concatenates them in the `Dict`'s key order,
  exactly as `gymnasium.spaces.flatten` does, so the game still feeds named inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np

OBS_KEY = "obs"
ACTION_KEY = "action"


class ExportError(ValueError):
    """A policy cannot be exported in Schola's shape; the message names the policy and why."""


@dataclass(frozen=True)
class NamedInput:
    name: str
    space: gym.Space

    @property
    def shape(self) -> tuple[int, ...]:
        """Per-sample shape: Discrete values are fed as their index, one per sample."""
        return () if isinstance(self.space, gym.spaces.Discrete) else tuple(self.space.shape)

    @property
    def dtype(self) -> np.dtype:
        if isinstance(self.space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
            return np.dtype(np.int64)
        if isinstance(self.space, gym.spaces.MultiBinary):
            return np.dtype(np.float32)
        return np.dtype(np.float32)


@dataclass(frozen=True)
class NamedOutput:
    name: str
    space: gym.Space

    @property
    def logits(self) -> int:
        """How many of the module's action-distribution inputs this output takes."""
        space = self.space
        if isinstance(space, gym.spaces.Box):
            return 2 * int(np.prod(space.shape))  # mean and log-std
        if isinstance(space, gym.spaces.Discrete):
            return int(space.n)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return int(np.sum(space.nvec))
        raise AssertionError(space)


@dataclass(frozen=True)
class PolicyInterface:
    policy_id: str
    inputs: tuple[NamedInput, ...]
    outputs: tuple[NamedOutput, ...]
    obs_mode: Literal["direct", "flattened"]


def _named(space: gym.Space, default: str) -> dict[str, gym.Space]:
    return dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {default: space}


def _check_input(policy_id: str, name: str, space: gym.Space) -> None:
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        raise ExportError(
            f"policy {policy_id!r}: observation {name!r} is a nested {type(space).__name__}; "
            "Schola's interface names one level of observation keys"
        )


def _check_output(policy_id: str, name: str, space: gym.Space) -> None:
    if isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.floating):
        raise ExportError(f"policy {policy_id!r}: action {name!r} is an integer Box")
    if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        raise ExportError(
            f"policy {policy_id!r}: action {name!r} is {type(space).__name__}; the exporter "
            "writes Box, Discrete and MultiDiscrete actions (what RLlib's default modules emit)"
        )


def policy_interface(
    policy_id: str,
    *,
    game_obs: gym.Space,
    game_action: gym.Space,
    module_obs: gym.Space,
    module_action: gym.Space,
) -> PolicyInterface:
    """The named interface of a policy trained on `module_*` for a game with `game_*` spaces."""
    if module_action != game_action:
        raise ExportError(
            f"policy {policy_id!r}: the module's action space {module_action} is not the "
            f"game's {game_action}; a module must emit the game's actions"
        )
    if isinstance(game_action, gym.spaces.Dict):
        raise ExportError(
            f"policy {policy_id!r}: Dict action spaces are not exported yet (keys "
            f"{list(game_action.spaces)}); RLlib's default modules emit one action space"
        )
    if module_obs == game_obs:
        mode: Literal["direct", "flattened"] = "direct"
    elif isinstance(game_obs, gym.spaces.Dict) and module_obs == gym.spaces.flatten_space(game_obs):
        mode = "flattened"
    else:
        raise ExportError(
            f"policy {policy_id!r}: the module's observation space {module_obs} is neither "
            f"the game's {game_obs} nor its flattened form; cannot name its inputs"
        )
    if mode == "direct" and isinstance(game_obs, gym.spaces.Dict):
        raise ExportError(
            f"policy {policy_id!r}: the module takes the Dict observation itself; the "
            "exporter needs a module on a Box (the game's, or the flattened Dict)"
        )
    inputs = tuple(NamedInput(k, s) for k, s in _named(game_obs, OBS_KEY).items())
    for item in inputs:
        _check_input(policy_id, item.name, item.space)
    outputs = tuple(NamedOutput(k, s) for k, s in _named(game_action, ACTION_KEY).items())
    for out in outputs:
        _check_output(policy_id, out.name, out.space)
    names = [i.name for i in inputs] + [o.name for o in outputs]
    if len(set(names)) != len(names):
        raise ExportError(
            f"policy {policy_id!r}: input and output names must be distinct, got {names}"
        )
    return PolicyInterface(policy_id, inputs, outputs, mode)


def sample_inputs(interface: PolicyInterface, batch: int, seed: int) -> dict[str, np.ndarray]:
    """A batch of observations from the game's space, as the game feeds them (named)."""
    out: dict[str, np.ndarray] = {}
    for index, item in enumerate(interface.inputs):
        space = item.space
        space.seed(seed + index)
        values = np.stack([np.asarray(space.sample()) for _ in range(batch)])
        out[item.name] = values.astype(item.dtype).reshape((batch, *item.shape))
    return out
