"""`uerl export`: Schola's inference interface, checked with onnxruntime against torch.

Checkpoints here are built without training (the modules uerl train would build
for each mock game, saved in a checkpoint's layout with its `uerl.json` and
`game.json`): the export does not care whether weights were trained, and each
file is compared action by action with the torch module.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from training.export.exporter import export_checkpoint, export_modules, listing
from training.export.interface import ExportError, PolicyInterface, policy_interface
from training.export.onnx_policy import OPSET, ActionSettings
from training.mock_ue.scenarios import SCENARIOS, TWO_TEAMS
from training.policies.game_spec import GameSpec
from training.protocol.game_definition import AgentSpec
from training.run import checkpoints


def game_for(env_id: str) -> GameSpec:
    scenario = SCENARIOS[env_id]
    agents = {}
    for slot in scenario.slots:
        env = scenario.make(slot)
        agents[slot.agent_id] = AgentSpec(slot.agent_type, env.observation_space, env.action_space)
        env.close()
    return GameSpec(num_envs=1, agents=agents)


def modules_for(spaces: dict[str, tuple[gym.Space, gym.Space]], seed: int = 0):
    import torch
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    torch.manual_seed(seed)
    spec = MultiRLModuleSpec(
        rl_module_specs={
            pid: RLModuleSpec(
                module_class=DefaultPPOTorchRLModule,
                observation_space=obs,
                action_space=act,
                model_config={"fcnet_hiddens": [32, 32]},
            )
            for pid, (obs, act) in spaces.items()
        }
    )
    return spec.build()


def write_checkpoint(tmp_path: Path, game: GameSpec) -> Path:
    """A checkpoint as `uerl train` lays it out, with untrained modules for `game`."""
    path = tmp_path / "checkpoints" / "checkpoint_000001"
    modules = modules_for(game.policy_spaces())
    modules.save_to_path(str((path / checkpoints.MODULES_SUBDIR).resolve()))
    (path / checkpoints.META).write_text(
        json.dumps({"iteration": 1, "env_steps_total": 100, "algo": "PPO"})
    )
    (path / checkpoints.GAME).write_text(game.to_json())
    (path.parent / checkpoints.LATEST).write_text(path.name)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Each mock game's checkpoint exported once (the dynamo exporter takes seconds)."""
    out = {}
    for env_id in ("CartPole-v1", "Pendulum-v1", TWO_TEAMS):
        tmp = tmp_path_factory.mktemp(env_id.replace("/", "_"))
        write_checkpoint(tmp, game_for(env_id))
        out[env_id] = export_checkpoint(tmp / "checkpoints", tmp / "onnx", samples=1024)
        print(f"\n[{env_id}]\n{listing(out[env_id])}")
    return out


def test_one_file_per_policy_named_after_it(exported: dict[str, list]) -> None:
    names = {env: sorted(e.path.name for e in items) for env, items in exported.items()}
    assert names == {
        "CartPole-v1": ["cartpole.onnx"],
        "Pendulum-v1": ["pendulum.onnx"],
        TWO_TEAMS: ["cart.onnx", "pendulum.onnx"],
    }


def test_files_are_opset_21_with_named_inputs_and_outputs(exported: dict[str, list]) -> None:
    for item in exported["Pendulum-v1"] + exported[TWO_TEAMS]:
        model = onnx.load(str(item.path))
        onnx.checker.check_model(model, full_check=True)
        assert {o.domain: o.version for o in model.opset_import}[""] == OPSET
        assert [i.name for i in model.graph.input] == ["obs"]
        assert [o.name for o in model.graph.output] == ["action"]


def test_batch_dimension_is_dynamic(exported: dict[str, list]) -> None:
    (item,) = exported["CartPole-v1"]
    model = onnx.load(str(item.path))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch_size"
    session = ort.InferenceSession(str(item.path))
    for batch in (1, 7, 300):
        (action,) = session.run(None, {"obs": np.zeros((batch, 4), np.float32)})
        assert action.shape == (batch,)


def test_discrete_actions_equal_torch_on_sampled_observations(exported: dict[str, list]) -> None:
    for item in exported["CartPole-v1"] + [
        e for e in exported[TWO_TEAMS] if e.interface.policy_id == "cart"
    ]:
        assert item.verification.mismatches == {"action": 0}
        assert item.verification.max_abs_deviation == {"action": 0.0}


