"""Least privilege by default: restricted pods, a restricted namespace, per-stack
NetworkPolicies (evaluated by their semantics: no CNI enforces them here)."""

from __future__ import annotations

from typing import Any

import pytest
from network_policy_eval import Peer, UnmodelledPolicy, egress_allowed, ingress_allowed

from infra import manifests
from infra.manifests import pod_security
from infra.manifests.common import labels
from infra.topology import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT, Topology, TopologyError

UNREAL_LOADER = {"simulator": {"kind": "unreal"}, "executables": {"source_url": "https://x/g.tgz"}}
VARIANTS = {
    "mock-sidecar": {"simulator": {"kind": "mock"}},
    "mock-networked": {"simulator": {"kind": "mock"}, "pattern": "networked"},
    "unreal-sidecar-loader": UNREAL_LOADER,
    # Loopback-bound networked games: a forwarder container beside each.
    "unreal-networked-forwarder": UNREAL_LOADER | {"pattern": "networked"},
    "mock-networked-all-interfaces": {
        "simulator": {"kind": "mock", "listen": "all_interfaces"},
        "pattern": "networked",
    },
}


def build(data: dict[str, Any]) -> manifests.Manifests:
    return manifests.build(Topology.parse(data))


def policies_of(*stacks: manifests.Manifests) -> list[dict[str, Any]]:
    return [p for m in stacks for p in m.network_policies]


def ray_pod(topology: Topology, component: str = "ray-env-runner") -> dict[str, str]:
    return labels(topology, name="ray", component=component)


