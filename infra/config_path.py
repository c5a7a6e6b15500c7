"""`pulumi config set --path` semantics, for `uerl render --set` (no Pulumi CLI needed).

Paths: `topology.workers.replicas`, `topology.learners.tolerations[0].key`,
`topology.learners.node_selector["kubernetes.io/arch"]`. Values: like Pulumi
with --path, `true`/`false` become booleans and decimal integers become ints;
everything else stays a string (the topology model converts "1.5" etc.).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_TOKEN = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]|\["([^"]+)"\]')
_INT = re.compile(r"^-?(0|[1-9][0-9]*)$")


class ConfigPathError(ValueError):
    pass


def parse_path(path: str) -> list[str | int]:
    """`a.b[0]["c.d"]` -> ["a", "b", 0, "c.d"]."""
    parts: list[str | int] = []
    pos = 0
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        if match is None or (pos == 0 and path.startswith(".")):
            raise ConfigPathError(f"cannot parse config path {path!r} at {path[pos:]!r}")
        name, index, quoted = match.groups()
        parts.append(int(index) if index is not None else (name or quoted))
        pos = match.end()
    if not parts:
        raise ConfigPathError("empty config path")
    return parts


def parse_value(text: str) -> bool | int | str:
    if text in ("true", "false"):
        return text == "true"
    if _INT.match(text):
        return int(text)
    return text


def set_path(root: dict[str, Any], path: list[str | int], value: Any) -> None:
    """Set `value` at `path` inside `root`, creating maps and lists on the way."""
    node: Any = root
    for depth, (key, next_key) in enumerate(zip(path, [*path[1:], None], strict=True)):
        where = format_path(path[: depth + 1])
        if isinstance(key, int):
            if not isinstance(node, list):
                raise ConfigPathError(f"{format_path(path[:depth])} is not a list")
            if key > len(node):
                raise ConfigPathError(f"{where}: index past the end of a list of {len(node)}")
            if key == len(node):
                node.append(None)
        elif not isinstance(node, dict):
            raise ConfigPathError(f"{format_path(path[:depth])} is not a map")
        if next_key is None:
            node[key] = value
            return
        child = node[key] if (isinstance(key, int) or key in node) else None
        if child is None:
            child = [] if isinstance(next_key, int) else {}
            node[key] = child
        node = child


def format_path(path: Sequence[str | int]) -> str:
    """A path in the syntax `pulumi config set --path` takes, e.g.
    ["topology", "tolerations", 0, "a.b/c"] -> `topology.tolerations[0]["a.b/c"]`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out
