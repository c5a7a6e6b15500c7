"""Command-line options shared by `uerl train` and `uerl local` (same training code path)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.commands.arg_types import (
    int_in,
    non_negative_float,
    positive_float,
    positive_int,
    probability,
    run_name,
)
from training.commands.writable import check_writable_dir
from training.policies.configurations import (
    CONFIGURATIONS,
    PolicyConfiguration,
    PolicyConfigurationError,
    check_configuration,
)
from training.policies.self_play import MAX_WINDOW, SelfPlaySettings
from training.rllib import hparams as hp
from training.run import checkpoints
from training.run.options import DEFAULT_ITERATIONS, TrainOptions
from training.runstore.location import RUN_NAME_LIMITS, check_run_name, default_run_name

# --resume auto: the newest checkpoint if there is one, else a new run.
AUTO = "auto"
# The key of the --hparams YAML that chooses the policy configuration.
POLICIES_KEY = "policies"


def add_training_args(parser: argparse.ArgumentParser) -> None:
    # The order of the calls is the order of --help (and of its usage line).
    group = parser.add_argument_group("training")
    _add_algo_and_stop_args(group)
    _add_output_args(group)
    _add_policy_args(group)
    _add_self_play_args(parser.add_argument_group("self-play (--policies self_play)"))
    _add_checkpoint_args(group)
    _add_hyperparameter_args(group)
    _add_console_args(group)
    _add_fault_args(parser.add_argument_group("games that fail"))


def _add_algo_and_stop_args(group: argparse._ArgumentGroup) -> None:
    """Which algorithm, and when it stops."""
    group.add_argument("--algo", choices=hp.ALGOS, default="PPO", help="default PPO")
    stop = group.add_mutually_exclusive_group()
    stop.add_argument(
        "--iterations",
        type=positive_int,
        help=f"stop at this many iterations in total (default {DEFAULT_ITERATIONS})",
    )
    stop.add_argument("--timesteps", type=positive_int, help="stop at this many env steps in total")
    group.add_argument(
        "--stop-return", type=float, metavar="R", help="also stop once the return mean reaches R"
    )


def _add_output_args(group: argparse._ArgumentGroup) -> None:
    """Where the run writes."""
    group.add_argument(
        "--run-dir",
        type=Path,
        help="metrics CSV, learning curve, logs, checkpoints (default: the stack's run "
        "storage as the endpoints name it, else runs/; in it a directory named --run-name)",
    )
    group.add_argument(
        "--run-name",
        metavar="NAME",
        type=run_name,
        help=f"the run's directory in the run storage (default <cluster name>-<time>): "
        f"{RUN_NAME_LIMITS}; with --resume latest, the run to continue",
    )
    group.add_argument(
        "--checkpoint-dir", type=Path, help="checkpoints (default <run-dir>/checkpoints)"
    )


def _add_policy_args(group: argparse._ArgumentGroup) -> None:
    """Which policy each agent acts with, and which RLlib runner samples them."""
    group.add_argument(
        "--policies",
        choices=CONFIGURATIONS,
        help="which policy each agent acts with: by_type (one per Schola agent type, the "
        "default), shared (one for all agents; their spaces must agree), independent (one "
        "per agent), self_play (a learning policy against frozen snapshots of itself, rated "
        "with Elo), ctde (one actor per agent, one shared critic that sees every agent; "
        "PPO, at most one learner). Also `policies:` in --hparams YAML; --resume keeps the "
        "checkpoint's",
    )
    group.add_argument(
        "--env-runner",
        choices=hp.ENV_RUNNERS,
        default="auto",
        help="RLlib's runner and episodes: auto (the default) samples games with one agent "
        "per environment on RLlib's single-agent path, faster, and the others on its "
        "multi-agent one; multi_agent also for one-agent games (e.g. a game that leaves its "
        "agent out of some steps). --resume keeps the checkpoint's",
    )


def _add_self_play_args(league: argparse._ArgumentGroup) -> None:
    """The league of --policies self_play (SelfPlaySettings' defaults when not given)."""
    league.add_argument(
        "--snapshot-every",
        type=positive_int,
        metavar="K",
        help="snapshot the learner every K iterations (5)",
    )
    league.add_argument(
        "--window",
        type=int_in(1, MAX_WINDOW),
        metavar="W",
        help="opponents come from the last W snapshots (5)",
    )
    league.add_argument(
        "--p-current",
        type=probability,
        metavar="P",
        help="chance an opponent is the current learner instead of a snapshot (0.2)",
    )


def _add_checkpoint_args(group: argparse._ArgumentGroup) -> None:
    """How often to checkpoint, and which checkpoint to continue from."""
    group.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=5,
        metavar="K",
        help="every K iterations (5)",
    )
    group.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="PATH",
        help="continue from the newest checkpoint in --checkpoint-dir, or from PATH; "
        "`auto`: continue the run if it has a checkpoint, else start it (what a run "
        "restarted after a lost head is given)",
    )


