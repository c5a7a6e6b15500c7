"""The Grafana dashboard (infra/dashboards/uerl-training.json) imports as is and queries only
what uerl publishes: its structure, its template variables, every metric name against
training/telemetry/ray_metrics.py, and every query parsed by Prometheus' own promtool.
(tests/test_metrics_e2e.py runs each query against a real Prometheus holding a run.)"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import dashboard_queries as dq
import pytest
from prometheus_server import FETCH_SCRIPT, cached_binary, promtool_binary

from training.telemetry import ray_metrics as rm

PREFIX = "ray_"  # Ray's metrics agent puts it before every published name
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# What a query of the dashboard may use: its own variables (Grafana's built-in ones would
# need a value here too: there is none).
SAMPLE_VALUES = {"stack": "uerl", "run": "first", "window": "1m", "datasource": "x"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return dq.load()


@pytest.fixture(scope="module")
def promtool() -> Path:
    """Debian's promtool, fetched once (a few seconds) into the cache outside the clone.
    Skipped only on a machine with neither the cached copy nor apt to fetch it."""
    fetchable = all(shutil.which(tool) for tool in ("apt-get", "dpkg-deb", "flock"))
    if not cached_binary().exists() and not fetchable:
        pytest.skip(f"no apt-get here: {FETCH_SCRIPT.name} cannot fetch Debian's promtool")
    return promtool_binary()


def scraped_names(spec: rm.MetricSpec) -> set[str]:
    base = PREFIX + spec.name
    if spec.kind == "histogram":
        return {base + suffix for suffix in ("_bucket", "_sum", "_count")}
    return {base}


def test_the_dashboard_is_one_json_object_grafana_imports(dashboard: dict) -> None:
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"] and len(dashboard["uid"]) <= 40
    assert "__inputs" not in dashboard  # nothing to map at import: the variable picks it
    assert "id" not in dashboard or dashboard["id"] is None  # an export's id breaks import
    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for row in dashboard["panels"] for p in row.get("panels", [])
    ]
    assert len(ids) == len(set(ids))
    for panel in dq.panels(dashboard):
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24 and box["w"] > 0 and box["h"] > 0, panel["title"]


def test_a_datasource_variable_of_type_prometheus_feeds_every_panel_and_variable(
    dashboard: dict,
) -> None:
    variables = dq.variables(dashboard)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dq.panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (panel["title"], target["refId"])
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    for name in ("stack", "run"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == DATASOURCE


def test_stack_and_run_come_from_label_values_of_uerls_metrics(dashboard: dict) -> None:
    variables = dq.variables(dashboard)
    assert variables["stack"]["definition"] == "label_values(ray_uerl_env_runners, stack)"
    assert (
        variables["run"]["definition"] == 'label_values(ray_uerl_env_runners{stack=~"$stack"}, run)'
    )
    for name in ("stack", "run"):
        assert variables[name]["query"]["query"] == variables[name]["definition"]
        assert variables[name]["multi"] and variables[name]["includeAll"]


def test_every_query_selects_by_stack_and_run_and_names_only_its_variables(
    dashboard: dict,
) -> None:
    defined = set(dq.variables(dashboard))
    for query in dq.queries(dashboard):
        assert dq.variables_in(query.expr) <= defined, query.name
        # Each selector of a uerl metric is narrowed to the chosen stack and run.
        for selector in query.expr.split("ray_uerl_")[1:]:
            body = selector.split("}", 1)[0]
            assert 'stack=~"$stack"' in body and 'run=~"$run"' in body, (query.name, body)
        # A rate or an increase over the window the dashboard offers, never a fixed one.
        for window in query.expr.split("[")[1:]:
            assert window.startswith("$window]"), query.name


def test_every_metric_a_query_names_is_one_uerl_publishes_as_scraped(dashboard: dict) -> None:
    published = {name for spec in rm.ALL_METRICS for name in scraped_names(spec)}
    named: set[str] = set()
    for query in dq.queries(dashboard):
        names = dq.metric_names(query.expr)
        assert names, query.name
        assert names <= published, (query.name, names - published)
        named |= names
    # ...and every metric uerl publishes has a panel (a new one needs its panel).
    unshown = [spec.name for spec in rm.ALL_METRICS if not scraped_names(spec) & named]
    assert not unshown, f"no panel shows {unshown}: add one to {dq.DASHBOARD.name}"


def test_the_name_check_catches_a_name_without_rays_prefix_and_a_bare_histogram() -> None:
    assert dq.metric_names('rate(uerl_env_steps_total{run=~"$run"}[$window])') == {
        "uerl_env_steps_total"
    }
    assert dq.metric_names('sum by (le) (ray_uerl_game_step_seconds{x="ray_uerl_a"})') == {
        "ray_uerl_game_step_seconds"
    }
    published = {name for spec in rm.ALL_METRICS for name in scraped_names(spec)}
    assert "uerl_env_steps_total" not in published
    assert "ray_uerl_game_step_seconds" not in published


def test_every_query_parses_with_promtool(dashboard: dict, promtool: Path, tmp_path) -> None:
    """Each query, its variables filled as Grafana fills them, as a recording rule:
    `promtool check rules` parses it with Prometheus' own parser."""
    rules = {
        "groups": [
            {
                "name": "uerl-dashboard",
                "rules": [
                    {"record": f"uerl_dashboard:q{i}", "expr": q.with_values(SAMPLE_VALUES)}
                    for i, q in enumerate(dq.queries(dashboard))
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules, indent=1))  # YAML reads JSON
    done = subprocess.run(
        [str(promtool), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules['groups'][0]['rules'])} rules found" in done.stdout


def test_promtool_refuses_a_broken_query(promtool: Path, tmp_path) -> None:
    """The check above would catch a query Prometheus cannot parse."""
    path = tmp_path / "rules.yml"
    broken = "sum by (run) (rate(ray_uerl_env_steps_total[1m])"
    path.write_text(
        json.dumps({"groups": [{"name": "g", "rules": [{"record": "r", "expr": broken}]}]})
    )
    done = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert done.returncode != 0 and "unclosed left parenthesis" in done.stdout + done.stderr
