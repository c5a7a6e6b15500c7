"""One RLlib module -> one ONNX file in Schola's shape, and the check that it is right.

The graph computes the action the game would receive from `uerl`'s env runner with
`explore=False`: the distribution's deterministic action (Box: the mean, Discrete /
MultiDiscrete: the argmax of each section), then RLlib's module-to-env step
(Box actions rescaled from [-1, 1] to the space's bounds when the run used
`normalize_actions`, clipped when it used `clip_actions`). Schola's own exporter
stops at the mean; a policy trained by RLlib with normalized actions would then
act on the wrong scale in the game, so the rescaling is part of the graph.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from training.export.interface import ExportError, PolicyInterface, sample_inputs

OPSET = 21
BATCH_DIM = "batch_size"


@dataclass(frozen=True)
class ActionSettings:
    normalize_actions: bool = True
    clip_actions: bool = False


@dataclass(frozen=True)
class Verification:
    """onnxruntime against torch on `samples` sampled observations."""

    samples: int
    # Per output: max |onnx - torch| (Box), or the number of unequal actions (discrete).
    max_abs_deviation: dict[str, float]
    mismatches: dict[str, int]

    @property
    def ok(self) -> bool:
        return not any(self.mismatches.values())


def _rescaling(space: gym.spaces.Box, settings: ActionSettings) -> tuple[bool, bool]:
    bounded = bool(np.all(space.bounded_below) and np.all(space.bounded_above))
    return settings.normalize_actions and bounded, settings.clip_actions


def _build_wrapper(module: Any, interface: PolicyInterface, settings: ActionSettings) -> Any:
    import torch
    from ray.rllib.core.columns import Columns

    class DeterministicPolicy(torch.nn.Module):
        """Named observations in, deterministic named actions out."""

        def __init__(self) -> None:
            super().__init__()
            self.module = module
            for out in interface.outputs:
                if isinstance(out.space, gym.spaces.Box):
                    low = torch.as_tensor(out.space.low, dtype=torch.float32)
                    high = torch.as_tensor(out.space.high, dtype=torch.float32)
                    self.register_buffer(f"low_{len(self._buffers)}", low)
                    self.register_buffer(f"high_{len(self._buffers)}", high)

        def _module_obs(self, inputs: tuple[Any, ...]) -> Any:
            if interface.obs_mode == "direct":
                return inputs[0].to(torch.float32)
            # gymnasium.spaces.flatten order: Dict keys in order, each flattened
            # (Discrete as one-hot).
            parts = []
            for item, value in zip(interface.inputs, inputs, strict=True):
                if isinstance(item.space, gym.spaces.Discrete):
                    index = (value - int(item.space.start)).to(torch.int64)
                    parts.append(
                        torch.nn.functional.one_hot(index, int(item.space.n)).to(torch.float32)
                    )
                else:
                    parts.append(value.to(torch.float32).reshape(value.shape[0], -1))
            return torch.cat(parts, dim=1)

        def forward(self, *inputs: Any) -> tuple[Any, ...]:
            out = self.module.forward_inference({Columns.OBS: self._module_obs(inputs)})
            logits = out[Columns.ACTION_DIST_INPUTS].reshape(inputs[0].shape[0], -1)
            actions = []
            offset = 0
            buffers = list(self._buffers.values())
            box_index = 0
            for item in interface.outputs:
                chunk = logits[:, offset : offset + item.logits]
                offset += item.logits
                space = item.space
                if isinstance(space, gym.spaces.Box):
                    size = item.logits // 2
                    action = chunk[:, :size].reshape(-1, *space.shape)
                    low, high = buffers[2 * box_index], buffers[2 * box_index + 1]
                    box_index += 1
                    normalize, clip = _rescaling(space, settings)
                    if normalize:
                        action = low + (action + 1.0) * (high - low) / 2.0
                    if normalize or clip:
                        action = torch.minimum(torch.maximum(action, low), high)
                elif isinstance(space, gym.spaces.Discrete):
                    action = torch.argmax(chunk, dim=1) + int(space.start)
                else:  # MultiDiscrete: argmax of each section of nvec
                    sections = torch.split(chunk, [int(n) for n in space.nvec.reshape(-1)], dim=1)
                    action = torch.stack([torch.argmax(s, dim=1) for s in sections], dim=1)
                actions.append(action)
            return tuple(actions)

    return DeterministicPolicy().eval()


def _quiet_exporter() -> None:
    # It logs one warning per torchvision op it cannot register, on every export.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)


def export_policy(
    module: Any, interface: PolicyInterface, settings: ActionSettings, path: Path
) -> None:
    """Write `path` (opset 21, dynamo exporter, dynamic batch) for one policy."""
    import torch

    _quiet_exporter()
    wrapper = _build_wrapper(module, interface, settings)
    example = sample_inputs(interface, batch=2, seed=0)
    args = tuple(torch.as_tensor(example[i.name]) for i in interface.inputs)
    batch = torch.export.Dim(BATCH_DIM)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The exporter warns about its own internals (pytree deprecations): not ours to fix.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            torch.onnx.export(
                wrapper,
                args,
                str(path),
                input_names=[i.name for i in interface.inputs],
                output_names=[o.name for o in interface.outputs],
                dynamo=True,
                optimize=True,
                opset_version=OPSET,
                # forward(*inputs): one entry, the tuple of all inputs, each batch-dynamic.
                dynamic_shapes=(tuple({0: batch} for _ in interface.inputs),),
                verbose=False,
            )
        except OSError as exc:
            if exc.errno is None:
                raise ExportError(
                    f"policy {interface.policy_id!r}: torch.onnx.export failed: OSError: {exc}"
                ) from exc
            raise  # writing the file (a full disk): the caller names its --out
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ExportError(
                f"policy {interface.policy_id!r}: torch.onnx.export failed: "
                f"{type(exc).__name__}: {first}"
            ) from exc


def reference_actions(
    module: Any,
    interface: PolicyInterface,
    settings: ActionSettings,
    named_obs: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """What the env runner sends the game for these observations with explore=False,
    computed the way RLlib computes it (torch module, its action distribution,
    RLlib's own rescaling), independently of the exported graph."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

    batch = len(next(iter(named_obs.values())))
    if interface.obs_mode == "direct":
        obs = named_obs[interface.inputs[0].name].astype(np.float32)
    else:
        game_space = gym.spaces.Dict({i.name: i.space for i in interface.inputs})
        obs = np.stack(
            [
                gym.spaces.flatten(game_space, {k: v[row] for k, v in named_obs.items()})
                for row in range(batch)
            ]
        ).astype(np.float32)
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.as_tensor(obs)})
        dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        actions = dist.to_deterministic().sample().numpy()
    (item,) = interface.outputs  # Dict actions are refused by policy_interface
    if isinstance(item.space, gym.spaces.Box):
        if settings.normalize_actions:
            actions = np.stack([unsquash_action(a, item.space) for a in actions])
        if settings.clip_actions:
            actions = np.stack([clip_action(a, item.space) for a in actions])
    return {item.name: actions}


def verify_policy(
    path: Path,
    module: Any,
    interface: PolicyInterface,
    settings: ActionSettings,
    *,
    samples: int = 512,
    seed: int = 0,
    box_tolerance: float = 1e-4,
) -> Verification:
    """Feed `samples` sampled observations to onnxruntime and to the torch module."""
    import onnxruntime as ort

    named = sample_inputs(interface, batch=samples, seed=seed)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, named), strict=True))
    want = reference_actions(module, interface, settings, named)
    deviation: dict[str, float] = {}
    mismatches: dict[str, int] = {}
    for item in interface.outputs:
        a = np.asarray(got[item.name])
        b = np.asarray(want[item.name]).reshape(a.shape)
        if isinstance(item.space, gym.spaces.Box):
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            deviation[item.name] = float(diff.max(initial=0.0))
            mismatches[item.name] = int(np.sum(np.any(diff > box_tolerance, axis=-1)))
        else:
            deviation[item.name] = float(np.abs(a.astype(np.int64) - b).max(initial=0))
            unequal = a.astype(np.int64) != b.astype(np.int64)
            mismatches[item.name] = int(np.sum(unequal.reshape(samples, -1).any(axis=1)))
    return Verification(samples, deviation, mismatches)