def _add_hyperparameter_args(group: argparse._ArgumentGroup) -> None:
    """The seed and the algorithm's settings (merged by merged_hparams)."""
    group.add_argument("--seed", type=int)
    group.add_argument(
        "--hparams", type=Path, metavar="YAML", help="hyperparameters file (name: value)"
    )
    group.add_argument("--lr", type=float)
    group.add_argument("--gamma", type=float)
    group.add_argument(
        "--train-batch-size", type=positive_int, help="env steps per learner per update"
    )
    group.add_argument("--minibatch-size", type=positive_int)
    group.add_argument("--num-epochs", type=positive_int)
    group.add_argument("--entropy-coeff", type=float)
    group.add_argument(
        "--hp",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any training() option of the algorithm, e.g. --hp lambda_=0.9 (repeatable)",
    )


def _add_console_args(group: argparse._ArgumentGroup) -> None:
    """How long the start may take, and what reaches the console."""
    group.add_argument("--preflight-timeout", type=positive_float, default=30.0, metavar="S")
    group.add_argument(
        "--wait-for-nodes",
        type=non_negative_float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for Ray nodes offering the env runners' and learners' "
        "resources before refusing to start (default 0: refuse at once; `uerl submit "
        "--supervise` waits 600 for a new head's workers to rejoin it)",
    )
    group.add_argument(
        "--verbose",
        action="store_true",
        help="also print Ray's and RLlib's own output (default: only to <run-dir>/logs/ray.log)",
    )


def _add_fault_args(faults: argparse._ArgumentGroup) -> None:
    """How long the run waits for games that hang or go down."""
    faults.add_argument(
        "--request-timeout",
        type=positive_float,
        default=5.0,
        metavar="S",
        help="deadline of each game RPC: how long a hung game can hold its runner (5)",
    )
    faults.add_argument(
        "--fault-wait",
        type=positive_float,
        default=2.0,
        metavar="S",
        help="while a game is down, each sample of its runner waits this long for it (2)",
    )
    faults.add_argument(
        "--game-down-limit",
        type=positive_float,
        default=300.0,
        metavar="S",
        help="stop (final checkpoint, exit 1) when no game answered for this long (300)",
    )
    faults.add_argument(
        "--sample-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="how long an iteration waits for its runners' samples (RLlib's sample_timeout_s, "
        "60): with every game down, the run stops at most this long after --game-down-limit",
    )


def merged_hparams(args: argparse.Namespace) -> dict[str, Any]:
    layers: list[tuple[str, dict[str, Any]]] = []
    if args.hparams is not None:
        values = hp.load_yaml(args.hparams)
        values.pop(POLICIES_KEY, None)  # not an algorithm setting: see policies_from_args
        layers.append((str(args.hparams), values))
    # One layer per flag, so an error names the flag.
    layers += [
        (f"--{flag.replace('_', '-')}", {key: getattr(args, flag)})
        for flag, key in hp.FLAG_KEYS.items()
        if getattr(args, flag) is not None
    ]
    layers.append(("--hp", dict(hp.parse_assignment(a) for a in args.hp)))
    return hp.merge(args.algo, *layers)


