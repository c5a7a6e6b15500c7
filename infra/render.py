"""`uerl render`: print every Kubernetes object a stack would create, like `helm template`.

No cluster, no Pulumi CLI, no Pulumi import: the topology comes from a stack
file (`--stack`), a file (`--topology`) or defaults, `--set` applies
`pulumi config set --path` edits, and the objects are the ones the Pulumi
program registers (infra.manifests).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from infra import manifests
from infra.config_path import ConfigPathError, parse_path, parse_value, set_path
from infra.topology import Topology, TopologyError

PROJECT = "uerl"
CONFIG_KEY = f"{PROJECT}:topology"
ROOT = "topology"
# The stack `uerl render` and `uerl local` read when given neither --stack nor --topology.
DEFAULT_STACK = "dev"
# Keys of a Pulumi stack file beside `config:`; a topology has none of them.
STACK_FILE_KEYS = frozenset({"config", "encryptionsalt", "secretsprovider", "encryptedkey"})


class RenderError(Exception):
    """A user error: printed as one line, exit status 2."""


def find_project_root(start: Path) -> Path:
    for directory in (start, *start.parents):
        if (directory / "Pulumi.yaml").is_file():
            return directory
    raise RenderError(f"no Pulumi.yaml in {start} or any parent directory")


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RenderError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise RenderError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}): a topology or stack file is YAML or JSON"
        ) from None
    except yaml.YAMLError as exc:
        # One line, where: str(exc) is several, naming "<unicode string>" for the file.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RenderError(f"{path} is not valid YAML{where}: {problem}") from None


def stack_file(stack: str, cwd: Path) -> Path:
    """Pulumi.<stack>.yaml of the project holding `cwd`."""
    root = find_project_root(cwd)
    project = _load_yaml(root / "Pulumi.yaml") or {}
    config_dir = root / str(project.get("stackConfigDir", "."))
    return config_dir / f"Pulumi.{stack}.yaml"


def stack_topology(stack: str, cwd: Path) -> dict[str, Any]:
    """The `uerl:topology` value of Pulumi.<stack>.yaml ({} when unset)."""
    path = stack_file(stack, cwd)
    if not path.is_file():
        known = sorted(p.name.split(".")[1] for p in path.parent.glob("Pulumi.*.yaml"))
        raise RenderError(f"no stack file {path} (stack files here: {', '.join(known) or 'none'})")
    whole = _load_yaml(path) or {}
    if not isinstance(whole, dict):
        raise RenderError(f"{path}: a stack file must be a map, got {type(whole).__name__}")
    config = whole.get("config") or {}
    if not isinstance(config, dict):
        raise RenderError(f"{path}: config must be a map, got {type(config).__name__}")
    _no_unknown_project_keys(path, config)
    # Stack files may omit the project namespace for the project's own keys.
    value = config.get(CONFIG_KEY, config.get(ROOT))
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RenderError(f"{path}: {CONFIG_KEY} must be a map, got {type(value).__name__}")
    return value


def _no_unknown_project_keys(path: Path, config: dict[str, Any]) -> None:
    """The program reads only `uerl:topology`: another key of the project (`uerl:...`, or a
    key without a namespace) is a misspelling that would silently leave the defaults."""
    for key in config:
        namespace, sep, name = str(key).rpartition(":")
        if (namespace == PROJECT or not sep) and name != ROOT:
            close = difflib.get_close_matches(name, [ROOT], n=1)
            hint = f" (did you mean {CONFIG_KEY}?)" if close else ""
            raise RenderError(
                f"{path}: config key {key!r} is not one uerl reads{hint}; the topology is "
                f"{CONFIG_KEY}"
            )


def file_topology(path: Path) -> dict[str, Any]:
    # JSON is YAML, so one loader reads both.
    value = _load_yaml(path)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RenderError(f"{path}: a topology must be a map, got {type(value).__name__}")
    if STACK_FILE_KEYS & set(value):
        stack = path.name.split(".")[1] if path.name.startswith("Pulumi.") else "STACK"
        raise RenderError(
            f"{path} is a Pulumi stack file (it has `config:`), not a topology: pass "
            f"--stack {stack} to read its {CONFIG_KEY}, or give --topology a file holding "
            "only the topology's fields"
        )
    # Accept the bare topology or a {topology: ...} wrapper.
    if set(value) == {ROOT}:
        value = value[ROOT] or {}
    return value


def apply_sets(data: dict[str, Any], assignments: Sequence[str]) -> dict[str, Any]:
    wrapped: dict[str, Any] = {ROOT: json.loads(json.dumps(data))}
    for assignment in assignments:
        path_text, sep, value = assignment.partition("=")
        if not sep:
            raise RenderError(f"--set {assignment!r}: expected PATH=VALUE")
        try:
            path = parse_path(path_text)
            if path[0] != ROOT or len(path) < 2:
                raise ConfigPathError(f"paths start with '{ROOT}.' (got {path_text!r})")
            set_path(wrapped, path, parse_value(value))
        except ConfigPathError as exc:
            raise RenderError(f"--set {assignment!r}: {exc}") from None
    return wrapped[ROOT]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, endpoints.json) as literal blocks, readable."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_object(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def render(
    topology: Topology, project_root: Path | None = None, *, source: str | None = None
) -> str:
    """`project_root`: where relative topology paths start (default: this checkout);
    `source`: where the topology came from, for the header."""
    built = manifests.build(topology, project_root or manifests.PROJECT_ROOT)
    header = [
        f"# uerl render: topology {topology.name!r}, pattern {topology.pattern}, "
        f"namespace {topology.namespace}"
    ]
    if source is not None:
        header.append(f"# Topology from: {source}")
    if built.operator is not None:
        header.append(f"# Operator (not rendered): {built.operator.describe()}")
    else:
        header.append("# Operator: not installed by the stack (operator.install: false)")
    docs = [dump_object(obj) for obj in built.objects()]
    return "\n".join(header) + "\n" + "".join(f"---\n{doc}" for doc in docs)


def build_topology(args: argparse.Namespace, cwd: Path) -> tuple[Topology, str | None]:
    """The topology, and where it came from when the user did not say: --topology, --stack,
    else the dev stack as `uerl local` reads it (the defaults outside a project or without
    that stack file)."""
    source = None
    if args.topology is not None:
        data = file_topology(Path(args.topology))
    elif args.stack is not None:
        data = stack_topology(args.stack, cwd)
    else:
        data, source = _default_stack(cwd)
    return Topology.parse(apply_sets(data, args.set), root=ROOT), source


def _default_stack(cwd: Path) -> tuple[dict[str, Any], str]:
    try:
        path = stack_file(DEFAULT_STACK, cwd)
    except RenderError:
        return {}, "the defaults (no Pulumi.yaml here or above; --stack or --topology to choose)"
    if not path.is_file():
        return {}, f"the defaults (no {path}; --stack or --topology to choose)"
    return stack_topology(DEFAULT_STACK, cwd), (
        f"{path} (the default stack, as `uerl local`; --stack or --topology to choose)"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="uerl render",
        description="Print the Kubernetes objects a stack would create (multi-document YAML).",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--stack",
        help=f"read uerl:topology from Pulumi.STACK.yaml (default: {DEFAULT_STACK}, if present)",
    )
    source.add_argument("--topology", metavar="FILE", help="read the topology from YAML/JSON")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="like `pulumi config set --path PATH VALUE`, e.g. topology.workers.replicas=4",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        topology, source = build_topology(args, Path.cwd())
        try:
            # Relative paths (operator.chart_path) start at the project root, as in `pulumi up`.
            root = find_project_root(Path.cwd())
        except RenderError:
            root = Path.cwd()
        text = render(topology, root, source=source)
    except (RenderError, TopologyError) as exc:
        print(f"uerl render: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
