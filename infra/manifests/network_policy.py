"""Per-stack NetworkPolicies: who may reach a game, and who may reach Ray.

Selected by the stack's own labels (`app.kubernetes.io/instance: <name>`), so two
stacks in one namespace are fenced from each other too:

- `<name>-ray`: the stack's Ray pods (head, learners, workers, and so the sidecar
  games inside the worker pods) accept traffic only from each other, on any port
  (Ray's GCS, object manager, node manager and worker ports are spread over a range).
- `<name>-ray-head-external`: with `security.allowed_cidrs`, those blocks may reach
  the head's GCS, client and dashboard ports (job submission from outside).
- `<name>-ray-head-supervisor`: the stack's run supervisors (`uerl submit --supervise`)
  may reach the head's dashboard port (the job API), to resubmit a run the head lost.
- `<name>-ray-metrics` (`metrics.scraper`): the Prometheus named there may reach the
  Ray pods' metrics port, nothing else.
- `<name>-ue` (networked): games accept their game port only from the stack's Ray pods.
- With `security.restrict_egress`, the same pods may send only to the stack's own
  pods and to DNS; `<name>-ray-head-runs` lets the head reach the run store
  (`runs.store: s3`) too, at its address or in its Service's namespace.

Traffic inside a pod (a sidecar game on localhost) and the kubelet's probes are not
subject to NetworkPolicies.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from infra.contract import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT, SUPERVISOR_APP
from infra.manifests import raycluster, simulator
from infra.manifests.common import K8sObject, metadata
from infra.s3_rules import store_address
from infra.topology import Topology

COMPONENT = "network-policy"
DNS_PORT = 53
HEAD_COMPONENT = "ray-head"


def _select(topology: Topology, app: str, **extra: str) -> dict[str, Any]:
    return {
        "matchLabels": {
            "app.kubernetes.io/instance": topology.name,
            "app.kubernetes.io/name": app,
            **extra,
        }
    }


def ray_pods(topology: Topology) -> dict[str, Any]:
    return _select(topology, raycluster.APP_NAME)


def game_pods(topology: Topology) -> dict[str, Any]:
    return _select(topology, simulator.APP_NAME)


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _dns() -> dict[str, Any]:
    # Any namespace (cluster DNS lives in kube-system on most clusters, elsewhere on some).
    return {
        "to": [{"namespaceSelector": {}}],
        "ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}],
    }


def _policy(topology: Topology, name: str, spec: dict[str, Any]) -> K8sObject:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(topology, name, name="uerl", component=COMPONENT),
        "spec": spec,
    }


def _ray(topology: Topology) -> K8sObject:
    spec: dict[str, Any] = {
        "podSelector": ray_pods(topology),
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": ray_pods(topology)}]}],
    }
    if topology.security.restrict_egress:
        to = [{"podSelector": ray_pods(topology)}]
        egress: list[dict[str, Any]] = [{"to": to}]
        if topology.pattern == "networked":
            games = {"podSelector": game_pods(topology)}
            egress.append({"to": [games], "ports": _tcp(topology.simulator.port)})
        spec["policyTypes"].append("Egress")
        spec["egress"] = [*egress, _dns()]
    return _policy(topology, f"{topology.name}-ray", spec)


def _head_external(topology: Topology) -> K8sObject | None:
    cidrs = topology.security.allowed_cidrs
    if not cidrs:
        return None
    return _policy(
        topology,
        f"{topology.name}-ray-head-external",
        {
            "podSelector": head_pods(topology),
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"ipBlock": {"cidr": cidr}} for cidr in cidrs],
                    "ports": _tcp(GCS_PORT, CLIENT_PORT, DASHBOARD_PORT),
                }
            ],
        },
    )


def head_pods(topology: Topology) -> dict[str, Any]:
    return _select(topology, raycluster.APP_NAME, **{"app.kubernetes.io/component": HEAD_COMPONENT})


def _head_supervisor(topology: Topology) -> K8sObject:
    return _policy(
        topology,
        f"{topology.name}-ray-head-supervisor",
        {
            "podSelector": head_pods(topology),
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": _select(topology, SUPERVISOR_APP)}],
                    "ports": _tcp(DASHBOARD_PORT),
                }
            ],
        },
    )


def _metrics_scraper(topology: Topology) -> K8sObject | None:
    scraper = topology.metrics.scraper
    if scraper is None:
        return None
    # The label every namespace carries (Kubernetes >= 1.21); both selectors in one
    # peer: the scraper's pods in the scraper's namespace, not either.
    names = {"matchLabels": {"kubernetes.io/metadata.name": scraper.namespace}}
    peer: dict[str, Any] = {"namespaceSelector": names, "podSelector": {}}
    if scraper.labels:
        peer["podSelector"] = {"matchLabels": dict(scraper.labels)}
    return _policy(
        topology,
        f"{topology.name}-ray-metrics",
        {
            "podSelector": ray_pods(topology),
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [peer], "ports": _tcp(topology.metrics.port)}],
        },
    )


def _head_run_store(topology: Topology) -> K8sObject | None:
    s3 = topology.runs.s3
    if not topology.security.restrict_egress or topology.runs.store != "s3" or s3 is None:
        return None
    address = store_address(s3.endpoint)
    assert address is not None  # Topology refuses a store egress cannot reach
    rule: dict[str, Any]
    if address.ip is not None and address.port is not None:
        bits = ipaddress.ip_address(address.ip).max_prefixlen
        rule = {"to": [{"ipBlock": {"cidr": f"{address.ip}/{bits}"}}], "ports": _tcp(address.port)}
    else:
        # The label every namespace carries (Kubernetes >= 1.21).
        names = {"matchLabels": {"kubernetes.io/metadata.name": address.namespace}}
        rule = {"to": [{"namespaceSelector": names}]}
    return _policy(
        topology,
        f"{topology.name}-ray-head-runs",
        {"podSelector": head_pods(topology), "policyTypes": ["Egress"], "egress": [rule]},
    )


def _games(topology: Topology) -> K8sObject | None:
    if topology.pattern != "networked":
        return None
    spec: dict[str, Any] = {
        "podSelector": game_pods(topology),
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"podSelector": ray_pods(topology)}],
                "ports": _tcp(topology.simulator.port),
            }
        ],
    }
    if topology.security.restrict_egress:
        spec["policyTypes"].append("Egress")
        spec["egress"] = [_dns()]  # a game answers; it starts no connection
    return _policy(topology, topology.ue_set_name, spec)


def policies(topology: Topology) -> list[K8sObject]:
    """The stack's NetworkPolicies (none with `security.network_policies: false`)."""
    if not topology.security.network_policies:
        return []
    built = (
        _ray(topology),
        _head_external(topology),
        _head_supervisor(topology),
        _head_run_store(topology),
        _metrics_scraper(topology),
        _games(topology),
    )
    return [policy for policy in built if policy is not None]
