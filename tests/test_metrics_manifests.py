"""`metrics`: the Ray pods' metrics port, the PodMonitor that selects them, and the
NetworkPolicy that admits the Prometheus named as the scraper, to that port only."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import pytest
import yaml
from fake_crd_api import FakeCrdAPI, crd_object, serving
from infra_fixtures import (
    THIRD_PARTY,
    dev_topology,
    resources_of,
    run_program,
    strict_structural,
)
from network_policy_eval import Peer, ingress_allowed

from infra import manifests
from infra.components.metrics_component import MISSING_CRD
from infra.manifests import pod_monitor
from infra.topology import GCS_PORT, Topology, TopologyError

POD_MONITOR_CRD = THIRD_PARTY / "prometheus-operator-crds-v0.85.0"
POD_MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
SCRAPER_LABELS = {"app.kubernetes.io/name": "prometheus"}
SCRAPED = (
    "topology.metrics.pod_monitor=true",
    "topology.metrics.scraper.namespace=monitoring",
    'topology.metrics.scraper.labels["app.kubernetes.io/name"]=prometheus',
    "topology.metrics.pod_monitor_labels.release=kube-prometheus-stack",
)
SCRAPED_TOPOLOGY = {
    "metrics": {
        "pod_monitor": True,
        "scraper": {"namespace": "monitoring", "labels": SCRAPER_LABELS},
        "pod_monitor_labels": {"release": "kube-prometheus-stack"},
    }
}


@cache
def pod_monitor_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((POD_MONITOR_CRD / "monitoring.coreos.com_podmonitors.yaml").read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(strict_structural(v1["schema"]["openAPIV3Schema"]))


def scraped(*extra: str, pattern: str = "sidecar") -> manifests.Manifests:
    raw = {**SCRAPED_TOPOLOGY, "pattern": pattern}
    return manifests.build(Topology.parse(raw, root="topology"))


def ray_pod_templates(objects: manifests.Manifests) -> list[dict[str, Any]]:
    spec = objects.raycluster["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [group["template"] for group in groups]


def test_no_pod_monitor_and_no_scraper_policy_by_default() -> None:
    objects = manifests.build(dev_topology())
    assert objects.pod_monitor is None
    assert not [p for p in objects.network_policies if p["metadata"]["name"].endswith("-metrics")]


@pytest.mark.parametrize("pattern", ["sidecar", "networked"])
def test_the_pod_monitor_is_valid_by_the_prometheus_operators_own_crd(pattern: str) -> None:
    monitor = scraped(pattern=pattern).pod_monitor
    assert monitor is not None
    errors = [e.message for e in pod_monitor_validator().iter_errors(monitor)]
    assert errors == []


@pytest.mark.parametrize("pattern", ["sidecar", "networked"])
def test_the_pod_monitor_selects_every_ray_pod_and_its_named_metrics_port(pattern: str) -> None:
    objects = scraped(pattern=pattern)
    monitor = objects.pod_monitor
    assert monitor is not None
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    templates = ray_pod_templates(objects)
    assert len(templates) == 3  # head, learners, env runners
    for template in templates:
        labels = template["metadata"]["labels"]
        assert selector.items() <= labels.items(), labels
        ray = template["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in ray.get("ports", [])}
        assert ports[endpoint["port"]] == objects.topology.metrics.port
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [objects.topology.namespace]}


def test_the_pod_monitor_selects_no_game_pod() -> None:
    objects = scraped(pattern="networked")
    monitor, games = objects.pod_monitor, objects.ue_statefulset
    assert monitor is not None and games is not None
    labels = games["spec"]["template"]["metadata"]["labels"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_pod_monitor_carries_the_labels_a_prometheus_picks_it_by() -> None:
    monitor = scraped().pod_monitor
    assert monitor is not None
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"


def allowed(objects: manifests.Manifests, peer: Peer, port: int) -> bool:
    (head,) = [t for t in ray_pod_templates(objects) if "head" in str(t["metadata"]["labels"])]
    return ingress_allowed(
        list(objects.network_policies),
        namespace=objects.topology.namespace,
        pod_labels=head["metadata"]["labels"],
        peer=peer,
        port=port,
    )


def test_the_named_scraper_reaches_the_ray_pods_metrics_port() -> None:
    objects = scraped()
    scraper = Peer(namespace="monitoring", labels=SCRAPER_LABELS)
    assert allowed(objects, scraper, objects.topology.metrics.port)


def test_the_named_scraper_reaches_no_other_port_of_the_ray_pods() -> None:
    objects = scraped()
    assert not allowed(objects, Peer(namespace="monitoring", labels=SCRAPER_LABELS), GCS_PORT)


@pytest.mark.parametrize(
    "peer",
    [
        Peer(namespace="monitoring", labels={"app.kubernetes.io/name": "grafana"}),
        Peer(namespace="default", labels=SCRAPER_LABELS),
        Peer(ip="203.0.113.7"),
    ],
    ids=["other-pod-of-the-namespace", "same-labels-other-namespace", "outside-address"],
)
def test_nobody_but_the_named_scraper_reaches_the_metrics_port(peer: Peer) -> None:
    objects = scraped()
    assert not allowed(objects, peer, objects.topology.metrics.port)


def test_a_scraper_without_labels_is_every_pod_of_its_namespace() -> None:
    raw = {"metrics": {"pod_monitor": True, "scraper": {"namespace": "monitoring"}}}
    objects = manifests.build(Topology.parse(raw, root="topology"))
    peer = Peer(namespace="monitoring", labels={"app": "anything"})
    assert allowed(objects, peer, objects.topology.metrics.port)
    assert not allowed(objects, Peer(namespace="other", labels={}), objects.topology.metrics.port)


def test_a_metrics_port_of_the_topologys_own_is_the_one_served_monitored_and_admitted() -> None:
    raw = {**SCRAPED_TOPOLOGY, "metrics": {**SCRAPED_TOPOLOGY["metrics"], "port": 9091}}
    objects = manifests.build(Topology.parse(raw, root="topology"))
    for template in ray_pod_templates(objects):
        ports = template["spec"]["containers"][0]["ports"]
        assert {"name": "metrics", "containerPort": 9091} in ports
    assert allowed(objects, Peer(namespace="monitoring", labels=SCRAPER_LABELS), 9091)
    assert not allowed(objects, Peer(namespace="monitoring", labels=SCRAPER_LABELS), 8080)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"metrics": {"pod_monitor": True}}, "topology.metrics.scraper: is needed"),
        (
            {"metrics": {"scraper": {"namespace": "m"}}, "security": {"network_policies": False}},
            "topology.metrics.scraper: admits a scraper",
        ),
        ({"metrics": {"port": GCS_PORT}}, "topology.metrics.port: 6379 is Ray's GCS port"),
        ({"metrics": {"port": 50051}}, "topology.metrics.port: 50051 is a port of the sidecar"),
        ({"metrics": {"interval": "30"}}, "topology.metrics.interval: the string '30' is not"),
        ({"metrics": {"interval": "0s"}}, "topology.metrics.interval: the string '0s': a scrape"),
        (
            {"metrics": {"scraper": {"namespace": "Monitoring"}}},
            "topology.metrics.scraper.namespace: 'Monitoring' is not a namespace name",
        ),
        (
            {"metrics": {"pod_monitor_labels": {"app.kubernetes.io/instance": "x"}}},
            "is one of uerl's own labels",
        ),
        ({"metrics": {"podmonitor": True}}, "(did you mean pod_monitor?)"),
    ],
    ids=[
        "pod-monitor-without-scraper",
        "scraper-without-policies",
        "port-of-ray",
        "port-of-the-sidecar-game",
        "interval-without-unit",
        "interval-zero",
        "scraper-namespace",
        "own-label",
        "near-miss-key",
    ],
)
def test_a_metrics_setting_that_could_not_work_is_refused_naming_its_field(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(TopologyError) as refused:
        Topology.parse(raw, root="topology")
    assert message in str(refused.value)


# -- the program -----------------------------------------------------------------


def test_the_program_makes_the_pod_monitor_when_the_cluster_has_its_crd() -> None:
    api = FakeCrdAPI(crds={pod_monitor.CRD_NAME: crd_object(pod_monitor.CRD_NAME)})
    with serving(api):
        report = run_program(*SCRAPED, config={"kubernetes:kubeconfig": api.kubeconfig()})
    assert report["error"] is None, report["error"]
    (monitor,) = resources_of(report, POD_MONITOR).values()
    assert resources_of(report, "uerl:infra:StackMetrics")
    assert monitor["parent"] == "uerl:infra:StackMetrics::metrics"
    assert monitor["inputs"]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert (
        f"GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/{pod_monitor.CRD_NAME}"
        in (api.asked)
    )


def test_the_program_stops_with_one_line_on_a_cluster_without_the_crd() -> None:
    api = FakeCrdAPI()
    with serving(api):
        report = run_program(*SCRAPED, config={"kubernetes:kubeconfig": api.kubeconfig()})
    assert report["error"] is not None
    assert report["error"]["message"] == MISSING_CRD
    assert "\n" not in MISSING_CRD
    assert not resources_of(report, POD_MONITOR)


def test_the_program_asks_no_cluster_when_no_pod_monitor_is_wanted() -> None:
    api = FakeCrdAPI()
    with serving(api):
        report = run_program(config={"kubernetes:kubeconfig": api.kubeconfig()})
    assert report["error"] is None, report["error"]
    assert not [a for a in api.asked if pod_monitor.CRD_NAME in a]
    assert not resources_of(report, POD_MONITOR)
