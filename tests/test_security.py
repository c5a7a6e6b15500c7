"""Least privilege by default: restricted pods, a restricted namespace, per-stack
NetworkPolicies (evaluated by their semantics: no CNI enforces them here)."""

from __future__ import annotations

from typing import Any

import pytest
from infra_fixtures import OWN_CLUSTER
from network_policy_eval import Peer, UnmodelledPolicy, egress_allowed, ingress_allowed

from infra import manifests
from infra.manifests import pod_security
from infra.manifests.common import labels
from infra.render import apply_sets
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
    # Every pod placed, named and pulling with secrets; GPUs, /dev/shm, no CPU limits.
    "own-cluster": apply_sets({}, OWN_CLUSTER),
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


# ---- Ray behind a token ---------------------------------------------------------------


def _raycluster(data: dict[str, Any]) -> dict[str, Any]:
    return next(o for o in build(data).objects() if o["kind"] == "RayCluster")


def test_rays_api_and_gcs_ask_for_a_token_from_kuberays_secret_by_default() -> None:
    assert _raycluster({})["spec"]["authOptions"] == {"mode": "token"}
    # KubeRay names the Secret it makes after the RayCluster; the endpoints say so.
    assert Topology().endpoints().ray.token_secret == "uerl"


def test_a_token_secret_of_the_users_is_given_to_kuberay_and_named_in_the_endpoints() -> None:
    data = {"ray": {"auth": {"secret_name": "team-ray-token"}}}
    assert _raycluster(data)["spec"]["authOptions"] == {
        "mode": "token",
        "secretName": "team-ray-token",
    }
    assert Topology.parse(data).endpoints().ray.token_secret == "team-ray-token"


def test_the_token_off_renders_no_auth_options_and_names_no_secret() -> None:
    data = {"ray": {"auth": {"mode": "disabled"}}}
    assert "authOptions" not in _raycluster(data)["spec"]
    assert Topology.parse(data).endpoints().ray.token_secret is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"ray": {"auth": {"mode": "disabled"}},
             "security": {"allowed_cidrs": ["10.20.0.0/16"]}},
            "topology.security.allowed_cidrs: would let those addresses reach Ray's job API "
            "and GCS with no token (ray.auth.mode is 'disabled')",
        ),
        (
            {"ray": {"version": "2.51.1", "image": "mine/ray:2.51.1"}},
            "topology.ray.auth.mode: token authentication needs Ray >= 2.52.0 (ray.version is "
            "2.51.1): set ray.auth.mode 'disabled', or a newer ray.version",
        ),
        (
            {"ray": {"auth": {"mode": "disabled", "secret_name": "t"}}},
            "topology.ray.auth.secret_name: ray.auth.mode is 'disabled': no token is asked for",
        ),
        ({"ray": {"auth": {"mode": "oauth"}}}, "topology.ray.auth.mode: Input should be 'token'"),
        ({"ray": {"auth": {"secret_name": "Bad_Name"}}}, "topology.ray.auth.secret_name: "),
    ],
)  # fmt: skip
def test_bad_token_input_names_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError) as err:
        Topology.parse(data)
    assert message in str(err.value)


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


# -- TLS to the games (simulator.tls) -------------------------------------------------------

TLS = {"secret": "game-tls"}
MUTUAL = {"secret": "game-tls", "mutual": True}


