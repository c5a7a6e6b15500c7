"""Hyperparameters: uerl's defaults per algorithm < a YAML file < command-line flags.

Keys are the algorithm's own `AlgorithmConfig.training()` options (e.g. `lr`,
`num_epochs`, `lambda_`), plus `fcnet_hiddens` for the policy network. A key
the chosen algorithm does not know is an error that names it.
"""

from __future__ import annotations

import difflib
import numbers
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Algo = Literal["PPO", "APPO", "IMPALA"]
ALGOS: tuple[Algo, ...] = ("PPO", "APPO", "IMPALA")
# Which RLlib runner and episodes a run samples with (`training.rllib.algorithm`); auto:
# single-agent for games with one agent per environment, multi-agent for the others.
EnvRunnerChoice = Literal["auto", "single_agent", "multi_agent"]
ENV_RUNNERS: tuple[EnvRunnerChoice, ...] = ("auto", "single_agent", "multi_agent")
MODEL_KEYS = frozenset({"fcnet_hiddens", "fcnet_activation"})

# Small, fast-learning settings for a 2-core machine; RLlib's own defaults
# (e.g. PPO's 30 epochs over 4000 steps) are sized for bigger clusters.
DEFAULTS: dict[str, dict[str, Any]] = {
    "PPO": {
        "lr": 3e-4,
        "gamma": 0.99,
        "lambda_": 0.95,
        "clip_param": 0.2,
        "train_batch_size_per_learner": 2000,
        "minibatch_size": 250,
        "num_epochs": 6,
        "vf_loss_coeff": 0.01,
        "entropy_coeff": 0.0,
        "fcnet_hiddens": [64, 64],
    },
    "APPO": {
        "lr": 5e-4,
        "gamma": 0.99,
        "train_batch_size_per_learner": 500,
        "vf_loss_coeff": 0.5,
        "entropy_coeff": 0.0,
        "fcnet_hiddens": [64, 64],
    },
    "IMPALA": {
        "lr": 5e-4,
        "gamma": 0.99,
        "train_batch_size_per_learner": 500,
        "vf_loss_coeff": 0.5,
        "entropy_coeff": 0.0,
        "fcnet_hiddens": [64, 64],
    },
}

# Flag name -> training() key, for the most used ones.
FLAG_KEYS = {
    "lr": "lr",
    "gamma": "gamma",
    "train_batch_size": "train_batch_size_per_learner",
    "minibatch_size": "minibatch_size",
    "num_epochs": "num_epochs",
    "entropy_coeff": "entropy_coeff",
}


Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]


class HyperparameterRanges(BaseModel):
    """The values the common options can take; any one out of range trains into NaN or
    nothing (a negative lr climbs the loss, gamma 7 makes returns diverge, a negative
    batch samples nothing), so it is refused before anything starts. Options not listed
    are checked for their type only."""

    model_config = ConfigDict(extra="ignore")

    lr: Rate | None = None
    gamma: Fraction | None = None
    lambda_: Fraction | None = None
    clip_param: Rate | None = None
    vf_clip_param: Rate | None = None
    grad_clip: Rate | None = None
    kl_target: Rate | None = None
    kl_coeff: Weight | None = None
    vf_loss_coeff: Weight | None = None
    entropy_coeff: Weight | None = None
    train_batch_size: Count | None = None
    train_batch_size_per_learner: Count | None = None
    minibatch_size: Count | None = None
    num_epochs: Count | None = None


class HyperparameterError(ValueError):
    """A hyperparameter is unknown or of the wrong type; the message names it and its source."""


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise HyperparameterError(
            f"cannot read hyperparameter file {path}: {exc.strerror}"
        ) from None
    except UnicodeDecodeError as exc:
        raise HyperparameterError(
            f"hyperparameter file {path} is not UTF-8 text (offset {exc.start})"
        ) from None
    except yaml.YAMLError as exc:
        raise HyperparameterError(f"hyperparameter file {path} is not YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise HyperparameterError(f"hyperparameter file {path} must be a mapping of name: value")
    return data


def parse_assignment(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE read as YAML (numbers, lists, booleans)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise HyperparameterError(f"--hp {text!r}: expected KEY=VALUE, e.g. --hp lr=1e-4")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise HyperparameterError(f"--hp {text!r}: value is not YAML: {exc}") from None


def merge(algo: Algo, *layers: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Defaults for `algo`, then each (source, values) layer in order, validated."""
    defaults = dict(DEFAULTS[algo])
    # Only when there is a value to check: it loads RLlib, seconds before a refusal of
    # any other flag (`uerl submit` checks the train flags before reaching the cluster).
    template = training_options(algo) if any(values for _, values in layers) else {}
    merged = dict(defaults)
    for source, values in layers:
        for key, value in values.items():
            _check(algo, template, key, value, source)
            merged[key] = value
    return merged


def split(hparams: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training() kwargs, model_config kwargs)."""
    training = {k: v for k, v in hparams.items() if k not in MODEL_KEYS}
    model = {k: v for k, v in hparams.items() if k in MODEL_KEYS}
    return training, model


def training_options(algo: Algo) -> dict[str, Any]:
    """Every option `training()` of `algo` accepts (along its class hierarchy) -> default."""
    import inspect

    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    cls = {"PPO": PPOConfig, "APPO": APPOConfig, "IMPALA": IMPALAConfig}[algo]
    config = cls()
    keys: set[str] = set()
    for klass in cls.__mro__:
        method = vars(klass).get("training")
        if method is not None:
            keys |= set(inspect.signature(method).parameters) - {"self", "kwargs"}
    return {key: getattr(config, key, None) for key in keys}


def _check(algo: Algo, template: dict[str, Any], key: str, value: Any, source: str) -> None:
    if key in MODEL_KEYS:
        if key == "fcnet_hiddens" and not (
            isinstance(value, list) and value and all(isinstance(v, int) and v > 0 for v in value)
        ):
            raise HyperparameterError(
                f"{source}: fcnet_hiddens must be a list of positive layer sizes, got {value!r}"
            )
        return
    if key not in template:
        # A key that is part of options (lambda, lambda_), else one a letter or two off.
        close = sorted(k for k in template if key.rstrip("_") in k)[:5]
        close = close or difflib.get_close_matches(key, list(template), n=1, cutoff=0.8)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise HyperparameterError(f"{source}: {key!r} is not a {algo} training option{hint}")
    default = template[key]
    is_number = isinstance(value, numbers.Number) and not isinstance(value, bool)
    if isinstance(default, numbers.Number) and not isinstance(default, bool) and not is_number:
        raise HyperparameterError(
            f"{source}: {key} must be a number, got {value!r} ({type(value).__name__})"
        )
    if isinstance(default, bool) and not isinstance(value, bool):
        raise HyperparameterError(f"{source}: {key} must be true or false, got {value!r}")
    _check_range(key, value, source)


def _check_range(key: str, value: Any, source: str) -> None:
    try:
        HyperparameterRanges.model_validate({key: value})
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"]
        reason = reason[0].lower() + reason[1:]  # pydantic's "Input should be ..."
        raise HyperparameterError(f"{source}: {key}={value!r}: {reason}") from None
