"""Which pod may reach which port, by Kubernetes NetworkPolicy semantics.

Without a CNI that enforces them (the tier has none), policies are checked by
evaluating them: a pod is isolated for ingress once any policy of its namespace
selects it with policyType Ingress, and then traffic is allowed if some such
policy's ingress rule matches both the peer and the port (rules are a union).
Covers what uerl's policies use: podSelector.matchLabels (same namespace),
namespaceSelector {} or by the namespace's name label, ipBlock without `except`, TCP/UDP
ports by number.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

NAMESPACE_LABEL = "kubernetes.io/metadata.name"


class UnmodelledPolicy(ValueError):
    """A policy uses a feature this evaluator does not model: judging it anyway could
    call a closed path open (or the reverse), so the check stops instead."""


@dataclass(frozen=True)
class Peer:
    """A source: a pod (namespace + labels) or an address outside the cluster."""

    namespace: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    ip: str = ""


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if set(selector) - {"matchLabels"}:
        raise UnmodelledPolicy(f"selector {selector}: only matchLabels is modelled")
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(rule_peer: dict[str, Any], peer: Peer, policy_ns: str) -> bool:
    if "ipBlock" in rule_peer:
        block = rule_peer["ipBlock"]
        if block.get("except"):
            raise UnmodelledPolicy(f"ipBlock {block}: `except` is not modelled")
        return bool(peer.ip) and ipaddress.ip_address(peer.ip) in ipaddress.ip_network(
            block["cidr"]
        )
    if peer.ip and not peer.labels:
        return False  # an address outside the cluster is no pod
    if "namespaceSelector" in rule_peer:
        # A namespace's only label modelled is the one Kubernetes gives each, its name.
        selector = rule_peer["namespaceSelector"]
        if set(selector.get("matchLabels", {})) - {NAMESPACE_LABEL}:
            raise UnmodelledPolicy(f"namespaceSelector {selector}: only {NAMESPACE_LABEL}")
        in_ns = _matches(selector, {NAMESPACE_LABEL: peer.namespace})
    else:
        in_ns = peer.namespace == policy_ns
    pods = rule_peer.get("podSelector")
    return in_ns and (pods is None or _matches(pods, peer.labels))


def _port_matches(rule: dict[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    return any(p.get("protocol", "TCP") == protocol and p.get("port") == port for p in ports)


def _allowed(
    policies: list[dict[str, Any]],
    direction: str,
    *,
    namespace: str,
    pod_labels: dict[str, str],
    peer: Peer,
    port: int,
    protocol: str,
) -> bool:
    """`direction` "Ingress" (peers under `from`) or "Egress" (under `to`)."""
    # Without policyTypes a policy is an Ingress policy (Egress only with egress rules;
    # uerl always writes policyTypes).
    default_types = ["Ingress"] if direction == "Ingress" else []
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == namespace
        and direction in p["spec"].get("policyTypes", default_types)
        and _matches(p["spec"]["podSelector"], pod_labels)
    ]
    if not selecting:
        return True  # not isolated in this direction
    for policy in selecting:
        for rule in policy["spec"].get(rules_key, []):
            peers = rule.get(peers_key)
            peer_ok = not peers or any(_peer_matches(r, peer, namespace) for r in peers)
            if peer_ok and _port_matches(rule, port, protocol):
                return True
    return False


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
    return _allowed(
        policies, "Ingress", namespace=namespace, pod_labels=pod_labels, peer=peer,
        port=port, protocol=protocol,
    )  # fmt: skip


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
    return _allowed(
        policies, "Egress", namespace=namespace, pod_labels=pod_labels, peer=to,
        port=port, protocol=protocol,
    )  # fmt: skip
