"""`uerl export`: every policy of a checkpoint to `<out>/<policy_id>.onnx`, each verified.

The game's named spaces come from the checkpoint's `game.json` (written by `uerl
train`); older checkpoints fall back to the modules' own spaces, which `uerl
train` builds from the game's spaces unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from training.export.interface import ExportError, PolicyInterface, policy_interface
from training.export.onnx_policy import (
    ActionSettings,
    Verification,
    export_policy,
    verify_policy,
)
from training.policies.self_play import LEARNER, League
from training.run import checkpoints


@dataclass(frozen=True)
class ExportedPolicy:
    path: Path
    interface: PolicyInterface
    verification: Verification


def _short(space: Any) -> str:
    """A space in one short phrase (the full Box repr lists every bound)."""
    if isinstance(space, gym.spaces.Box):
        low, high = float(np.min(space.low)), float(np.max(space.high))
        return f"Box{tuple(space.shape)} in [{low:g}, {high:g}]"
    return str(space)


def graph_signature(path: Path) -> tuple[int, list[str], list[str]]:
    """(opset, inputs, outputs) as written in the ONNX file: `name  type[dims]`."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), -1)

    def describe(value: Any) -> str:
        tensor = value.type.tensor_type
        dims = ", ".join(d.dim_param or str(d.dim_value) for d in tensor.shape.dim)
        elem = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        return f"{value.name:<12} {elem}[{dims}]"

    graph = model.graph
    return opset, [describe(v) for v in graph.input], [describe(v) for v in graph.output]


def listing(exported: list[ExportedPolicy]) -> str:
    """What was written, read back from each file, and the check against torch."""
    lines = []
    for item in exported:
        v = item.verification
        opset, inputs, outputs = graph_signature(item.path)
        lines.append(f"{item.path}  (policy {item.interface.policy_id!r}, opset {opset})")
        if item.interface.obs_mode == "flattened":
            lines.append("  (module trained on the flattened observation; inputs stay named)")
        for text, named in zip(inputs, item.interface.inputs, strict=True):
            lines.append(f"  input  {text}  {_short(named.space)}")
        for text, named in zip(outputs, item.interface.outputs, strict=True):
            lines.append(f"  output {text}  {_short(named.space)}")
        checks = ", ".join(
            f"{name}: max |onnx - torch| {v.max_abs_deviation[name]:.3g}, "
            f"{v.mismatches[name]} mismatch(es)"
            for name in v.max_abs_deviation
        )
        lines.append(f"  verified on {v.samples} sampled observations: {checks}")
    return "\n".join(lines)


def interfaces_for(path: Path, modules: Any) -> dict[str, PolicyInterface]:
    """Per policy: the named interface from the game's spaces and the module's."""
    game = checkpoints.read_game(path)
    game_spaces = game.policy_spaces() if game is not None else {}
    out = {}
    for policy_id in sorted(modules.keys()):
        module = modules[policy_id]
        obs, act = game_spaces.get(policy_id, (module.observation_space, module.action_space))
        out[policy_id] = policy_interface(
            policy_id,
            game_obs=obs,
            game_action=act,
            module_obs=module.observation_space,
            module_action=module.action_space,
        )
    return out


def export_modules(
    modules: Any,
    interfaces: dict[str, PolicyInterface],
    settings: ActionSettings,
    out_dir: Path,
    *,
    samples: int = 512,
) -> list[ExportedPolicy]:
    """Export and verify each policy; a file that disagrees with torch is an error."""
    exported = []
    for policy_id, interface in interfaces.items():
        module = modules[policy_id]
        module.eval()
        path = out_dir / f"{policy_id}.onnx"
        export_policy(module, interface, settings, path)
        verification = verify_policy(path, module, interface, settings, samples=samples)
        if not verification.ok:
            raise ExportError(
                f"policy {policy_id!r}: {path} disagrees with the torch module on "
                f"{verification.mismatches} of {samples} sampled observations "
                f"(max deviation {verification.max_abs_deviation})"
            )
        exported.append(ExportedPolicy(path, interface, verification))
    return exported


class ExportRequestError(ExportError):
    """What was asked of the checkpoint (--policy, --snapshot) is not in it: bad input."""


def _snapshot_slots(league: League, numbers: list[int], path: Path) -> list[str]:
    slots = []
    for number in numbers:
        slot = league.slot_of(number)
        if slot is None:
            held = sorted(snap.number for snap in league.slots.values())
            raise ExportRequestError(
                f"--snapshot {number}: not in {path} (snapshots held: {held or 'none yet'})"
            )
        slots.append(slot)
    return slots


def chosen_policies(
    path: Path, *, policies: list[str] | None = None, snapshots: list[int] | None = None
) -> list[str] | None:
    """The policies to export (None: all), from the checkpoint's files alone, before its
    modules load; an ExportRequestError naming the flag for one it does not hold."""
    league = checkpoints.read_league(path)
    if league is not None:
        # Self-play: the learning policy, and the snapshots asked for by number.
        policies = [*(policies or [LEARNER]), *_snapshot_slots(league, snapshots or [], path)]
    elif snapshots:
        raise ExportRequestError(
            f"--snapshot {snapshots[0]}: {path} holds no snapshots (it was not trained with "
            "--policies self_play); leave --snapshot out"
        )
    if policies:
        held = checkpoints.policy_ids(path)
        unknown = sorted(set(policies) - set(held))
        if unknown:
            raise ExportRequestError(
                f"--policy {', '.join(unknown)}: not in {path} (policies: {held})"
            )
    return policies


def expected_size(path: Path, policies: list[str] | None) -> int:
    """About the bytes the ONNX files of `policies` (None: all) take: their weights, which
    each file holds as the module's state does (float32)."""
    modules_dir = path / checkpoints.MODULES_SUBDIR
    wanted = None if policies is None else set(policies)
    if wanted is not None and checkpoints.read_meta(path).env_runner == "single_agent":
        wanted.add(checkpoints.SINGLE_AGENT_MODULE)  # stored under RLlib's name
    return sum(
        state.stat().st_size
        for state in modules_dir.glob("*/module_state.pkl")
        if wanted is None or state.parent.name in wanted
    )


def export_checkpoint(
    checkpoint: Path,
    out_dir: Path,
    *,
    policies: list[str] | None = None,
    snapshots: list[int] | None = None,
    samples: int = 512,
) -> list[ExportedPolicy]:
    path = checkpoints.resolve_checkpoint(checkpoint)
    meta = checkpoints.read_meta(path)
    chosen = chosen_policies(path, policies=policies, snapshots=snapshots)
    modules = checkpoints.load_modules(path)
    interfaces = interfaces_for(path, modules)
    if chosen:
        interfaces = {p: interfaces[p] for p in chosen}
    settings = ActionSettings(meta.normalize_actions, meta.clip_actions)
    return export_modules(modules, interfaces, settings, out_dir, samples=samples)
