"""Where uerl reaches the cluster itself (the KubeRay CRDs it applies, the providers that
take back what a destroy kept, preview's PodMonitor check) it reaches the one a team's
program gave it: the `kubeconfig`/`context` inputs beside its provider, never whatever
$KUBECONFIG names. Run under mocks through a team's program (tests/consumer_program.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_crd_api import FakeCrdAPI, serving
from infra_fixtures import resources_of, run_program

from infra.components.metrics_component import MISSING_CRD
from infra.components.training_cluster import check_kubeconfig
from infra.manifests import pod_monitor

PROGRAM = Path(__file__).resolve().parent / "consumer_program.py"
CRDS = "pulumi-python:dynamic/uerl:KubeRayCRDs"
PROVIDER = "pulumi:providers:kubernetes"
TEAM_PROVIDER = "team-k8s"
# How a secret value is serialised (pulumi.runtime.rpc): its signature key and value.
SECRET_SIG = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"}
KUBECONFIG_TEXT = "apiVersion: v1\nkind: Config\nclusters: []\n"
# Nothing in it reaches a cluster of its own: operator.install false, no kept claim.
PROVIDER_ONLY = {"operator": {"install": False}, "runs": {"claim": {"keep_on_destroy": False}}}
WITH_ADOPT = {"operator": {"crds": "adopt"}}


def consumer(**settings: Any) -> dict[str, Any]:
    return run_program(program=PROGRAM, env={"UERL_CONSUMER": json.dumps(settings)})


def providers_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return resources_of(report, PROVIDER)


def test_a_provider_given_without_its_kubeconfig_is_refused_where_uerl_reaches_the_cluster() -> (
    None
):
    # The defaults install the CRDs and keep the runs claim: both would act on $KUBECONFIG's
    # cluster, which may be another than the provider's.
    report = consumer(topology={})
    assert report["error"] is not None
    message = report["error"]["message"]
    assert message.startswith("kubeconfig: this TrainingCluster has a Kubernetes provider")
    assert "topology.operator.crds (install" in message
    assert "topology.runs.claim.keep_on_destroy" in message
    assert "\n" not in message
    assert not resources_of(report, CRDS)


def test_a_provider_given_alone_serves_a_topology_that_needs_nothing_else() -> None:
    report = consumer(topology=PROVIDER_ONLY)
    assert report["error"] is None, report["error"]
    assert list(providers_by_name(report)) == [TEAM_PROVIDER]
    kube = [r for r in report["resources"] if r["custom"] and r["type"].startswith("kubernetes:")]
    assert kube and all(TEAM_PROVIDER in (r["provider"] or "") for r in kube), [
        (r["type"], r["name"], r["provider"]) for r in kube
    ]


def test_the_kubeconfig_given_reaches_the_crds_and_every_provider_uerl_makes() -> None:
    report = consumer(topology=WITH_ADOPT, kubeconfig=KUBECONFIG_TEXT, context="team")
    assert report["error"] is None, report["error"]
    (crds,) = resources_of(report, CRDS).values()
    # Kept secret in the state, as the default provider's config is.
    assert crds["inputs"]["kubeconfig"] == {**SECRET_SIG, "value": KUBECONFIG_TEXT}
    assert crds["inputs"]["context"] == "team"
    ours = {n: p for n, p in providers_by_name(report).items() if n != TEAM_PROVIDER}
    # The chart's adopting provider, and those taking back the kept namespace and claim.
    assert set(ours) == {"kuberay-adopt", "namespace-keep", "runs-keep"}
    for provider in ours.values():
        assert provider["inputs"]["kubeconfig"] == KUBECONFIG_TEXT
        assert provider["inputs"]["context"] == "team"


def test_without_a_provider_the_component_reaches_the_default_providers_cluster() -> None:
    report = consumer(topology=WITH_ADOPT, provider=False)
    assert report["error"] is None, report["error"]
    assert set(providers_by_name(report)) == {"kuberay-adopt", "namespace-keep", "runs-keep"}


def test_the_pod_monitor_check_asks_the_cluster_of_the_kubeconfig_given() -> None:
    api = FakeCrdAPI()  # no PodMonitor CRD
    topology = {
        **PROVIDER_ONLY,
        "metrics": {
            "pod_monitor": True,
            "scraper": {"namespace": "monitoring", "labels": {"app": "prometheus"}},
        },
    }
    with serving(api):
        report = consumer(topology=topology, kubeconfig=api.kubeconfig())
    assert report["error"] is not None and report["error"]["message"] == MISSING_CRD
    assert [a for a in api.asked if pod_monitor.CRD_NAME in a]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("kube/config", "kubeconfig: 'kube/config' is a relative path; give an absolute one"),
        ("/nowhere/kubeconfig", "kubeconfig: no such file /nowhere/kubeconfig"),
        ("clusters: [\nusers: {}\n", "kubeconfig: not YAML (line"),
        ("- a\n- list\n", "kubeconfig: not a kubeconfig (a YAML map of clusters"),
    ],
    ids=["relative-path", "missing-file", "not-yaml", "not-a-map"],
)
def test_a_kubeconfig_input_that_cannot_be_one_is_refused_naming_it(
    value: str, message: str
) -> None:
    report = consumer(topology=PROVIDER_ONLY, kubeconfig=value)
    assert report["error"] is not None
    assert report["error"]["message"].startswith(message), report["error"]
    assert "\n" not in report["error"]["message"]


def test_a_kubeconfig_file_given_by_its_absolute_path_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(KUBECONFIG_TEXT)
    check_kubeconfig(str(path))


def test_a_one_line_json_kubeconfig_a_cluster_resource_outputs_is_taken_as_text() -> None:
    # EKS's `kubeconfig` output, for one: JSON on one line, no path.
    text = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": []})
    report = consumer(topology=WITH_ADOPT, kubeconfig=text)
    assert report["error"] is None, report["error"]
    (crds,) = resources_of(report, CRDS).values()
    assert crds["inputs"]["kubeconfig"]["value"] == text


def test_protect_retain_on_delete_and_transformations_reach_every_child() -> None:
    options = {"protect": True, "retain_on_delete": True, "label": "team=rl"}
    report = consumer(topology=PROVIDER_ONLY, options=options)
    assert report["error"] is None, report["error"]
    children = [r for r in report["resources"] if r["parent"] is not None]
    assert len(children) >= 5
    # `protect` the SDK passes down; `retainOnDelete` the engine does, for each child that
    # leaves it unset (pulumi/pkg resource/deploy source_eval.go, inheritFromParent).
    assert all(r["protect"] for r in children), [r["name"] for r in children if not r["protect"]]
    assert not [r["name"] for r in children if r["retainOnDeleteSet"]]
    objects = [r for r in children if r["custom"] and "metadata" in r["inputs"]]
    assert objects and all(
        r["inputs"]["metadata"].get("labels", {}).get("team") == "rl" for r in objects
    ), [r["name"] for r in objects]