def containers_of(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def tls_keys(spec: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """The Secret keys `container` sees (empty: it mounts none of the games' TLS)."""
    mounted = {m["name"] for m in container.get("volumeMounts", [])}
    volumes = [v for v in spec.get("volumes", []) if v["name"] in mounted and "secret" in v]
    assert all(v["secret"]["secretName"] == "game-tls" for v in volumes)
    return sorted(i["key"] for v in volumes for i in v["secret"]["items"])


def test_a_sidecar_mock_game_serves_tls_and_its_env_runner_trusts_the_ca_only() -> None:
    specs = pod_security.pod_specs(build({"simulator": {"kind": "mock", "tls": TLS}}).objects())
    workers = specs["RayCluster/uerl/workers"]
    game, ray = containers_of(workers)["ue"], containers_of(workers)["ray-worker"]
    assert game["args"][-4:] == [
        "--tls-cert",
        "/etc/uerl-game-tls/tls.crt",
        "--tls-key",
        "/etc/uerl-game-tls/tls.key",
    ]
    assert tls_keys(workers, game) == ["tls.crt", "tls.key"]
    assert tls_keys(workers, ray) == ["ca.crt"]
    head = specs["RayCluster/uerl/head"]
    assert tls_keys(head, containers_of(head)["ray-head"]) == ["ca.crt"]
    learners = specs["RayCluster/uerl/learners"]
    assert tls_keys(learners, containers_of(learners)["ray-worker"]) == []


def test_mutual_tls_gives_env_runners_the_certificate_and_games_the_ca() -> None:
    specs = pod_security.pod_specs(build({"simulator": {"kind": "mock", "tls": MUTUAL}}).objects())
    workers = specs["RayCluster/uerl/workers"]
    game, ray = containers_of(workers)["ue"], containers_of(workers)["ray-worker"]
    assert game["args"][-2:] == ["--tls-client-ca", "/etc/uerl-game-tls/ca.crt"]
    assert tls_keys(workers, game) == ["ca.crt", "tls.crt", "tls.key"]
    assert tls_keys(workers, ray) == ["ca.crt", "tls.crt", "tls.key"]


def test_the_forwarder_terminates_tls_in_front_of_a_plaintext_unreal_game() -> None:
    data = UNREAL_LOADER | {"pattern": "networked", "simulator": {"kind": "unreal", "tls": TLS}}
    game_pod_spec = pod_security.pod_specs(build(data).objects())["StatefulSet/uerl-ue"]
    game, forward = containers_of(game_pod_spec)["ue"], containers_of(game_pod_spec)["forward"]
    assert not any(a.startswith("--tls") for a in game["args"])
    assert tls_keys(game_pod_spec, game) == []
    assert forward["args"] == [
        "50051",
        "127.0.0.1",
        "50052",
        "--tls-cert",
        "/etc/uerl-game-tls/tls.crt",
        "--tls-key",
        "/etc/uerl-game-tls/tls.key",
    ]
    assert tls_keys(game_pod_spec, forward) == ["tls.crt", "tls.key"]


def test_the_endpoints_tell_env_runners_where_the_tls_files_are_mounted() -> None:
    topology = Topology.parse({"simulator": {"kind": "mock", "tls": MUTUAL}})
    tls = topology.endpoints().tls
    assert tls is not None
    assert (tls.ca_path, tls.cert_path, tls.key_path) == (
        "/etc/uerl-game-tls/ca.crt",
        "/etc/uerl-game-tls/tls.crt",
        "/etc/uerl-game-tls/tls.key",
    )
    assert Topology.parse({}).endpoints().tls is None


@pytest.mark.parametrize(
    ("pattern", "hosts"),
    [
        ("sidecar", ["localhost", "127.0.0.1"]),
        ("networked", ["*.uerl-ue.uerl.svc.cluster.local"]),
    ],
)
def test_the_games_certificate_must_name_what_env_runners_dial(
    pattern: str, hosts: list[str]
) -> None:
    topology = Topology.parse({"pattern": pattern, "simulator": {"kind": "mock", "tls": TLS}})
    assert topology.game_tls_hosts == hosts
    endpoints = topology.endpoints()
    dialled = [endpoints.discovery_endpoint, endpoints.worker_endpoint(1)]
    for endpoint in dialled:
        host = endpoint.rsplit(":", 1)[0]
        assert any(h == host or (h.startswith("*.") and host.endswith(h[1:])) for h in hosts)


@pytest.mark.parametrize("variant", ["mock-sidecar", "mock-networked", "unreal-networked"])
def test_pods_with_tls_still_pass_the_restricted_standard(variant: str) -> None:
    data = {
        "mock-sidecar": {"simulator": {"kind": "mock", "tls": MUTUAL}},
        "mock-networked": {"pattern": "networked", "simulator": {"kind": "mock", "tls": MUTUAL}},
        "unreal-networked": UNREAL_LOADER
        | {"pattern": "networked", "simulator": {"kind": "unreal", "tls": MUTUAL}},
    }[variant]
    specs = pod_security.pod_specs(build(data).objects())
    assert {name: pod_security.violations(spec) for name, spec in specs.items()} == {
        name: [] for name in specs
    }


def test_without_tls_no_pod_mounts_the_secret() -> None:
    for variant in VARIANTS.values():
        for spec in pod_security.pod_specs(build(variant).objects()).values():
            assert not [v for v in spec.get("volumes", []) if "secret" in v]


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        (
            {"simulator": {"kind": "unreal", "tls": TLS}},
            "topology.simulator.tls",
            "a stock Schola build serves plaintext gRPC",
        ),
        (
            {
                "pattern": "networked",
                "simulator": {"kind": "unreal", "listen": "all_interfaces", "tls": TLS},
            },
            "topology.simulator.tls",
            "needs pattern 'networked' with simulator.listen 'loopback'",
        ),
        (
            {"simulator": {"tls": {"secret": "Game_TLS"}}},
            "topology.simulator.tls.secret",
            "is not a Secret name",
        ),
        (
            {"simulator": {"tls": {"secret": ""}}},
            "topology.simulator.tls.secret",
            "is not a Secret name",
        ),
        (
            {"simulator": {"tls": {"secret": "a" * 254}}},
            "topology.simulator.tls.secret",
            "at most 253",
        ),
        (
            {"simulator": {"tls": {"secret": "-tls"}}},
            "topology.simulator.tls.secret",
            "is not a Secret name",
        ),
        ({"simulator": {"tls": {}}}, "topology.simulator.tls.secret", "Field required"),
        ({"simulator": {"tls": "game-tls"}}, "topology.simulator.tls", "expected a map"),
        (
            {"simulator": {"tls": {"secret": "t", "mutual": "both"}}},
            "topology.simulator.tls.mutual",
            "valid boolean",
        ),
        (
            {"simulator": {"tls": {"secret": "t", "ca": "x"}}},
            "topology.simulator.tls.ca",
            "unknown key",
        ),
    ],
)
def test_bad_tls_input_names_the_field(data: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(TopologyError) as err:
        build(data)
    assert f"{path}: " in str(err.value)
    assert message in str(err.value)


def test_the_head_and_its_dashboard_are_never_exposed_beyond_a_cluster_ip() -> None:
    for variant in VARIANTS.values():
        head = build(variant).raycluster["spec"]["headGroupSpec"]
        # KubeRay's head Service is a ClusterIP unless serviceType says otherwise; no
        # Ingress unless enableIngress.
        assert head.get("serviceType", "ClusterIP") == "ClusterIP"
        assert not head.get("enableIngress", False)
        assert {o["kind"] for o in build(variant).objects()}.isdisjoint({"Ingress", "Route"})


def restricted_store(endpoint: str | None) -> dict[str, Any]:
    s3 = {"bucket": "game-ai-runs"} | ({"endpoint": endpoint} if endpoint else {})
    return {"security": {"restrict_egress": True}, "runs": {"store": "s3", "s3": s3}}


@pytest.mark.parametrize("endpoint", [None, "https://s3.example.com"])
def test_restrict_egress_refuses_a_run_store_out_of_the_cluster_naming_both_fields(
    endpoint: str | None,
) -> None:
    # Every `uerl train` would exit 2: the head could not reach the bucket.
    with pytest.raises(TopologyError) as info:
        Topology.parse(restricted_store(endpoint))
    (line,) = str(info.value).splitlines()[1:]
    assert line.strip().startswith("topology.security.restrict_egress: ")
    assert "runs.s3.endpoint" in line


def head_sends(endpoint: str, to: Peer, port: int, component: str = "ray-head") -> bool:
    t = Topology.parse(restricted_store(endpoint))
    return egress_allowed(
        list(manifests.build(t).network_policies), namespace=t.namespace,
        pod_labels=ray_pod(t, component), to=to, port=port,
    )  # fmt: skip


def test_restrict_egress_lets_the_head_reach_a_run_store_at_an_address() -> None:
    store = Peer(ip="10.30.0.5")
    assert head_sends("http://10.30.0.5:9000", store, 9000)
    assert head_sends("https://10.30.0.5", store, 443)  # the scheme's port
    assert not head_sends("http://10.30.0.5:9000", store, 22)
    assert not head_sends("http://10.30.0.5:9000", Peer(ip="10.30.0.6"), 9000)
    assert not head_sends("http://10.30.0.5:9000", store, 9000, component="ray-env-runner")


def test_restrict_egress_lets_the_head_reach_a_run_store_service_in_the_cluster() -> None:
    # A Service's port is translated to its pods' (unknown here): any port of its namespace.
    endpoint = "http://seaweedfs-s3.storage.svc.cluster.local:8333"
    store = Peer("storage", {"app": "seaweedfs"})
    assert head_sends(endpoint, store, 8333)
    assert not head_sends(endpoint, Peer("other", {"app": "seaweedfs"}), 8333)
    assert not head_sends(endpoint, store, 8333, component="ray-env-runner")