def test_box_actions_match_torch_within_tolerance(exported: dict[str, list]) -> None:
    for item in exported["Pendulum-v1"] + [
        e for e in exported[TWO_TEAMS] if e.interface.policy_id == "pendulum"
    ]:
        assert item.verification.mismatches == {"action": 0}
        assert item.verification.max_abs_deviation["action"] < 1e-4


def test_box_actions_are_the_modules_mean_rescaled_from_unit_range_to_the_bounds(
    tmp_path: Path,
) -> None:
    # RLlib's normalize_actions maps the module's mean from [-1, 1] to the Box's bounds
    # ([-2, 2] for Pendulum): the file must emit low + (mean + 1) * (high - low) / 2, not
    # the raw mean (clamping alone would keep that within the bounds too).
    import torch
    from ray.rllib.core.columns import Columns

    from training.export.onnx_policy import export_policy

    ((policy_id, (obs_space, act_space)),) = game_for("Pendulum-v1").policy_spaces().items()
    module = modules_for({policy_id: (obs_space, act_space)})[policy_id]
    module.eval()
    interface = policy_interface(
        policy_id,
        game_obs=obs_space,
        game_action=act_space,
        module_obs=obs_space,
        module_action=act_space,
    )
    path = tmp_path / "pendulum.onnx"
    export_policy(module, interface, ActionSettings(normalize_actions=True), path)
    obs = np.random.default_rng(0).uniform(-8, 8, (2000, 3)).astype(np.float32)
    (action,) = ort.InferenceSession(str(path)).run(None, {"obs": obs})
    with torch.no_grad():
        logits = module.forward_inference({Columns.OBS: torch.as_tensor(obs)})
    mean = logits[Columns.ACTION_DIST_INPUTS][:, :1].numpy()
    low, high = act_space.low, act_space.high
    rescaled = np.clip(low + (mean + 1.0) * (high - low) / 2.0, low, high)
    # The sample tells rescaled from raw actions apart (else the check below proves nothing).
    assert np.abs(rescaled - np.clip(mean, low, high)).max() > 0.1
    np.testing.assert_allclose(action, rescaled, atol=1e-4)


def test_a_module_on_the_flattened_dict_observation_still_gets_named_inputs(
    tmp_path: Path,
) -> None:
    game_obs = gym.spaces.Dict(
        {
            "position": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "mode": gym.spaces.Discrete(4),
            "ray_cast": gym.spaces.Box(0.0, 10.0, (2, 2), np.float32),
        }
    )
    action = gym.spaces.MultiDiscrete([3, 2])
    flat = gym.spaces.flatten_space(game_obs)
    modules = modules_for({"walker": (flat, action)})
    interface = policy_interface(
        "walker", game_obs=game_obs, game_action=action, module_obs=flat, module_action=action
    )
    assert interface.obs_mode == "flattened"
    (item,) = export_modules(
        modules, {"walker": interface}, ActionSettings(), tmp_path, samples=1024
    )
    model = onnx.load(str(item.path))
    # The Dict's key order (gymnasium sorts keys), one input each.
    assert [i.name for i in model.graph.input] == ["mode", "position", "ray_cast"]
    assert [o.name for o in model.graph.output] == ["action"]
    assert item.verification.mismatches == {"action": 0}


def test_an_unrelated_module_space_is_refused_naming_the_policy() -> None:
    with pytest.raises(ExportError, match=r"policy 'cart'.*neither"):
        policy_interface(
            "cart",
            game_obs=gym.spaces.Box(-1, 1, (4,), np.float32),
            game_action=gym.spaces.Discrete(2),
            module_obs=gym.spaces.Box(-1, 1, (5,), np.float32),
            module_action=gym.spaces.Discrete(2),
        )


def test_non_dict_spaces_are_named_obs_and_action() -> None:
    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    interface: PolicyInterface = policy_interface(
        "p",
        game_obs=box,
        game_action=gym.spaces.Discrete(3),
        module_obs=box,
        module_action=gym.spaces.Discrete(3),
    )
    assert [i.name for i in interface.inputs] == ["obs"]
    assert [o.name for o in interface.outputs] == ["action"]


