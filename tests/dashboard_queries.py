"""The Grafana dashboard of the repository (infra/dashboards/uerl-training.json) read as the
tests need it: its panels' queries, with the template variables put in as Grafana would."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = PROJECT_ROOT / "infra" / "dashboards" / "uerl-training.json"

# `$name` and `${name}` (Grafana's `${name:format}` too).
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
# A metric name as a query names it: not a label (followed by `=`, `!=`, `=~`, `!~`),
# not a function (followed by `(`), not inside a string.
METRIC_NAME = re.compile(r"\b((?:ray_)?uerl_\w+)\b")


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that queries (rows' own panels included), in the dashboard's order."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


@dataclass(frozen=True)
class Query:
    panel: str  # the panel's title
    ref: str  # the target's refId
    expr: str  # as written, with its template variables
    legend: str
    instant: bool  # a stat panel's: one value at the dashboard's end time

    @property
    def name(self) -> str:
        return f"{self.panel!r} {self.ref}"

    def with_values(self, values: dict[str, str]) -> str:
        """`expr` with each variable replaced by its value (an unknown one is an error)."""

        def value(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            if name not in values:
                raise KeyError(f"{self.name}: no value for ${name} in {self.expr}")
            return values[name]

        return VARIABLE.sub(value, self.expr)


def queries(dashboard: dict[str, Any]) -> list[Query]:
    return [
        Query(
            panel["title"],
            target["refId"],
            target["expr"],
            target.get("legendFormat", ""),
            bool(target.get("instant")) and not target.get("range"),
        )
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def variables_in(expr: str) -> set[str]:
    return {m.group(1) or m.group(2) for m in VARIABLE.finditer(expr)}


def metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return {
        m.group(1)
        for m in METRIC_NAME.finditer(without_strings)
        if not re.match(r"\s*(?:[=!]~?|\()", without_strings[m.end() :])
    }
