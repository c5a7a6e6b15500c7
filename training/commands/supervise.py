"""`uerl supervise`: keep one stored run training until it is done, resubmitting it to
the Ray head's job API when the head (or the job) is lost. It runs in the stack's
namespace, in the Job `uerl submit --supervise` makes; the supervisor's log is each
attempt's log in turn, with a line for every attempt and why it started.

    uerl supervise --address URL --run-name RUN [--max-restarts N] -- [train flags...]

Exit status: 0 the run ended (SUCCEEDED, or STOPPED by a person), 1 restarts used up
(--max-restarts in a row that stored no new checkpoint) or no head for 30 minutes, 2 bad
input (here, a job that failed on it, or the job API refusing the token in
RAY_AUTH_TOKEN), 143 stopped by SIGTERM (its pod deleted; the
attempt it followed goes on).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from training import exit_status
from training.commands.arg_types import (
    ArgumentsRefused,
    http_url,
    non_negative_int,
    parse_for,
    run_name,
)
from training.runstore.attempts import SUPERVISION_VARIABLE
from training.runstore.location import RUN_NAME_LIMITS

PROG = "uerl supervise"
TERMINATED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM. Not an Exception: the supervisor's wait-and-retry would take it for a
    head that does not answer."""


def _terminate(_signum: int, _frame: FrameType | None) -> None:
    raise Terminated


def build_parser() -> argparse.ArgumentParser:
    from training.supervise.supervisor import MAX_RESTARTS

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Keep a stored run training across a lost Ray head: submit `uerl train "
        "--run-name RUN --resume auto FLAGS` to the head's job API, follow it, and submit it "
        "again when the head loses it or it fails.",
    )
    parser.add_argument(
        "--address",
        required=True,
        type=http_url,
        metavar="URL",
        help="the head's job API (dashboard): an http(s) URL, e.g. http://uerl-head-svc:8265",
    )
    parser.add_argument(
        "--run-name",
        required=True,
        type=run_name,
        metavar="RUN",
        help=f"the run to keep going: {RUN_NAME_LIMITS}",
    )
    parser.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=MAX_RESTARTS,
        metavar="N",
        help="restarts in a row without a new checkpoint before giving up "
        f"(default {MAX_RESTARTS})",
    )
    return parser


def _set_by_the_supervisor(train: argparse.Namespace) -> str | None:
    """Why the train flags clash with the supervisor's own (None: they do not). Each
    attempt is `uerl train --run-name RUN --resume auto FLAGS`: a later flag would win,
    and the attempts would train a run the supervisor does not watch."""
    if train.run_name is not None:
        return f"--run-name {train.run_name}: the run is --run-name before `--`; leave it out here"
    return storage_flags_clash(train, "leave out --run-dir and --checkpoint-dir")


def storage_flags_clash(train: argparse.Namespace, instead: str) -> str | None:
    """Why train flags that choose where a run lives, or which checkpoint it starts from,
    cannot be a supervised run's (None: none is given); `instead`: what to do."""
    if train.run_dir is not None or train.checkpoint_dir is not None:
        return (
            "a supervised run lives in the stack's run storage, where every attempt finds "
            f"it: {instead}"
        )
    if train.resume is not None:
        return "the supervisor resumes the run itself (--resume auto): leave --resume out"
    return None


def main(argv: Sequence[str]) -> int:
    args_list = list(argv)
    cut = args_list.index("--") if "--" in args_list else len(args_list)
    args = build_parser().parse_args(args_list[:cut])
    train_args = args_list[cut + 1 :]
    from training.commands.train import build_parser as train_parser

    try:  # a typo is refused here, not by every attempt
        parse_for(train_parser(), ["--run-name", args.run_name, *train_args])
        problem = _set_by_the_supervisor(parse_for(train_parser(), train_args))
    except ArgumentsRefused as exc:
        problem = str(exc)
    if problem is not None:
        print(f"{PROG}: train flags (after `--`): {problem}", file=sys.stderr)
        return exit_status.BAD_INPUT
    from training.ray_auth import token_client
    from training.supervise.supervisor import Supervisor

    def connect():  # type: ignore[no-untyped-def]
        from ray.job_submission import JobSubmissionClient

        # The token (the stack's Secret, mounted: read now), sent as Ray's CLI would.
        return JobSubmissionClient(
            args.address, headers=token_client.headers(token_client.token_from_env())
        )

    def log(line: str) -> None:
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    supervisor = Supervisor(
        connect,
        args.run_name,
        train_args,
        log=log,
        max_restarts=args.max_restarts,
        # Its Job's uid, in a supervisor Job's pod; unset when run by hand.
        supervision=os.environ.get(SUPERVISION_VARIABLE) or None,
        # Read again after a refusal: a rotated Secret reaches the mounted file.
        token=token_client.token_from_env,
    )
    # Its pod deleted: as the container's first process it would ignore SIGTERM (no
    # default action for PID 1) and go on beside the pod the Job makes in its place.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return supervisor.run()
    except KeyboardInterrupt:
        log("interrupted; the current attempt goes on without a supervisor")
        return 130
    except Terminated:
        log("stopped (SIGTERM): the current attempt goes on; the Job's next pod follows it")
        return TERMINATED
    finally:
        signal.signal(signal.SIGTERM, previous)
