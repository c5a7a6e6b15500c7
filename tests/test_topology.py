"""The topology spec: defaults in the model, every field validated, errors naming config paths."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from infra.topology import SHM_MEMORY_FRACTION, Topology, TopologyError, quantity_value
from infra.topology_reference import rows


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


# -- a team's own cluster: images, GPUs, placement, identity, pod shape -------------------

SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "DoNotSchedule",
}


def test_own_cluster_fields_default_to_the_pods_uerl_made_without_them() -> None:
    t = Topology.parse(None)
    assert (t.learners.image, t.learners.gpu_resource, t.simulator.gpu_resource) == (
        None,
        "nvidia.com/gpu",
        "nvidia.com/gpu",
    )
    for group in t.pod_groups().values():
        assert group.pod_fields_set() == []
        assert group.service_account is None
    for ray in (t.ray.head, t.learners, t.workers):
        assert (ray.cpu_limits, ray.ephemeral_storage, ray.shm_size) == (True, "1Gi", None)
    assert (t.simulator.cpu_limits, t.simulator.ephemeral_storage) == (True, None)


def test_the_reference_states_the_default_dev_shm_share_the_code_uses() -> None:
    (row,) = [r for r in rows() if r.path == "learners.shm_size"]
    assert f"{SHM_MEMORY_FRACTION:.0%} of `memory`" in row.comment


@pytest.mark.parametrize(
    ("text", "amount"),
    [("4Gi", 4 * 2**30), ("3000M", 3e9), ("1e3", 1000), ("500m", 0.5), ("2", 2), ("1E", 1e18)],
)
def test_quantities_are_read_in_their_binary_decimal_and_exponent_forms(
    text: str, amount: float
) -> None:
    assert quantity_value(text) == amount


@pytest.mark.parametrize("name", ["amd.com/gpu", "nvidia.com/mig-1g.10gb", "gpu.intel.com/i915"])
def test_a_gpu_resource_is_any_extended_resource_name(name: str) -> None:
    assert Topology.parse({"learners": {"gpu_resource": name}}).learners.gpu_resource == name


@pytest.mark.parametrize(
    ("group", "name"),
    [
        ("learners", "gpu"),
        ("learners", "kubernetes.io/gpu"),
        ("simulator", "Nvidia.com/gpu"),
        ("simulator", "amd.com/"),
    ],
)
def test_a_gpu_resource_that_is_not_an_extended_resource_name_is_refused(
    group: str, name: str
) -> None:
    message = error_for({group: {"gpu_resource": name}})
    assert f"topology.{group}.gpu_resource: {name!r} is not an extended resource name" in message


@pytest.mark.parametrize("key", ["app.kubernetes.io/name", "app.kubernetes.io/instance"])
def test_a_groups_labels_may_not_replace_uerls_own(key: str) -> None:
    message = error_for({"workers": {"labels": {key: "mine"}}})
    assert f'topology.workers.labels["{key}"]: {key!r} is one of uerl\'s own labels' in message


def test_a_groups_labels_may_not_replace_kuberays() -> None:
    message = error_for({"learners": {"labels": {"ray.io/group": "mine"}}})
    assert """topology.learners.labels["ray.io/group"]: 'ray.io/group': labels starting""" in (
        message
    )


def test_a_sidecar_game_takes_no_pod_fields_its_pod_is_the_workers() -> None:
    message = error_for({"pattern": "sidecar", "simulator": {"node_selector": {"pool": "games"}}})
    assert "topology.simulator.node_selector: sidecar games run in the workers' pods" in message
    message = error_for({"simulator": {"topology_spread_constraints": [SPREAD]}})
    assert "topology.simulator.topology_spread_constraints: sidecar games run in" in message


def test_networked_games_take_pod_fields_of_their_own() -> None:
    assert Topology.parse({"pattern": "networked", "simulator": {"node_selector": {"a": "b"}}})


def test_loader_pod_fields_without_a_loader_job_are_refused() -> None:
    message = error_for({"executables": {"loader": {"priority_class_name": "batch"}}})
    assert "topology.executables.loader.priority_class_name: no loader Job runs" in message
    loader = {"source_url": "https://x/g.zip", "loader": {"priority_class_name": "batch"}}
    assert Topology.parse({"executables": loader}).executables.loader.priority_class_name


def test_only_an_account_the_stack_creates_takes_annotations() -> None:
    account = {"name": "runner", "annotations": {"eks.amazonaws.com/role-arn": "arn:x"}}
    message = error_for({"learners": {"service_account": account}})
    assert "topology.learners.service_account.annotations: the stack annotates only an" in message


def test_an_account_created_for_two_groups_has_one_set_of_annotations() -> None:
    first = {"name": "runner", "create": True, "annotations": {"a.io/role": "one"}}
    second = {**first, "annotations": {"a.io/role": "two"}}
    message = error_for(
        {"ray": {"head": {"service_account": first}}, "workers": {"service_account": second}}
    )
    assert "topology.workers.service_account.annotations: 'runner' is created for ray.head" in (
        message
    )


def test_an_account_named_by_several_groups_is_created_once() -> None:
    account = {"name": "runner", "create": True}
    t = Topology.parse(
        {
            "learners": {"service_account": account},
            "workers": {"service_account": {"name": "runner"}},
        }
    )
    assert [a.name for a in t.created_service_accounts()] == ["runner"]


def test_dev_shm_must_leave_the_container_memory_for_ray() -> None:
    message = error_for({"ray": {"head": {"memory": "4Gi", "shm_size": "4096Mi"}}})
    assert "topology.ray.head.shm_size: 4096Mi is not below memory 4Gi" in message


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (
            {"learners": {"affinity": ["nodeAffinity"]}},
            "topology.learners.affinity: Input should be a valid dictionary",
        ),
        (
            {"workers": {"affinity": {"nodeAfinity": {}}}},
            "topology.workers.affinity.nodeAfinity: unknown key (did you mean nodeAffinity?)",
        ),
        (
            {"ray": {"head": {"affinity": {"podAntiAffinity": "spread"}}}},
            "topology.ray.head.affinity.podAntiAffinity: expected a map, got the string 'spread'",
        ),
        (
            {"learners": {"priority_class_name": "High"}},
            "topology.learners.priority_class_name: 'High' is not a PriorityClass name",
        ),
        (
            {"workers": {"image_pull_secrets": ["Registry"]}},
            "topology.workers.image_pull_secrets[0]: 'Registry' is not a Secret name",
        ),
        (
            {"workers": {"image_pull_secrets": "registry"}},
            "topology.workers.image_pull_secrets: Input should be a valid list",
        ),
        (
            {"learners": {"service_account": {}}},
            "topology.learners.service_account.name: Field required",
        ),
        (
            {"learners": {"service_account": {"name": "Runner"}}},
            "topology.learners.service_account.name: 'Runner' is not a ServiceAccount name",
        ),
        (
            {"workers": {"labels": {"team": "a b"}}},
            "topology.workers.labels.team: 'a b' is not a label value: it contains ' '",
        ),
        (
            {"ray": {"head": {"annotations": {"no spaces": "x"}}}},
            """topology.ray.head.annotations["no spaces"]: 'no spaces' is not a label or """
            "annotation key",
        ),
        (
            {"learners": {"cpu_limits": "maybe"}},
            "topology.learners.cpu_limits: Input should be a valid boolean",
        ),
        (
            {"workers": {"ephemeral_storage": "lots"}},
            "topology.workers.ephemeral_storage: 'lots' is not a Kubernetes quantity",
        ),
        ({"learners": {"shm_size": "0"}}, "topology.learners.shm_size: '0' is zero"),
        ({"learners": {"image": ["a"]}}, "topology.learners.image: Input should be a valid string"),
        (
            {
                "pattern": "networked",
                "simulator": {"topology_spread_constraints": [{"maxSkew": 1}]},
            },
            "topology.simulator.topology_spread_constraints[0]: missing topologyKey, "
            "whenUnsatisfiable (required by Kubernetes)",
        ),
        (
            {"executables": {"loader": {"replicas": 2}}},
            "topology.executables.loader.replicas: unknown key",
        ),
    ],
)
def test_bad_own_cluster_input_names_the_field(data: Any, path: str) -> None:
    message = error_for(data)
    assert message.startswith("invalid topology (1 error):")
    assert path in message


def test_keep_on_destroy_is_refused_for_a_claim_uerl_does_not_create() -> None:
    # uerl never deletes an existing claim: the field would do nothing.
    message = error_for({"runs": {"claim": {"existing_claim": "ours", "keep_on_destroy": False}}})
    assert "topology.runs.claim.keep_on_destroy: runs.claim.existing_claim is set" in message


def test_the_checkpoints_a_run_keeps_reach_the_training_through_the_endpoints() -> None:
    runs = Topology.parse({"runs": {"keep_checkpoints": 3}}).endpoints().runs
    assert runs is not None and runs.keep_checkpoints == 3
