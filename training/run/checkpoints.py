"""Checkpoint layout: `<dir>/checkpoint_<iteration>/` plus `<dir>/latest` naming the newest.

Each checkpoint also holds `uerl.json` (iteration, env steps, algorithm, how actions
reach the game) so `--resume` can say what it continues from and refuse a different
algorithm, `game.json` (the game's agents and named spaces) so `uerl eval` and
`uerl export` know the game a policy was trained for, and under self-play
`league.json` (snapshots and ratings) so `--resume` continues the league.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from training.runstore import atomic

if TYPE_CHECKING:
    from training.policies.game_spec import GameSpec
    from training.policies.self_play import League

T = TypeVar("T")

LATEST = "latest"
META = "uerl.json"
GAME = "game.json"
LEAGUE = "league.json"
# Where RLlib keeps the trained modules inside an algorithm checkpoint.
MODULES_SUBDIR = Path("learner_group") / "learner" / "rl_module"
# A single-agent run's one module (ray.rllib.core.DEFAULT_MODULE_ID, without importing RLlib).
SINGLE_AGENT_MODULE = "default_policy"


class CheckpointError(ValueError):
    """No usable checkpoint where one was asked for; the message names the path."""


@dataclass(frozen=True)
class CheckpointMeta:
    iteration: int
    env_steps_total: int
    algo: str
    # RLlib's module-to-env settings: a Box action the module emits is rescaled from
    # [-1, 1] to the space's bounds (normalize) and/or clipped before the game sees it.
    # Defaults are RLlib's, which checkpoints written before these fields used.
    normalize_actions: bool = True
    clip_actions: bool = False
    # The RLlib runner and episodes the run sampled with (`training.rllib.algorithm`);
    # checkpoints written before this field were all multi-agent. A single-agent
    # checkpoint's one module is RLlib's `default_policy`, the game's one policy.
    env_runner: Literal["single_agent", "multi_agent"] = "multi_agent"
    # Every other file of the checkpoint (its relative path -> bytes), written last: a
    # reader of a store that copies files one by one (a bucket) takes the checkpoint as
    # whole only when it holds each of them at its size. None: written before this field.
    files: dict[str, int] | None = None


def save(
    algo: Any,
    directory: Path,
    meta: CheckpointMeta,
    *,
    game: GameSpec | None = None,
    league: League | None = None,
    timings: dict[str, float] | None = None,
    fence: Callable[[], None] | None = None,
) -> Path:
    """`timings`, when given, gets `state_s` (RLlib gathering and writing the
    algorithm's state) and `total_s` (that, and making the checkpoint whole and named).
    `fence` (the run's lease) is called right before the checkpoint is named and before
    `latest` names it: a writer that lost the run leaves only its hidden partial."""
    started = time.monotonic()
    path = directory / f"checkpoint_{meta.iteration:06d}"
    atomic.remove_leftovers(directory)  # of a save a lost pod or a full volume cut short
    # Filled under a hidden name, then renamed: a checkpoint is whole or absent, and
    # `latest` (renamed over last) never names one that is not whole.
    with atomic.directory(path) as partial:
        state_started = time.monotonic()
        algo.save_to_path(str(partial.resolve()))
        state_s = time.monotonic() - state_started
        partial.mkdir(exist_ok=True)
        if game is not None:
            (partial / GAME).write_text(game.to_json())
        if league is not None:
            (partial / LEAGUE).write_text(league.to_json())
        # META last, naming every other file with its size (`files`).
        files = {
            f.relative_to(partial).as_posix(): f.stat().st_size
            for f in sorted(partial.rglob("*"))
            if f.is_file()
        }
        (partial / META).write_text(json.dumps(asdict(replace(meta, files=files))))
        if fence is not None:
            fence()
    if fence is not None:
        fence()
    atomic.write_text(directory / LATEST, path.name)
    if timings is not None:
        timings.update(state_s=state_s, total_s=time.monotonic() - started)
    return path


# What each field of META holds, as a check and in words for the error.
_META_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "iteration": (lambda v: type(v) is int and v >= 0, "a whole number"),
    "env_steps_total": (lambda v: type(v) is int and v >= 0, "a whole number"),
    "algo": (lambda v: isinstance(v, str) and bool(v), "an algorithm's name"),
    "normalize_actions": (lambda v: type(v) is bool, "true or false"),
    "clip_actions": (lambda v: type(v) is bool, "true or false"),
    "env_runner": (lambda v: v in ("single_agent", "multi_agent"), "single_agent or multi_agent"),
    "files": (
        lambda v: (
            v is None
            or (isinstance(v, dict) and all(type(n) is int and n >= 0 for n in v.values()))
        ),
        "an object of each file's bytes",
    ),
}
DAMAGED = "the checkpoint is damaged; use another one (an earlier checkpoint_* beside it)"


def read_meta(path: Path) -> CheckpointMeta:
    """The checkpoint's META; a CheckpointError naming the file and, for a damaged one,
    each field that is missing, unknown or of the wrong kind."""
    file = path / META
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a uerl checkpoint ({META}: no such file)") from None
    except OSError as exc:
        raise CheckpointError(f"{file} cannot be read ({exc.strerror})") from None
    except ValueError as exc:  # JSON, or text that is not UTF-8
        raise CheckpointError(f"{file} is not JSON ({exc}): {DAMAGED}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} holds no JSON object: {DAMAGED}")
    defaults = {f.name: f.default for f in fields(CheckpointMeta)}
    problems = []
    missing = [
        name for name, default in defaults.items() if default is MISSING and name not in data
    ]
    if missing:
        problems.append("missing " + ", ".join(missing))
    problems += [
        f"{name} is {value!r}, not {_META_KINDS[name][1]}"
        for name, value in data.items()
        if name in _META_KINDS and not _META_KINDS[name][0](value)
    ]
    if problems:
        raise CheckpointError(f"{file}: {'; '.join(problems)}: {DAMAGED}")
    unknown = sorted(set(data) - set(defaults))
    if unknown:  # a newer uerl's field may change what the checkpoint means: not ignored
        raise CheckpointError(
            f"{file}: unknown field(s) {', '.join(unknown)}: written by a newer uerl? Use it"
        )
    return CheckpointMeta(**data)


def resolve(resume: str, checkpoint_dir: Path, *, flag: str = "--resume") -> Path:
    """`latest` -> the newest checkpoint in `checkpoint_dir`; otherwise a checkpoint path.
    Errors name `flag`, the option the user gave the path with."""
    if resume != LATEST:
        path = Path(resume)
        if (path / LATEST).is_file():  # a checkpoint directory was given
            return resolve(LATEST, path, flag=flag)
        if path.exists() and not path.is_dir():  # not "no such": it is there
            raise CheckpointError(f"{flag} {resume}: a file, not a checkpoint directory")
        if not path.is_dir():
            raise CheckpointError(f"{flag} {resume}: no such checkpoint directory")
        return path
    pointer = checkpoint_dir / LATEST
    try:
        path = checkpoint_dir / pointer.read_text().strip()
    except OSError:
        raise CheckpointError(
            f"{flag}: no checkpoint in {checkpoint_dir} (no {LATEST} file); "
            "pass --checkpoint-dir of an earlier run or --resume PATH"
        ) from None
    if not path.is_dir():
        raise CheckpointError(f"{flag}: {pointer} names {path}, which does not exist")
    return path


def _read_optional(file: Path, parse: Callable[[str], T], what: str) -> T | None:
    """`parse` of a checkpoint's optional JSON file, None when absent; a clear error when
    it cannot be read."""
    if not file.is_file():
        return None
    try:
        return parse(file.read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{file} is not {what}: {exc}") from None


def read_game(path: Path) -> GameSpec | None:
    """The game a checkpoint was trained for, or None for checkpoints without `game.json`."""
    from training.policies.game_spec import GameSpec

    return _read_optional(path / GAME, GameSpec.from_json, "a game definition")


def read_league(path: Path) -> League | None:
    """A self-play checkpoint's league (snapshots, ratings), or None."""
    from training.policies.self_play import League

    return _read_optional(path / LEAGUE, League.from_json, "a self-play league")


def load_modules(path: Path) -> Any:
    """The checkpoint's MultiRLModule (one RLModule per policy, by the game's policy ids),
    on CPU."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.rl_module import RLModule

    modules_dir = path / MODULES_SUBDIR
    if not modules_dir.is_dir():
        raise CheckpointError(
            f"{path} holds no trained modules ({MODULES_SUBDIR} is missing): "
            "pass a checkpoint written by uerl train / uerl local"
        )
    try:
        modules = RLModule.from_checkpoint(str(modules_dir.resolve()))
    except Exception:
        check_pickles(modules_dir)  # RLlib's unpickling error names no file
        raise
    if read_meta(path).env_runner == "single_agent" and DEFAULT_MODULE_ID in modules:
        policy_id = single_agent_policy(path)
        module = modules[DEFAULT_MODULE_ID]
        modules.remove_module(DEFAULT_MODULE_ID)
        modules.add_module(policy_id, module)
    return modules


def policy_ids(path: Path) -> list[str]:
    """The policies `load_modules` will give, read from the checkpoint's layout (one
    directory per module) without loading them: what a command asked of the checkpoint
    is checked in a moment, not after the modules load."""
    modules_dir = path / MODULES_SUBDIR
    if not modules_dir.is_dir():
        return []
    found = sorted(d.name for d in modules_dir.iterdir() if d.is_dir())
    if read_meta(path).env_runner == "single_agent" and SINGLE_AGENT_MODULE in found:
        found = sorted({*found, single_agent_policy(path)} - {SINGLE_AGENT_MODULE})
    return found


def single_agent_policy(path: Path) -> str:
    """The game's policy a single-agent checkpoint's one module (`default_policy`) is."""
    game = read_game(path)
    if game is None:
        raise CheckpointError(
            f"{path} was trained on the single-agent path but has no {GAME}: it cannot "
            "say which of the game's policies its module is"
        )
    policy_id = game.single_agent_policy()
    if policy_id is None:
        raise CheckpointError(
            f"{path} was trained on the single-agent path but its {GAME} names no "
            "one-agent game: it cannot say which policy its module is"
        )
    return policy_id


def check_loadable(path: Path, *, flag: str) -> None:
    """What `load_modules` will need, checked before anything starts: the modules'
    pickles load, and a single-agent checkpoint names its policy."""
    check_pickles(path / MODULES_SUBDIR, flag=flag)
    if read_meta(path).env_runner == "single_agent":
        single_agent_policy(path)


def check_pickles(directory: Path, *, flag: str = "") -> None:
    """Every pickle under `directory` (what RLlib loads from a checkpoint) loads; else a
    CheckpointError naming the first that does not (truncated by a full disk or a copy
    cut short, overwritten). RLlib's own unpickling error names no file."""
    import ray.cloudpickle as pickle  # what RLlib writes them with

    for file in sorted(directory.rglob("*.pkl")):
        try:
            with file.open("rb") as fh:
                pickle.load(fh)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            prefix = f"{flag}: " if flag else ""
            raise CheckpointError(
                f"{prefix}{file} cannot be loaded ({reason}): {DAMAGED}"
            ) from None


def resolve_checkpoint(given: Path, *, flag: str = "--checkpoint") -> Path:
    """`--checkpoint`: a checkpoint, or a checkpoint directory (its newest checkpoint)."""
    path = resolve(str(given), given, flag=flag)
    read_meta(path)  # fail here, naming the path, if it is not a uerl checkpoint
    return path