def policies_from_args(args: argparse.Namespace) -> PolicyConfiguration | None:
    """--policies, else `policies:` in the --hparams YAML, else None (the checkpoint's on
    --resume, by_type otherwise)."""
    if args.policies is not None:
        return args.policies
    if args.hparams is None:
        return None
    value = hp.load_yaml(args.hparams).get(POLICIES_KEY)
    if value is None:
        return None
    try:
        return check_configuration(str(value))
    except PolicyConfigurationError as exc:
        raise hp.HyperparameterError(f"{args.hparams}: {exc}") from None


def check_flags(args: argparse.Namespace) -> None:
    """The hyperparameters and policies asked for, checked (as options_from_args does)
    before anything is reached or started."""
    merged_hparams(args)
    policies_from_args(args)


def run_name_from_args(args: argparse.Namespace, *, name: str) -> str:
    """--run-name, else `<name>-<time>`; refused with --run-dir (which places the run)."""
    if args.run_name is not None and args.run_dir is not None:
        raise ValueError("--run-name names a run in the run storage: give it or --run-dir")
    # An empty --run-name is refused by its type, never replaced by the default.
    return check_run_name(default_run_name(name) if args.run_name is None else args.run_name)


def options_from_args(
    args: argparse.Namespace,
    *,
    name: str,
    extra: dict[str, Any] | None = None,
    stored_run_dir: Path | None = None,
    say: Callable[[str], None] = print,
) -> TrainOptions:
    """`stored_run_dir`: the run's directory in the stack's run storage, unless --run-dir
    says otherwise; None: runs/<run name> here. `say`: where a choice made for the user
    (--resume auto starting a new run) is said."""
    run_dir = args.run_dir or stored_run_dir or Path("runs") / run_name_from_args(args, name=name)
    checkpoint_dir = args.checkpoint_dir or run_dir / "checkpoints"
    resume = args.resume
    if resume == AUTO:
        has_one = (checkpoint_dir / checkpoints.LATEST).is_file()
        resume = checkpoints.LATEST if has_one else None
        if not has_one:  # said: a mistyped --run-name would otherwise start over quietly
            say(f"--resume auto: no checkpoint in {checkpoint_dir} yet: a new run starts")
    if resume is not None:  # fail before starting anything
        resumed = checkpoints.resolve(resume, checkpoint_dir)
        checkpoints.read_meta(resumed)
        checkpoints.check_pickles(resumed, flag="--resume")
    check_writable_dir(run_dir, "--run-dir")
    check_writable_dir(checkpoint_dir, "--checkpoint-dir")
    return TrainOptions(
        algo=args.algo,
        iterations=args.iterations,
        timesteps=args.timesteps,
        stop_return=args.stop_return,
        run_dir=run_dir,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=resume,
        hparams=merged_hparams(args),
        policies=policies_from_args(args),
        env_runner=args.env_runner,
        self_play=SelfPlaySettings(
            **{
                key: value
                for key, value in (
                    ("snapshot_every", args.snapshot_every),
                    ("window", args.window),
                    ("p_current", args.p_current),
                )
                if value is not None
            }
        ),
        seed=args.seed,
        preflight_timeout_s=args.preflight_timeout,
        nodes_wait_s=args.wait_for_nodes,
        request_timeout_s=args.request_timeout,
        fault_wait_s=args.fault_wait,
        game_down_limit_s=args.game_down_limit,
        sample_timeout_s=args.sample_timeout,
        verbose=args.verbose,
        **(extra or {}),
    )
