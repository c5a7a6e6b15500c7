"""A refused topology's errors: one line per bad value, each naming its config path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from infra.config_path import format_path
from infra.k8s_rules import Invalid, described, did_you_mean


class TopologyError(ValueError):
    """Invalid topology: `problems`, each (config path, what is wrong), which its text
    lists one a line (the component package gives them to Pulumi as they are)."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        lines = [f"{path}: {message}" for path, message in self.problems]
        noun = "error" if len(lines) == 1 else "errors"
        super().__init__(f"invalid topology ({len(lines)} {noun}):\n  " + "\n  ".join(lines))


class FieldError(Invalid):
    """A check across fields, reported at the field it is about (`path` below the model)."""


def validation_problems(
    exc: ValidationError, root: str, model: type[BaseModel]
) -> list[tuple[str, str]]:
    """`exc`, raised validating `model` read from config key `root`: (path, message) each."""
    problems = []
    for err in exc.errors():
        loc = list(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, Invalid):
            loc += cause.path
        path = format_path([root, *loc])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            fields = _fields_at(model, err["loc"][:-1])
            hint = did_you_mean(str(err["loc"][-1]), fields) if fields else ""
            msg = f"unknown key{hint or ' (not a topology field)'}"
        elif err["type"] in ("model_type", "model_attributes_type"):
            # pydantic names the model's class, which is no name of the user's.
            msg = f"expected a map of its fields, got {described(err.get('input'))}"
        problems.append((path, msg.removeprefix("Value error, ")))
    return problems


def _fields_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The field names of the model at `loc` below `model` ([] if none is there)."""
    for part in loc:
        if isinstance(part, int):  # an item of a list of models: the same model
            continue
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return []
        model = inner
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, optionally, or as list items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        inner = _model_in(arg)
        if inner is not None:
            return inner
    return None
