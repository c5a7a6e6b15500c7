"""The topology reference, generated from `infra/topology/` so it cannot drift from it.

One row per field, nested models flattened to their config path (`ray.head.cpus`; a
list of models as `learners.tolerations[].key`): the type as written in the code, the
default, the constraints pydantic enforces and the field's description, its docstring
(a group of fields: its model's docstring too). The docs site renders it
(`docs/hooks.py`); `tests/test_docs.py` checks it lists every field.
"""

from __future__ import annotations

import ast
import inspect
import re
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from infra import topology

CONSTRAINTS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "max_length": "length <="}


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: str
    constraint: str
    comment: str

    @property
    def component_path(self) -> str:
        """The path as a program spells it for the component `uerl:index:TrainingCluster`
        in YAML, TypeScript and the schema (camelCase: `workers.nodeSelector`); Python's
        SDK and `uerl:topology` spell it as `path` does."""
        return ".".join(
            _camel(part.removesuffix("[]")) + ("[]" if part.endswith("[]") else "")
            for part in self.path.split(".")
        )


def _annotations(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its annotation as written (aliases kept), through the model's bases."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        (node,) = ast.parse(source).body
        for item in node.body:  # type: ignore[attr-defined]
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                found[item.target.id] = ast.unparse(item.annotation)
    return found


def description(model: type[BaseModel], name: str) -> str:
    """A field's description (its docstring, pydantic's `use_attribute_docstrings`); a
    subclass that re-declares a field (a new default) keeps its base's."""
    for cls in model.__mro__:
        fields = getattr(cls, "model_fields", None)
        if isinstance(cls, type) and issubclass(cls, BaseModel) and fields and name in fields:
            text = fields[name].description
            if text:
                return " ".join(text.split())
    return ""


# Aliases of `infra/topology/`, as a reader of the reference wants them spelled.
ALIASES = {
    "Text": "str",
    "Quantity": "quantity",
    "Cidr": "CIDR",
    "SecretName": "str",
    "AccountName": "str",
    "PriorityClassName": "str",
    "ClaimName": "str",
    "NamespaceName": "str",
    "StorageClassName": "str",
    "NodeSelector": "dict[str, str]",
    "Image": "image",
    "BucketName": "str",
    "KeyPrefix": "str",
    "EndpointUrl": "str",
    "RegionName": "str",
    "GpuResource": "str",
    "Labels": "dict[str, str]",
    "Annotations": "dict[str, str]",
    "Affinity": "dict",
    "SpreadConstraint": "dict",
}


def _type(written: str) -> str:
    """The annotation as written, aliases spelled out and Literal[...] as 'a' | 'b'."""
    for alias in ("Pattern", "ImagePullPolicy"):
        values = typing.get_args(getattr(topology, alias))
        written = written.replace(alias, " | ".join(repr(v) for v in values))
    for alias, plain in ALIASES.items():
        written = re.sub(rf"\b{alias}\b", plain, written)
    return re.sub(r"Literal\[([^\]]*)\]", lambda m: m.group(1).replace(", ", " | "), written)


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (directly, optionally or as list items); whether a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args:
        inner, _ = _nested_model(args[0])
        return inner, True
    for arg in args:  # Optional / unions
        inner, many = _nested_model(arg)
        if inner is not None:
            return inner, many
    return None, False


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "(below)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    return str(value)


def _constraint(info: FieldInfo) -> str:
    parts = []
    for item in info.metadata:
        for attr, symbol in CONSTRAINTS.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def rows(model: type[BaseModel] = topology.Topology, prefix: str = "") -> list[Row]:
    written_as = _annotations(model)
    out: list[Row] = []
    for name, info in model.model_fields.items():
        written = written_as.get(name, str(info.annotation))
        comment = description(model, name)
        path = f"{prefix}{name}"
        nested, many = _nested_model(info.annotation)
        if nested is not None and nested.__doc__:
            # A group of fields: the comment, then what the model's docstring says.
            doc = " ".join(inspect.cleandoc(nested.__doc__).split())
            comment = f"{comment} {doc}".strip()
        out.append(Row(path, _type(written), _default(info), _constraint(info), comment))
        if nested is not None:
            out.extend(rows(nested, f"{path}[]." if many else f"{path}."))
    return out


def _cell(text: str) -> str:
    """Markdown for a table cell. A `|` outside code would end the cell, so it is escaped;
    inside code it is left alone (Python-Markdown keeps a code span's pipes in its cell,
    and would show a `\\|` there with its backslash)."""
    parts = re.split(r"(`[^`]*`)", text.replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def _code(text: str) -> str:
    return f"`{text}`"


def markdown_table() -> str:
    lines = [
        "| path (`topology.` ...) | type | default | constraint | meaning |",
        "|---|---|---|---|---|",
    ]
    for row in rows():
        # The component's spelling under the config's, where they differ.
        spelled = f"<br>`{row.component_path}`" if row.component_path != row.path else ""
        lines.append(
            f"| `{row.path}`{spelled} | {_code(row.type)} | {_code(row.default)} | "
            f"{_cell(row.constraint)} | {_cell(row.comment)} |"
        )
    return "\n".join(lines)
