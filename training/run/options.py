"""What a training run is asked for (`uerl train` / `uerl local`'s flags, validated).

Apart from the driver, which imports RLlib (seconds): the CLI checks its flags against
this before anything heavy is imported, so a bad flag is refused at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.policies.configurations import DEFAULT as DEFAULT_POLICIES
from training.policies.configurations import PolicyConfiguration, check_fits
from training.policies.self_play import SelfPlaySettings
from training.rllib.hparams import Algo, EnvRunnerChoice
from training.run import checkpoints

DEFAULT_ITERATIONS = 10


class TrainOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algo: Algo = "PPO"
    # Totals, counted across resumes: `--iterations 6 --resume` after 4 runs 2 more.
    iterations: int | None = Field(default=None, ge=1)
    timesteps: int | None = Field(default=None, ge=1)
    # Also stop once the episode return mean reaches this (e.g. a solved env).
    stop_return: float | None = None
    run_dir: Path
    checkpoint_dir: Path
    checkpoint_every: int = Field(default=5, ge=1)
    resume: str | None = None
    hparams: dict[str, Any]
    seed: int | None = None
    preflight_timeout_s: float = Field(default=30.0, gt=0)
    # How long the start may wait for nodes offering what the run needs (a supervised
    # attempt on a new head waits for the workers to rejoin it); 0: refuse at once.
    nodes_wait_s: float = Field(default=0.0, ge=0)
    # Per game RPC: how long a hung game can hold up its env runner.
    request_timeout_s: float = Field(default=5.0, gt=0)
    # While a game is down, each sample() of its runner waits at most this for it.
    fault_wait_s: float = Field(default=2.0, gt=0)
    # Stop (final checkpoint, exit 1) once no game has answered for this long.
    game_down_limit_s: float = Field(default=300.0, gt=0)
    # How long an iteration waits for its runners' samples (RLlib's sample_timeout_s). With
    # every game down an iteration ends only at this timeout, so it bounds the give-up too.
    sample_timeout_s: float = Field(default=60.0, gt=0)
    # Overrides endpoints.ray.gcs_address (e.g. a port-forward or ray://).
    ray_address: str | None = None
    # Which policy each agent acts with; None: the checkpoint's on --resume, else by_type.
    policies: PolicyConfiguration | None = None
    # --policies self_play: snapshots every K iterations, window W, chance P of the current.
    self_play: SelfPlaySettings = Field(default_factory=SelfPlaySettings)
    # RLlib's single-agent or multi-agent runner and episodes; auto: single-agent for
    # games with one agent per environment. --resume keeps the checkpoint's.
    env_runner: EnvRunnerChoice = "auto"
    # Re-read between iterations: games and env runners follow its num_env_runners
    # (a rescale while training). None: the run keeps the games it started with.
    endpoints_file: Path | None = None
    # Ray's and RLlib's own output on the console too, as Ray prints it (--verbose).
    verbose: bool = False

    @model_validator(mode="after")
    def _default_stop(self) -> TrainOptions:
        if self.iterations is None and self.timesteps is None:
            self.iterations = DEFAULT_ITERATIONS
        return self


def check_before_start(options: TrainOptions, *, num_learners: int) -> None:
    """Contradictions the arguments already show (ctde with APPO or with more than one
    learner, a resumed checkpoint's other policies or env runner), found before Ray or any
    game starts. Those that need the game (ctde on a one-agent game) wait for discovery."""
    check_fits(run_policies(options), algo=options.algo, num_learners=num_learners)
    run_env_runner(options)


def run_policies(options: TrainOptions) -> PolicyConfiguration:
    """The run's policy configuration: asked for, else the resumed checkpoint's, else
    by_type. A resumed run cannot change it: its policies are the checkpoint's modules."""
    trained: PolicyConfiguration | None = None
    if options.resume is not None:
        path = checkpoints.resolve(options.resume, options.checkpoint_dir)
        game = checkpoints.read_game(path)
        trained = game.policies if game is not None else DEFAULT_POLICIES
        if options.policies is not None and options.policies != trained:
            raise checkpoints.CheckpointError(
                f"--resume {path}: its policies are {trained}, this run asks "
                f"--policies {options.policies}; resume without --policies, or start a new run"
            )
    return options.policies or trained or DEFAULT_POLICIES


def run_env_runner(options: TrainOptions) -> EnvRunnerChoice:
    """The run's env runner path: asked for, else the resumed checkpoint's (its modules are
    named for that path), else auto."""
    if options.resume is None:
        return options.env_runner
    path = checkpoints.resolve(options.resume, options.checkpoint_dir)
    trained = checkpoints.read_meta(path).env_runner
    if options.env_runner not in ("auto", trained):
        raise checkpoints.CheckpointError(
            f"--resume {path}: it was trained with --env-runner {trained}, this run asks "
            f"--env-runner {options.env_runner}; resume without --env-runner, or start a new run"
        )
    return trained