def test_an_unknown_policy_is_refused_naming_the_known_ones(
    exported: dict[str, list], tmp_path: Path
) -> None:
    write_checkpoint(tmp_path, game_for("CartPole-v1"))
    with pytest.raises(ExportError, match=r"--policy nope.*\['cartpole'\]"):
        export_checkpoint(tmp_path / "checkpoints", tmp_path / "onnx", policies=["nope"])


# ---- `uerl export`: what it is given, checked before the modules load -------------------


@pytest.fixture(scope="module")
def cartpole_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole checkpoint's directory (`<tmp>/checkpoints`), made once."""
    tmp = tmp_path_factory.mktemp("cartpole-cli")
    write_checkpoint(tmp, game_for("CartPole-v1"))
    return tmp / "checkpoints"


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the modules (6 to 9 s with torch) fails the test: the check came too late."""

    def loaded(path: Path) -> None:
        raise AssertionError("the modules were loaded before the input was checked")

    monkeypatch.setattr(checkpoints, "load_modules", loaded)


def export_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from training.commands.export import main

    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


@pytest.mark.usefixtures("no_loading")
def test_export_out_that_cannot_be_written_is_refused_before_the_modules_load(
    cartpole_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the modules loaded, then a FileExistsError traceback.
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out in (a_file, a_file / "onnx"):
        code, err = export_cli(capsys, "--checkpoint", str(cartpole_checkpoint), "--out", str(out))
        assert (code, err) == (2, f"uerl export: --out {out}: {a_file} is not a directory")


@pytest.mark.usefixtures("no_loading")
def test_export_of_a_checkpoint_that_is_a_file_says_it_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "no such checkpoint directory", of a path that is there.
    a_file = tmp_path / "checkpoint.zip"
    a_file.write_text("")
    code, err = export_cli(capsys, "--checkpoint", str(a_file))
    assert (code, err) == (
        2,
        f"uerl export: --checkpoint {a_file}: a file, not a checkpoint directory",
    )


@pytest.mark.usefixtures("no_loading")
def test_export_onto_a_full_disk_is_refused_before_the_modules_load(
    cartpole_checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from training.commands import writable

    usage = writable.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(writable.shutil, "disk_usage", lambda path: usage._replace(free=0))
    out = tmp_path / "onnx"
    code, err = export_cli(capsys, "--checkpoint", str(cartpole_checkpoint), "--out", str(out))
    assert code == 2
    assert err.startswith(
        f"uerl export: --out {out}: not enough room: the disk it is on is full, and the ONNX "
        "files take about "
    )


@pytest.mark.usefixtures("no_loading")
def test_export_of_a_policy_the_checkpoint_lacks_is_bad_input_refused_before_loading(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: exit 1, after the modules loaded.
    code, err = export_cli(capsys, "--checkpoint", str(cartpole_checkpoint), "--policy", "nosuch")
    checkpoint = cartpole_checkpoint / "checkpoint_000001"
    assert (code, err) == (
        2,
        f"uerl export: --policy nosuch: not in {checkpoint} (policies: ['cartpole'])",
    )


@pytest.mark.usefixtures("no_loading")
def test_export_of_a_snapshot_of_a_run_without_snapshots_is_bad_input_refused_before_loading(
    cartpole_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: exit 1, after the modules loaded.
    code, err = export_cli(capsys, "--checkpoint", str(cartpole_checkpoint), "--snapshot", "3")
    checkpoint = cartpole_checkpoint / "checkpoint_000001"
    assert (code, err) == (
        2,
        f"uerl export: --snapshot 3: {checkpoint} holds no snapshots (it was not trained with "
        "--policies self_play); leave --snapshot out",
    )


def test_a_disk_that_fills_while_exporting_is_one_line_naming_out(
    cartpole_checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "policy 'cartpole': torch.onnx.export failed: OSError: [Errno 28] ...", exit 1,
    # naming no path.
    import errno

    import torch

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.onnx, "export", full)
    out = tmp_path / "onnx"
    code, err = export_cli(capsys, "--checkpoint", str(cartpole_checkpoint), "--out", str(out))
    assert (code, err) == (
        2,
        f"uerl export: --out {out}: cannot write there: the disk it is on is full "
        "(No space left on device)",
    )
