"""Which pod may reach which port, by Kubernetes NetworkPolicy semantics.

Without a CNI that enforces them (the tier has none), policies are checked by
evaluating them: a pod is isolated for ingress once any policy of its namespace
selects it with policyType Ingress, and then traffic is allowed if some such
policy's ingress rule matches both the peer and the port (rules are a union).
Covers what uerl's policies use: podSelector.matchLabels (same namespace),
namespaceSelector {} , ipBlock without `except`, TCP/UDP ports by number.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Peer:
    """A source: a pod (namespace + labels) or an address outside the cluster."""

    namespace: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    ip: str = ""


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if set(selector) - {"matchLabels"}:
        raise NotImplementedError(f"selector {selector}")
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(rule_peer: dict[str, Any], peer: Peer, policy_ns: str) -> bool:
    if "ipBlock" in rule_peer:
        block = rule_peer["ipBlock"]
        if block.get("except"):
            raise NotImplementedError("ipBlock.except")
        return bool(peer.ip) and ipaddress.ip_address(peer.ip) in ipaddress.ip_network(
            block["cidr"]
        )
    if peer.ip and not peer.labels:
        return False  # an address outside the cluster is no pod
    if "namespaceSelector" in rule_peer:
        if rule_peer["namespaceSelector"] != {}:
            raise NotImplementedError(f"namespaceSelector {rule_peer['namespaceSelector']}")
        in_ns = True
    else:
        in_ns = peer.namespace == policy_ns
    pods = rule_peer.get("podSelector")
    return in_ns and (pods is None or _matches(pods, peer.labels))


def _port_matches(rule: dict[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    return any(p.get("protocol", "TCP") == protocol and p.get("port") == port for p in ports)


def ingress_allowed(
    policies: list[dict[str, Any]],
    *,
    namespace: str,
    pod_labels: dict[str, str],
    peer: Peer,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """May `peer` open `port` on a pod with `pod_labels` in `namespace`?"""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and _matches(p["spec"]["podSelector"], pod_labels)
    ]
    if not selecting:
        return True  # not isolated
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            peer_ok = not peers or any(_peer_matches(r, peer, namespace) for r in peers)
            if peer_ok and _port_matches(rule, port, protocol):
                return True
    return False


def egress_allowed(
    policies: list[dict[str, Any]],
    *,
    namespace: str,
    pod_labels: dict[str, str],
    to: Peer,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """May a pod with `pod_labels` send to `to` on `port` (egress side only)?"""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == namespace
        and "Egress" in p["spec"].get("policyTypes", [])
        and _matches(p["spec"]["podSelector"], pod_labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("egress", []):
            peers = rule.get("to")
            peer_ok = not peers or any(_peer_matches(r, to, namespace) for r in peers)
            if peer_ok and _port_matches(rule, port, protocol):
                return True
    return False
