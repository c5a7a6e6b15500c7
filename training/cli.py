"""The `uerl` console script.

Each subcommand lives in its own module and is imported only when chosen, so
`uerl render` never loads Ray or torch and `uerl train` never loads Pulumi.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import io
import sys
from collections.abc import Sequence

from training import exit_status

# name -> (module exposing main(argv) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("infra.render", "print the Kubernetes objects a stack would create (offline)"),
    "local": ("training.commands.local", "run the whole topology on this machine and train"),
    "train": ("training.commands.train", "train PPO against a deployed topology's endpoints"),
    "discover": ("training.commands.discover", "print a game's agents and spaces"),
    "mock-ue": ("training.commands.mock_ue", "serve Schola's GymService for gymnasium envs"),
    "bench": ("training.bench.stepping", "benchmark gRPC stepping against in-process stepping"),
    "bench-runner": (
        "training.bench.runner_step",
        "one env runner's time per step: in-process, behind a round trip, on a game",
    ),
    "bench-faults": ("training.bench.game_faults", "measure what a game fault costs training"),
    "bench-policies": (
        "training.bench.policy_runs",
        "compare policy configurations at the same step budget",
    ),
    "bench-self-play": (
        "training.bench.self_play_range",
        "self-play on Sumo over seeds: wins, draws, losses against random and snapshot 0",
    ),
    "submit": (
        "training.commands.submit",
        "run `uerl train` (or eval) on a stack's cluster as a Ray job, from this machine",
    ),
    "runs": ("training.commands.runs", "list a stack's stored runs, pull one to this machine"),
    "watch": (
        "training.commands.watch",
        "a running training in the terminal: iterations, runners' throughput, game health",
    ),
    "supervise": (
        "training.commands.supervise",
        "keep a stored run training across a lost Ray head (in the stack, from submit)",
    ),
    "eval": ("training.commands.eval", "play a checkpoint's policies against the games"),
    "export": ("training.commands.export", "write a checkpoint's policies as ONNX for Schola"),
    "tls-secret": ("training.commands.tls_secret", "make a CA and the games' TLS certificate"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: uerl <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `uerl <command> --help` for a command's options."]
    return "\n".join(lines)


def _report_crashes() -> None:
    """A crash in native code (Ray's core worker, gRPC, torch) then says where each
    thread was, on stderr, instead of ending the command with a bare signal."""
    # Called in-process with its output captured, stderr is no file: nowhere to say it.
    with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
        faulthandler.enable(all_threads=True)


def main(argv: Sequence[str] | None = None) -> int:
    _report_crashes()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:  # no command: usage on stderr, exit 2, as argparse does for a missing one
        print(_usage(), file=sys.stderr)
        return exit_status.BAD_INPUT
    if args[0] in ("-h", "--help", "help"):
        print(_usage())
        return exit_status.OK
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"uerl: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return exit_status.BAD_INPUT
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or exit_status.OK)
    except exit_status.UserError as exc:  # a refusal a command did not print itself
        print(f"uerl {name}: {exc}", file=sys.stderr)
        return exc.status


if __name__ == "__main__":
    sys.exit(main())
