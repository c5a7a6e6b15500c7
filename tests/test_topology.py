"""The topology spec: defaults in the model, every field validated, errors naming config paths."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from infra.topology import Topology, TopologyError


def error_for(data: Any) -> str:
    with pytest.raises(TopologyError) as info:
        Topology.parse(data)
    return str(info.value)


def test_empty_config_gives_the_documented_defaults() -> None:
    t = Topology.parse(None)
    assert (t.name, t.namespace, t.pattern, t.create_namespace) == ("uerl", "uerl", "sidecar", True)
    assert (t.learners.replicas, t.learners.gpus, t.workers.replicas) == (1, 0, 2)
    assert t.workers.custom_resource == "ue_worker"
    assert (t.simulator.kind, t.simulator.port, t.simulator.discovery) == (
        "unreal",
        50051,
        "dedicated",
    )
    assert t.simulator.startup_timeout_s == 120
    assert (t.executables.access_mode, t.executables.mount_path) == ("ReadWriteMany", "/opt/ue")
    assert t.executables.existing_claim is None and t.executables.source_url is None
    assert (t.operator.install, t.operator.chart_version) == (True, "1.7.0")
    assert t.operator.repository == "https://ray-project.github.io/kuberay-helm/"


def test_default_ray_version_is_the_installed_ray() -> None:
    assert Topology().ray.version == importlib.metadata.version("ray")


def test_default_ray_image_follows_the_ray_version() -> None:
    assert Topology.parse({"ray": {"version": "2.61.0"}}).ray.image_ref.startswith(
        "uerl/ray:2.61.0"
    )


def test_overrides_merge_with_defaults() -> None:
    t = Topology.parse({"workers": {"replicas": 4}, "pattern": "networked"})
    assert (t.workers.replicas, t.pattern, t.workers.custom_resource) == (
        4,
        "networked",
        "ue_worker",
    )


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"wrokers": {}}, "topology.wrokers: unknown key"),
        ({"workers": {"replica": 3}}, "topology.workers.replica: unknown key"),
        ({"workers": {"replicas": -1}}, "topology.workers.replicas:"),
        ({"learners": {"replicas": -1}}, "topology.learners.replicas:"),
        ({"learners": {"gpus": -1}}, "topology.learners.gpus:"),
        ({"learners": {"cpus": 0}}, "topology.learners.cpus:"),
        ({"learners": {"memory": "4GB"}}, "topology.learners.memory:"),
        (
            {"learners": {"tolerations": [{"operator": "Maybe"}]}},
            "topology.learners.tolerations[0].operator:",
        ),
        ({"name": "Bad_Name"}, "topology.name:"),
        ({"name": "x" * 41}, "topology.name:"),
        ({"namespace": "-ns"}, "topology.namespace:"),
        ({"pattern": "mesh"}, "topology.pattern:"),
        ({"ray": {"version": "latest"}}, "topology.ray.version:"),
        ({"ray": {"head": {"cpus": -1}}}, "topology.ray.head.cpus:"),
        ({"workers": {"custom_resource": "CPU"}}, "topology.workers.custom_resource:"),
        ({"workers": {"custom_resource": "1ue"}}, "topology.workers.custom_resource:"),
        ({"simulator": {"kind": "godot"}}, "topology.simulator.kind:"),
        ({"simulator": {"port": 0}}, "topology.simulator.port:"),
        ({"simulator": {"port": 65536}}, "topology.simulator.port:"),
        ({"simulator": {"gpus": -1}}, "topology.simulator.gpus:"),
        ({"simulator": {"startup_timeout_s": 0}}, "topology.simulator.startup_timeout_s:"),
        ({"simulator": {"discovery": "any"}}, "topology.simulator.discovery:"),
        ({"simulator": {"args": ["-Port={hostname}"]}}, "topology.simulator.args:"),
        ({"simulator": {"internal_port": 50051}}, "topology.simulator:"),
        ({"simulator": {"listen": "everywhere"}}, "topology.simulator.listen:"),
        ({"image_pull_policy": "Sometimes"}, "topology.image_pull_policy:"),
        ({"operator": {"crds": "delete"}}, "topology.operator.crds:"),
        ({"executables": {"loader_timeout_s": 1}}, "topology.executables.loader_timeout_s:"),
        ({"executables": {"existing_claim": "Claim"}}, "topology.executables.existing_claim:"),
        ({"executables": {"size": "lots"}}, "topology.executables.size:"),
        ({"executables": {"access_mode": "ReadWriteOnce"}}, "topology.executables.access_mode:"),
        ({"executables": {"mount_path": "opt/ue"}}, "topology.executables.mount_path:"),
        ({"executables": {"source_url": "ftp://x/y.zip"}}, "topology.executables.source_url:"),
        ({"operator": {"install": "maybe"}}, "topology.operator.install:"),
        ({"operator": {"namespace": "Kube_Ray"}}, "topology.operator.namespace:"),
        # Bad input a new user gave (issue 42): each rendered or failed only at `pulumi up`.
        ({"workers": {"replicas": True}}, "topology.workers.replicas: expected a number, got "),
        ({"learners": {"gpus": False}}, "topology.learners.gpus: expected a number, got false"),
        ({"workers": {"cpus": True}}, "topology.workers.cpus: expected a number, got true"),
        ({"learners": {"memory": 0}}, "topology.learners.memory: '0' is zero"),
        ({"simulator": {"memory": "0Gi"}}, "topology.simulator.memory: '0Gi' is zero"),
        ({"workers": {"cpus": 1e9}}, "topology.workers.cpus: Input should be less than or equal"),
        ({"ray": {"head": {"cpus": 2000}}}, "topology.ray.head.cpus: Input should be less than"),
        (
            {"learners": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}},
            "topology.learners.tolerations[0].value: operator Exists tolerates every value",
        ),
        (
            {"workers": {"tolerations": [{"value": "x"}]}},
            "topology.workers.tolerations[0].key: operator Equal needs the taint's key",
        ),
    ],
)
def test_invalid_field_fails_with_one_message_naming_its_config_path(data: Any, path: str) -> None:
    message = error_for(data)
    assert message.startswith("invalid topology (1 error):")
    assert path in message


def test_all_errors_are_reported_together() -> None:
    message = error_for({"workers": {"replicas": -1}, "simulator": {"port": 70000}})
    assert "(2 errors)" in message
    assert "topology.workers.replicas" in message and "topology.simulator.port" in message


def test_map_keys_that_are_not_identifiers_are_quoted_in_the_path() -> None:
    message = error_for({"learners": {"node_selector": {"kubernetes.io/arch": [1]}}})
    assert 'topology.learners.node_selector["kubernetes.io/arch"]:' in message


def test_a_non_mapping_topology_is_rejected() -> None:
    assert "topology" in error_for(["workers"])


def test_values_stored_as_strings_by_pulumi_are_converted() -> None:
    # `pulumi config set --path topology.workers.cpus 1.5` stores the string "1.5".
    assert Topology.parse({"workers": {"cpus": "1.5"}}).workers.cpus == 1.5


def test_unreal_command_gets_the_executable_and_schola_port() -> None:
    sim = Topology.parse({"simulator": {"port": 6000, "executable": "Linux/MyGame.sh"}}).simulator
    command, args = sim.render_command("/opt/ue/")
    assert command == ["/opt/ue/Linux/MyGame.sh"]
    assert args[0] == "-ScholaPort=6000"


def test_custom_args_substitute_the_port() -> None:
    sim = Topology.parse({"simulator": {"args": ["--grpc={port}", "{{literal}}"]}}).simulator
    assert sim.render_command("/opt/ue")[1] == ["--grpc=50051", "{literal}"]


def test_derived_names_are_stable() -> None:
    t = Topology.parse({"name": "rl", "namespace": "games"})
    assert t.head_service_host == "rl-head-svc.games.svc.cluster.local"
    assert t.claim_name == "rl-ue-executables"
    assert t.ue_instance_name(3) == "rl-ue-3"
    assert t.ue_instance_host(3) == "rl-ue-3.rl-ue.games.svc.cluster.local"
    assert Topology.parse({"executables": {"existing_claim": "builds"}}).claim_name == "builds"


def test_dedicated_discovery_exists_only_in_the_networked_pattern() -> None:
    assert not Topology.parse({"pattern": "sidecar"}).has_dedicated_discovery
    assert Topology.parse({"pattern": "networked"}).has_dedicated_discovery
    networked_reuse = {"pattern": "networked", "simulator": {"discovery": "worker1"}}
    assert not Topology.parse(networked_reuse).has_dedicated_discovery


def test_only_unreal_games_use_the_executables_volume() -> None:
    assert Topology.parse({"simulator": {"kind": "unreal"}}).uses_executables
    assert not Topology.parse({"simulator": {"kind": "mock"}}).uses_executables


def test_game_names_carry_the_topology_name_so_two_stacks_can_share_a_namespace() -> None:
    a, b = (Topology.parse({"name": n, "pattern": "networked"}) for n in ("red", "blue"))
    assert a.endpoints().worker_endpoint(1) != b.endpoints().worker_endpoint(1)
    assert a.ue_set_name == "red-ue" and b.ue_set_name == "blue-ue"


# -- `pulumi config set --path` types true/false and digits ---------------------------


@pytest.mark.parametrize(
    ("data", "read", "expected"),
    [
        (
            {"learners": {"node_selector": {"nvidia.com/gpu.present": True}}},
            lambda t: t.learners.node_selector["nvidia.com/gpu.present"],
            "true",
        ),
        (
            {"workers": {"tolerations": [{"key": 1, "value": False}]}},
            lambda t: (t.workers.tolerations[0].key, t.workers.tolerations[0].value),
            ("1", "false"),
        ),
        ({"simulator": {"env": {"UE_THREADS": 8}}}, lambda t: t.simulator.env["UE_THREADS"], "8"),
        ({"simulator": {"args": ["-x", 3, True]}}, lambda t: t.simulator.args, ["-x", "3", "true"]),
        ({"executables": {"storage_class": 1}}, lambda t: t.executables.storage_class, "1"),
        ({"namespace": 123}, lambda t: t.namespace, "123"),
        ({"learners": {"memory": 2}}, lambda t: t.learners.memory, "2"),
    ],
)
def test_booleans_and_integers_typed_by_config_set_path_are_read_as_the_text_typed(
    data: Any, read: Any, expected: Any
) -> None:
    assert read(Topology.parse(data)) == expected


def test_networked_loopback_games_listen_on_the_port_after_the_served_one() -> None:
    t = Topology.parse({"pattern": "networked"})
    assert (t.simulator.listen, t.forwards_game_port) == ("loopback", True)
    assert (t.simulator.port, t.game_listen_port) == (50051, 50052)


def test_games_bound_to_all_interfaces_or_in_sidecars_listen_on_the_served_port() -> None:
    every = Topology.parse({"pattern": "networked", "simulator": {"listen": "all_interfaces"}})
    sidecar = Topology.parse({"pattern": "sidecar"})
    assert every.game_listen_port == sidecar.game_listen_port == 50051
    assert not every.forwards_game_port and not sidecar.forwards_game_port


def test_mock_game_binds_where_the_listen_switch_says() -> None:
    loopback = Topology.parse({"simulator": {"kind": "mock"}}).simulator
    every = Topology.parse({"simulator": {"kind": "mock", "listen": "all_interfaces"}}).simulator
    assert loopback.render_command("/opt/ue")[1][:2] == ["--host", "127.0.0.1"]
    assert every.render_command("/opt/ue")[1][:2] == ["--host", "0.0.0.0"]