def game_pod(topology: Topology) -> dict[str, str]:
    return labels(topology, name="ue", component="simulator")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pod_uerl_renders_passes_the_restricted_standard(variant: str) -> None:
    specs = pod_security.pod_specs(build(VARIANTS[variant]).objects())
    assert len(specs) >= 3  # head, learners, workers (and games, the loader)
    assert {name: pod_security.violations(spec) for name, spec in specs.items()} == {
        name: [] for name in specs
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_but_rays_has_a_read_only_root_and_all_a_writable_tmp(
    variant: str,
) -> None:
    for spec in pod_security.pod_specs(build(VARIANTS[variant]).objects()).values():
        tmp = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            ray = container["name"].startswith("ray-")  # Ray writes under $HOME
            assert container["securityContext"]["readOnlyRootFilesystem"] is not ray
            assert container["securityContext"]["runAsUser"] > 0
            writable = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert [m["name"] for m in writable] == [pod_security.TMP_VOLUME]
            assert pod_security.TMP_VOLUME in tmp


def test_the_violation_check_does_flag_an_unrestricted_pod() -> None:
    pod = {"containers": [{"name": "c", "securityContext": {"privileged": True}}]}
    assert set(pod_security.violations(pod)) >= {
        "c: privileged",
        "c: allowPrivilegeEscalation != false",
        "c: capabilities.drop lacks ALL",
        "c: runAsNonRoot != true",
        "c: seccompProfile None",
    }


def test_a_container_without_a_user_is_a_build_error_not_a_rejected_pod() -> None:
    with pytest.raises(ValueError, match="'game': no non-root runAsUser"):
        pod_security.restrict({"containers": [{"name": "game"}]})


def test_a_namespace_uerl_creates_enforces_restricted() -> None:
    ns = build({}).namespace
    assert ns is not None
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_enforced_standard_follows_the_topology() -> None:
    ns = build({"security": {"pod_security": "baseline"}}).namespace
    assert ns is not None
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


# ---- NetworkPolicies -------------------------------------------------------------------


def two_networked_stacks() -> tuple[Topology, Topology, list[dict[str, Any]]]:
    a = Topology.parse({"name": "a", "pattern": "networked", "simulator": {"kind": "mock"}})
    b = Topology.parse({"name": "b", "pattern": "networked", "simulator": {"kind": "mock"}})
    return a, b, policies_of(manifests.build(a), manifests.build(b))


def test_a_networked_game_takes_its_port_from_its_own_stacks_ray_pods_only() -> None:
    a, b, policies = two_networked_stacks()
    port = a.simulator.port

    def reaches(peer: Peer, to_port: int = port) -> bool:
        return ingress_allowed(
            policies, namespace=a.namespace, pod_labels=game_pod(a), peer=peer, port=to_port
        )

    ns = a.namespace
    assert reaches(Peer(ns, ray_pod(a)))  # its env runners
    assert reaches(Peer(ns, ray_pod(a, "ray-head")))  # discovery from the driver
    assert not reaches(Peer(ns, ray_pod(a)), to_port=port + 1)  # the game port only
    assert not reaches(Peer(ns, ray_pod(b)))  # the other stack's runners
    assert not reaches(Peer(ns, game_pod(a)))  # another game
    assert not reaches(Peer("other", ray_pod(a)))  # same labels, another namespace
    assert not reaches(Peer(ns, {"app": "anything"}))
    assert not reaches(Peer(ip="10.1.2.3"))


def test_sidecar_worker_pods_take_traffic_from_their_own_stacks_ray_pods_only() -> None:
    a = Topology.parse({"name": "a"})
    b = Topology.parse({"name": "b"})
    policies = policies_of(manifests.build(a), manifests.build(b))
    for port in (a.simulator.port, GCS_PORT, 12345):

        def reaches(peer: Peer, port: int = port) -> bool:
            return ingress_allowed(
                policies, namespace=a.namespace, pod_labels=ray_pod(a), peer=peer, port=port
            )

        assert reaches(Peer(a.namespace, ray_pod(a, "ray-learner")))
        assert not reaches(Peer(b.namespace, ray_pod(b)))
        assert not reaches(Peer(a.namespace, {"run": "curl"}))
        assert not reaches(Peer(ip="10.1.2.3"))


@pytest.mark.parametrize("port", [GCS_PORT, CLIENT_PORT, DASHBOARD_PORT])
def test_the_heads_ports_are_open_to_the_allowed_cidrs_only(port: int) -> None:
    t = Topology.parse({"security": {"allowed_cidrs": ["10.20.0.0/16"]}})
    policies = list(manifests.build(t).network_policies)
    head, worker = ray_pod(t, "ray-head"), ray_pod(t)

    def reaches(labels: dict[str, str], ip: str, to_port: int = port) -> bool:
        return ingress_allowed(
            policies, namespace=t.namespace, pod_labels=labels, peer=Peer(ip=ip), port=to_port
        )

    assert reaches(head, "10.20.7.8")
    assert not reaches(head, "10.21.0.1")
    assert not reaches(head, "10.20.7.8", to_port=12345)  # not Ray's other ports
    assert not reaches(worker, "10.20.7.8")  # the head only
    closed = list(build({}).network_policies)  # no allowed_cidrs: nobody from outside
    assert not ingress_allowed(
        closed, namespace=t.namespace, pod_labels=head, peer=Peer(ip="10.20.7.8"), port=port
    )


def test_egress_is_open_unless_restricted_and_then_dns_stays_open() -> None:
    t = Topology.parse({"pattern": "networked", "simulator": {"kind": "mock"}})
    internet = Peer(ip="93.184.216.34")
    dns = Peer("kube-system", {"k8s-app": "kube-dns"})

    def sends(policies: list[dict[str, Any]], labels: dict[str, str], to: Peer, port: int) -> bool:
        return egress_allowed(policies, namespace=t.namespace, pod_labels=labels, to=to, port=port)

    open_ = list(manifests.build(t).network_policies)
    assert sends(open_, ray_pod(t), internet, 443)
    closed = list(build({"pattern": "networked", "simulator": {"kind": "mock"},
                         "security": {"restrict_egress": True}}).network_policies)  # fmt: skip
    assert not sends(closed, ray_pod(t), internet, 443)
    assert not sends(closed, game_pod(t), internet, 443)
    assert sends(closed, ray_pod(t), dns, 53) and sends(closed, game_pod(t), dns, 53)
    head = Peer(t.namespace, ray_pod(t, "ray-head"))
    assert sends(closed, ray_pod(t), head, GCS_PORT)  # Ray to Ray
    assert sends(closed, ray_pod(t), Peer(t.namespace, game_pod(t)), t.simulator.port)
    assert not sends(closed, game_pod(t), Peer(t.namespace, ray_pod(t)), GCS_PORT)


def test_network_policies_off_renders_none() -> None:
    m = build({"security": {"network_policies": False}, "pattern": "networked"})
    assert m.network_policies == ()
    assert "NetworkPolicy" not in {o["kind"] for o in m.objects()}


def test_policies_come_before_any_pod_they_guard_in_apply_order() -> None:
    kinds = [o["kind"] for o in build({"pattern": "networked"}).objects()]
    first_pods = min(kinds.index(k) for k in ("RayCluster", "StatefulSet"))
    assert max(i for i, k in enumerate(kinds) if k == "NetworkPolicy") < first_pods


@pytest.mark.parametrize(
    ("security", "message"),
    [
        ({"allowed_cidrs": ["10.0.0.1/8"]}, "allowed_cidrs[0]: '10.0.0.1/8' is not a CIDR block"),
        ({"allowed_cidrs": ["not-an-ip"]}, "allowed_cidrs[0]: 'not-an-ip' is not a CIDR block"),
        ({"allowed_cidrs": ["10.0.0.0/33"]}, "allowed_cidrs[0]: '10.0.0.0/33' is not a CIDR"),
        ({"allowed_cidrs": "10.0.0.0/8"}, "allowed_cidrs: Input should be a valid list"),
        ({"network_policies": "sometimes"}, "network_policies: Input should be a valid boolean"),
        ({"restrict_egress": "maybe"}, "restrict_egress: Input should be a valid boolean"),
        ({"pod_security": "strict"}, "pod_security: Input should be 'restricted'"),
        ({"tls": True}, "security.tls: unknown key"),
    ],
)
def test_bad_security_input_names_the_field(security: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError) as err:
        Topology.parse({"security": security})
    assert message in str(err.value)
    assert "topology.security." in str(err.value)


def test_the_evaluator_refuses_a_policy_feature_it_does_not_model() -> None:
    policy = {
        "metadata": {"namespace": "ns"},
        "spec": {
            "podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
            "policyTypes": ["Ingress"],
        },
    }
    with pytest.raises(UnmodelledPolicy, match="only matchLabels is modelled"):
        ingress_allowed([policy], namespace="ns", pod_labels={"a": "1"}, peer=Peer(), port=1)
