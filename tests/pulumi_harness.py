"""Runs infra/__main__.py under Pulumi mocks, as `pulumi up` runs it, and prints a JSON report.

Invoked as a subprocess (one program run per process: Pulumi's runtime state
is global) by tests/infra_fixtures.py:

    python tests/pulumi_harness.py [program]  # config in env PULUMI_CONFIG, cwd = project root

`program` (default infra/, uerl's own) may be another program that makes the component,
as a team's would (tests/consumer_program.py).

Report: {"resources": [{type, name, custom, parent, dependencies, inputs, providers,
                        customTimeouts, retainOnDelete, aliases}],
         "exports": {...}, "error": null | {"type": ..., "message": ...}}
"""

from __future__ import annotations

import json
import runpy
import sys
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await


class RecordingMocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        # helm.v4.Chart is a remote component and invokes nothing locally; should
        # a version render the chart through the provider, it gets no objects.
        if args.token == "kubernetes:helm:template":
            return {"result": []}
        return {}


def _alias(alias: Any) -> dict[str, Any]:
    if alias.HasField("spec"):
        spec = alias.spec
        parent = None if spec.noParent else (spec.parentUrn or "inherited")
        return {"name": spec.name or None, "type": spec.type or None, "parent": parent}
    return {"urn": alias.urn}


def _timeouts(request: Any) -> dict[str, str] | None:
    if not request.HasField("customTimeouts"):
        return None
    t = request.customTimeouts
    values = {"create": t.create, "update": t.update, "delete": t.delete}
    return {k: v for k, v in values.items() if v} or None


class RecordingMonitor(MockMonitor):
    """Also records what MockResourceArgs omits: parent and dependencies."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.registrations: list[dict[str, Any]] = []

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.registrations.append(
                {
                    "urn": response.urn,
                    "type": request.type,
                    "name": request.name,
                    "custom": request.custom,
                    "parent": request.parent,
                    "dependencies": list(request.dependencies),
                    "inputs": pulumi.runtime.rpc.deserialize_properties(request.object),
                    # Provider references a component hands down / a resource uses.
                    "providers": dict(request.providers),
                    "provider": request.provider or None,
                    "customTimeouts": _timeouts(request),
                    # `pulumi destroy` leaves the object (and drops it from the state).
                    "retainOnDelete": bool(request.retainOnDelete),
                    # Unset: the engine takes the parent's (as it does `protect`).
                    "retainOnDeleteSet": request.HasField("retainOnDelete"),
                    "protect": bool(request.protect),
                    # Where the resource was before (an alias's spec: no parent, or which).
                    "aliases": [_alias(alias) for alias in request.aliases],
                }
            )
        return response


def main() -> int:
    monitor = RecordingMonitor(RecordingMocks())
    pulumi.runtime.set_mocks(
        monitor.mocks, project="uerl", stack="dev", preview=False, monitor=monitor
    )
    error = None
    program = sys.argv[1] if len(sys.argv) > 1 else "infra/"
    try:
        _sync_await(run_pulumi_func(lambda: runpy.run_path(program, run_name="__main__")))
    except pulumi.RunError as exc:
        error = {"type": "RunError", "message": str(exc)}
    except Exception as exc:  # report anything else too; the test shows it
        error = {"type": type(exc).__name__, "message": str(exc)}
    root = pulumi.runtime.get_root_resource()
    exports = _sync_await(pulumi.Output.from_input(root.outputs).future()) if error is None else {}
    # Dependencies and parents as "type::name" (names alone repeat across types).
    by_urn = {r["urn"]: f"{r['type']}::{r['name']}" for r in monitor.registrations}
    for record in monitor.registrations:
        record["parent"] = by_urn.get(record["parent"])
        record["dependencies"] = sorted(by_urn.get(u, u) for u in record["dependencies"])
        del record["urn"]
    json.dump(
        {"resources": monitor.registrations, "exports": exports, "error": error},
        sys.stdout,
        default=str,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
