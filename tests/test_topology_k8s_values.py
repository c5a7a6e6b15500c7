"""Values Kubernetes (the API server, the kubelet, the scheduler) or an S3 client would
refuse are refused when the topology is read: one line naming the field and the value
typed, whichever way the topology came (`uerl render`, `pulumi preview`, the tests). Each
bad case beside the good one at its boundary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import render
from infra.topology import Topology, TopologyError

REPO = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "0123456789abcdef" * 4
NETWORKED = {"pattern": "networked"}


def nested(path: str, value: Any) -> dict[str, Any]:
    """`a.b.c` -> {"a": {"b": {"c": value}}}."""
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def refusal(data: dict[str, Any]) -> str:
    """The one line of the error (the header aside)."""
    with pytest.raises(TopologyError) as info:
        Topology.parse(data)
    header, *lines = str(info.value).splitlines()
    assert header == "invalid topology (1 error):", str(info.value)
    return lines[0].strip()


# -- images: every image field, what the kubelet's parser refuses ---------------------

IMAGE_FIELDS = [
    ("ray.image", {}),
    ("learners.image", {}),
    ("simulator.image", {}),
    ("simulator.forwarder_image", NETWORKED),
    ("executables.loader_image", {}),
]
# Each bad image beside the good one nearest it (registries with ports, digests).
IMAGES = [
    (" uerl/ray:1", "it contains whitespace", "uerl/ray:1"),
    ("uerl/ray:1 ", "it contains whitespace", "localhost:5000/uerl/ray:1"),
    ("uerl/ray :1", "it contains whitespace", "registry.example.com:5000/uerl/ray:2.60.0-py311"),
    ("Uerl/Ray:1", "the repository name 'Ray' must be lower case", "Registry.Example.com/ray:1"),
    (
        "docker.io/Library/ubuntu",
        "the repository name 'Library/ubuntu' must be lower case",
        "docker.io/library/ubuntu",
    ),
    ("ubuntu:", "tag ''", "ubuntu:22.04"),
    ("ubuntu:-x", "tag '-x'", "ubuntu:_x.Y-z"),
    ("ubuntu@sha256:abc", "a sha256 digest is 64 lower-case hex digits", f"ubuntu@{DIGEST}"),
    (
        "ubuntu@md5:" + "0" * 32,
        "digest 'md5:" + "0" * 32 + "' is not sha256:, sha384: or",
        f"ubuntu:22.04@{DIGEST}",
    ),
    ("registry..io/ray:1", "registry 'registry..io'", "[::1]:5000/team/game:v1"),
    ("localhost:99999/ray:1", "registry 'localhost:99999': port 99999", "localhost:65535/ray:1"),
    ("[::1]:0/ray:1", "registry '[::1]:0': port 0 is not a port", "[::1]:1/ray:1"),
    ("uerl//ray", "'' is not a repository path component", "ghcr.io/org/a__b/c-d.e"),
    ("", "it is empty", "ubuntu"),
]


@pytest.mark.parametrize(("field", "extra"), IMAGE_FIELDS)
@pytest.mark.parametrize(("image", "why", "good"), IMAGES)
def test_an_image_the_kubelet_cannot_parse_is_refused_at_its_field(
    field: str, extra: dict[str, Any], image: str, why: str, good: str
) -> None:
    line = refusal(merged(extra, nested(field, image)))
    assert line.startswith(f"topology.{field}: {image!r} is not an image reference: {why}")
    topology = Topology.parse(merged(extra, nested(field, good)))
    section, name = field.split(".")
    assert getattr(getattr(topology, section), name) == good


# -- names that become object names or label values ---------------------------------


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"name": "1uerl"},
            "topology.name: '1uerl' is not a topology name: it starts with a digit",
        ),
        ({"name": "uerl-"}, "topology.name: 'uerl-' is not a topology name: it ends with '-'"),
        ({"namespace": "n" * 64}, "topology.namespace: '" + "n" * 64 + "' is not a namespace name"),
        (
            {"operator": {"namespace": "Kuberay"}},
            "topology.operator.namespace: 'Kuberay' is not a namespace name: it has upper-case",
        ),
        (
            {"executables": {"existing_claim": "Builds"}},
            "topology.executables.existing_claim: 'Builds' is not a PersistentVolumeClaim name",
        ),
        (
            {"runs": {"claim": {"existing_claim": "runs_"}}},
            "topology.runs.claim.existing_claim: 'runs_' is not a PersistentVolumeClaim name",
        ),
    ],
)
def test_a_name_kubernetes_would_refuse_is_refused_naming_the_field(
    data: dict[str, Any], line: str
) -> None:
    assert refusal(data).startswith(line)


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({"namespace": "uerl\n"}, "topology.namespace: 'uerl\\n' is not a namespace name"),
        ({"learners": {"memory": "4Gi\n"}}, "topology.learners.memory: '4Gi\\n' is not a"),
        (
            {"learners": {"gpu_resource": "amd.com/gpu\n"}},
            "topology.learners.gpu_resource: 'amd.com/gpu\\n' is not an extended resource",
        ),
        (
            {"workers": {"custom_resource": "ue\n"}},
            "topology.workers.custom_resource: 'ue\\n' is not a usable Ray custom resource",
        ),
        (
            {"workers": {"labels": {"team": "rl\n"}}},
            "topology.workers.labels.team: 'rl\\n' is not a label value",
        ),
    ],
)
def test_a_trailing_newline_a_yaml_block_leaves_is_refused(data: dict[str, Any], line: str) -> None:
    assert refusal(data).startswith(line)


def test_a_topology_name_starting_with_a_digit_is_refused_as_it_names_services() -> None:
    line = refusal({"name": "9lives"})
    assert "starting with a letter" in line
    assert Topology.parse({"name": "a9lives"}).name == "a9lives"


def test_names_at_their_length_limits_are_accepted() -> None:
    topology = Topology.parse({"name": "a" * 40, "namespace": "9" * 63})
    assert (len(topology.name), topology.namespace) == (40, "9" * 63)
    claim = ".".join(["c" * 63] * 4)[:253]
    assert Topology.parse(nested("executables.existing_claim", claim))
    assert "characters long, more than 253" in refusal(
        nested("executables.existing_claim", claim + "c")
    )


def test_a_claim_name_may_be_a_dotted_subdomain() -> None:
    topology = Topology.parse({"runs": {"claim": {"existing_claim": "runs.team-a"}}})
    assert topology.runs_claim_name == "runs.team-a"


@pytest.mark.parametrize("field", ["executables.storage_class", "runs.claim.storage_class"])
@pytest.mark.parametrize(
    ("value", "why", "good"),
    [("Fast SSD", "it has upper-case letters", "fast-ssd"),
     ("fast ssd", "it contains ' '", ""),
     ("ssd.", "it has an empty part between dots", "csi.example.com-rwx"),
     ("s" * 254, "it is 254 characters long", "s" * 253)],
)  # fmt: skip
def test_a_storage_class_kubernetes_would_refuse_is_refused(
    field: str, value: str, why: str, good: str
) -> None:
    line = refusal(nested(field, value))
    assert line.startswith(f"topology.{field}: {value!r} is not a StorageClass name: {why}")
    # "" is Kubernetes' "no class".
    section, *rest = field.split(".")
    group = getattr(Topology.parse(nested(field, good)), section)
    assert (group.claim if rest[0] == "claim" else group).storage_class == good


# -- placement: node selectors, tolerations ------------------------------------------


@pytest.mark.parametrize(
    ("selector", "line"),
    [
        ({"gpu type": "a100"}, """topology.learners.node_selector["gpu type"]: 'gpu type' is"""),
        ({"pool": "gpu-"}, "topology.learners.node_selector.pool: 'gpu-' is not a label value"),
        ({"pool": "x" * 64}, "topology.learners.node_selector.pool: '" + "x" * 64 + "' is not"),
        ({"a/b/c": "x"}, """topology.learners.node_selector["a/b/c"]: 'a/b/c' is not a label"""),
        ({"Example.com/x": "y"}, """node_selector["Example.com/x"]: 'Example.com/x' is not"""),
    ],
)
def test_a_node_selector_kubernetes_would_refuse_is_refused_naming_its_key(
    selector: dict[str, str], line: str
) -> None:
    assert line in refusal({"learners": {"node_selector": selector}})


def test_node_selector_labels_at_their_limits_are_accepted_and_past_them_refused() -> None:
    selector = {"example.com/" + "k" * 63: "v" * 63, "kubernetes.io/arch": "", "n": "1.2_3-x"}
    assert Topology.parse({"workers": {"node_selector": selector}}).workers.node_selector == (
        selector
    )
    line = refusal({"workers": {"node_selector": {"example.com/" + "k" * 64: "v"}}})
    assert "its name '" + "k" * 64 + "': it is 64 characters long, more than 63" in line


@pytest.mark.parametrize(
    ("toleration", "line"),
    [
        (
            {"key": "gpu type", "operator": "Exists"},
            "topology.learners.tolerations[0].key: 'gpu type' is not a taint key",
        ),
        (
            {"key": "gpu", "value": "a b"},
            "topology.learners.tolerations[0].value: 'a b' is not a taint value",
        ),
        (
            {"key": "gpu", "value": "x", "effect": "NoSchedule", "toleration_seconds": 30},
            "topology.learners.tolerations[0].toleration_seconds: counts only for effect NoExecute",
        ),
        (
            {"key": "", "value": "x"},
            "topology.learners.tolerations[0].key: operator Equal needs the taint's key",
        ),
    ],
)
def test_a_toleration_kubernetes_would_refuse_is_refused_naming_its_field(
    toleration: dict[str, Any], line: str
) -> None:
    assert refusal({"learners": {"tolerations": [toleration]}}).startswith(line)


def test_only_a_no_execute_toleration_keeps_its_seconds() -> None:
    toleration = {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}
    toleration |= {"effect": "NoExecute", "toleration_seconds": 30}
    topology = Topology.parse({"learners": {"tolerations": [toleration]}})
    assert topology.learners.tolerations[0].to_k8s()["tolerationSeconds"] == 30
    toleration["effect"] = "PreferNoSchedule"
    assert "counts only for effect NoExecute" in refusal(
        {"learners": {"tolerations": [toleration]}}
    )


# -- affinity and topology spread constraints: the core API's schema and its rules ----

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
NODE_TERMS = f"nodeAffinity.{REQUIRED}.nodeSelectorTerms"


def node_affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    terms = [{"matchExpressions": list(expressions)}]
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}


def anti_affinity(term: dict[str, Any], weight: int | None = None) -> dict[str, Any]:
    if weight is None:
        return {"podAntiAffinity": {REQUIRED: [term]}}
    return {"podAntiAffinity": {PREFERRED: [{"weight": weight, "podAffinityTerm": term}]}}


FULL_AFFINITY = {
    "nodeAffinity": {
        REQUIRED: {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "example.com/gpus", "operator": "Gt", "values": ["1"]},
                        {"key": "spot", "operator": "DoesNotExist"},
                    ],
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}
                    ],
                }
            ]
        },
        PREFERRED: [
            {
                "weight": 100,
                "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]},
            }
        ],
    },
    "podAffinity": {
        PREFERRED: [
            {
                "weight": 1,
                "podAffinityTerm": {
                    "topologyKey": "topology.kubernetes.io/zone",
                    "labelSelector": {"matchLabels": {"app": "uerl"}},
                    "namespaceSelector": {},
                    "matchLabelKeys": ["pod-template-hash"],
                },
            }
        ]
    },
    "podAntiAffinity": {
        REQUIRED: [
            {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {
                    "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]
                },
                "namespaces": ["uerl", "games"],
            }
        ]
    },
}


def test_a_full_kubernetes_affinity_is_accepted_as_written_and_a_key_deep_in_it_checked() -> None:
    topology = Topology.parse({"learners": {"affinity": FULL_AFFINITY}})
    assert topology.learners.affinity == FULL_AFFINITY
    bad = json.loads(json.dumps(FULL_AFFINITY))
    bad["podAntiAffinity"][REQUIRED][0]["labelSelector"]["matchExpressions"][0]["vals"] = []
    line = refusal({"learners": {"affinity": bad}})
    assert line.endswith(
        "labelSelector.matchExpressions[0].vals: unknown key (did you mean values?)"
    )


@pytest.mark.parametrize(
    ("affinity", "line"),
    [
        (
            node_affinity({"key": "a", "operator": "In", "valuess": ["x"]}),
            f"topology.learners.affinity.{NODE_TERMS}[0].matchExpressions[0].valuess: unknown "
            "key (did you mean values?)",
        ),
        (
            node_affinity({"key": "a", "operator": "in", "values": ["x"]}),
            f"{NODE_TERMS}[0].matchExpressions[0].operator: 'in' is not a node selector "
            "operator (In, NotIn, Exists, DoesNotExist, Gt, Lt) (did you mean In?)",
        ),
        (
            node_affinity({"key": "a", "operator": "In"}),
            f"{NODE_TERMS}[0].matchExpressions[0].values: operator In needs at least one value",
        ),
        (
            node_affinity({"key": "a", "operator": "Exists", "values": ["x"]}),
            f"{NODE_TERMS}[0].matchExpressions[0].values: operator Exists takes no values",
        ),
        (
            node_affinity({"key": "a", "operator": "Gt", "values": ["many"]}),
            f"{NODE_TERMS}[0].matchExpressions[0].values[0]: 'many': Gt compares integers",
        ),
        (
            node_affinity({"key": "a b", "operator": "Exists"}),
            f"{NODE_TERMS}[0].matchExpressions[0].key: 'a b' is not a label key",
        ),
        (
            node_affinity({"key": "a", "operator": "In", "values": ["a b"]}),
            f"{NODE_TERMS}[0].matchExpressions[0].values[0]: 'a b' is not a label value",
        ),
        (
            node_affinity({"operator": "Exists"}),
            f"{NODE_TERMS}[0].matchExpressions[0]: missing key (required by Kubernetes)",
        ),
        (
            {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}},
            f"{NODE_TERMS}: needs at least one node selector term",
        ),
        (
            {"nodeAffinity": {REQUIRED: [{"matchExpressions": []}]}},
            f"nodeAffinity.{REQUIRED}: expected a map, got a list",
        ),
        (
            anti_affinity({"topologyKey": "kubernetes.io/hostname"}, weight=0),
            f"podAntiAffinity.{PREFERRED}[0].weight: 0 is not a weight from 1 to 100",
        ),
        (
            anti_affinity({"topologyKey": ""}),
            f"podAntiAffinity.{REQUIRED}[0].topologyKey: is empty: give a node label key",
        ),
        (
            anti_affinity({"labelSelector": {}}),
            f"podAntiAffinity.{REQUIRED}[0]: missing topologyKey (required by Kubernetes)",
        ),
        (
            anti_affinity({"topologyKey": "zone", "namespaces": ["Games"]}),
            f"podAntiAffinity.{REQUIRED}[0].namespaces[0]: 'Games' is not a namespace name",
        ),
        (
            anti_affinity({"topologyKey": "zone", "matchLabelKeys": ["app"]}),
            f"podAntiAffinity.{REQUIRED}[0].matchLabelKeys: needs a labelSelector beside it",
        ),
        (
            anti_affinity({"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "a_"}}}),
            f"podAntiAffinity.{REQUIRED}[0].labelSelector.matchLabels.app: 'a_' is not a label "
            "value",
        ),
        (
            {"podAffinity": {REQUIRED: [{"topologyKey": ["zone"]}]}},
            f"podAffinity.{REQUIRED}[0].topologyKey: expected a string, got a list",
        ),
        (
            {"nodeAffinity": {}, "podAfinity": {}},
            "topology.learners.affinity.podAfinity: unknown key (did you mean podAffinity?)",
        ),
    ],
)
def test_an_affinity_kubernetes_would_refuse_is_refused_at_its_key(
    affinity: dict[str, Any], line: str
) -> None:
    found = refusal({"learners": {"affinity": affinity}})
    assert found.startswith("topology.learners.affinity.") and line in found


def test_a_number_typed_where_kubernetes_wants_text_reads_as_that_text() -> None:
    # `pulumi config set --path ...values[0] 3` stores an integer.
    affinity = node_affinity({"key": "example.com/gpus", "operator": "Gt", "values": [3]})
    topology = Topology.parse({"workers": {"affinity": affinity}})
    assert topology.workers.affinity == node_affinity(
        {"key": "example.com/gpus", "operator": "Gt", "values": ["3"]}
    )


SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}


@pytest.mark.parametrize(
    ("constraints", "line"),
    [
        (
            [SPREAD | {"whenUnsatisfiable": "ScheduleAnyway"}] * 2,
            "topology_spread_constraints[1]: repeats the topologyKey and whenUnsatisfiable of "
            "item 0",
        ),
        (
            [SPREAD | {"whenUnsatisfiable": "scheduleAnyway"}],
            "topology_spread_constraints[0].whenUnsatisfiable: 'scheduleAnyway' is not one of "
            "DoNotSchedule, ScheduleAnyway (did you mean ScheduleAnyway?)",
        ),
        (
            [SPREAD | {"whenUnsatisfiable": "DoNotSchedule", "maxSkew": 0}],
            "topology_spread_constraints[0].maxSkew: 0 is not above 0",
        ),
        (
            [SPREAD | {"whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}],
            "topology_spread_constraints[0].minDomains: counts only with whenUnsatisfiable "
            "DoNotSchedule",
        ),
        (
            [SPREAD | {"whenUnsatisfiable": "DoNotSchedule", "maxskew": 1}],
            "topology_spread_constraints[0].maxskew: unknown key (did you mean maxSkew?)",
        ),
        (
            [
                SPREAD
                | {"whenUnsatisfiable": "DoNotSchedule"}
                | {"matchLabelKeys": ["app.kubernetes.io/instance"]}
            ],
            "topology_spread_constraints[0].matchLabelKeys[0]: 'app.kubernetes.io/instance' is "
            "also in the labelSelector",
        ),
    ],
)
def test_a_spread_constraint_kubernetes_would_refuse_is_refused_at_its_key(
    constraints: list[dict[str, Any]], line: str
) -> None:
    data = NETWORKED | {"simulator": {"topology_spread_constraints": constraints}}
    assert line in refusal(data)


def test_spread_constraints_on_two_keys_are_accepted_one_key_twice_refused() -> None:
    constraints = [
        SPREAD | {"whenUnsatisfiable": "DoNotSchedule", "minDomains": 2},
        SPREAD | {"topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"},
    ]
    data = NETWORKED | {"simulator": {"topology_spread_constraints": constraints}}
    assert Topology.parse(data).simulator.topology_spread_constraints == constraints
    constraints[1]["topologyKey"] = SPREAD["topologyKey"]
    constraints[1]["whenUnsatisfiable"] = "DoNotSchedule"
    assert "[1]: repeats the topologyKey and whenUnsatisfiable of item 0" in refusal(data)


# -- the run store: S3 endpoints, prefixes, regions, buckets -------------------------


def s3(**fields: Any) -> dict[str, Any]:
    return {"runs": {"store": "s3", "s3": {"bucket": "uerl-runs"} | fields}}


# Each bad value beside the good one nearest it.
STORES = [
    (
        {"endpoint": "http://minio:99999"},
        "topology.runs.s3.endpoint: 'http://minio:99999' is not an S3 endpoint URL: port "
        "'99999' is not a port number (1 to 65535)",
        {"endpoint": "http://minio:65535"},
    ),
    (
        {"endpoint": "http://:9000"},
        "'http://:9000' is not an S3 endpoint URL: it has no host",
        {"endpoint": "http://10.0.0.5:9000"},
    ),
    (
        {"endpoint": "http://minio:"},
        "is not an S3 endpoint URL: its port is empty",
        {"endpoint": "http://seaweedfs.storage.svc:8333/"},
    ),
    (
        {"endpoint": "http://minio:0"},
        "is not an S3 endpoint URL: port 0 is not a port",
        {"endpoint": "http://minio:1"},
    ),
    (
        {"endpoint": "http://a_b:9000"},
        "is not an S3 endpoint URL: host 'a_b' is not a host",
        {"endpoint": "https://s3.eu-west-1.amazonaws.com"},
    ),
    (
        {"endpoint": "http://k:s@minio:9000"},
        "it holds credentials: give them in runs.s3.credentials_secret",
        {"endpoint": "http://minio:9000", "credentials_secret": "minio-keys"},
    ),
    (
        {"endpoint": "http://[::1:9000"},
        "is not an S3 endpoint URL: Invalid IPv6 URL",
        {"endpoint": "https://[::1]:8333"},
    ),
    (
        {"endpoint": "ftp://minio"},
        "it does not start with http:// or https://",
        {"endpoint": "https://minio"},
    ),
    (
        {"prefix": "runs/../other"},
        "topology.runs.s3.prefix: 'runs/../other': a key prefix has no '..' part",
        {"prefix": "runs/..other/a.b"},
    ),
    (
        {"prefix": "./runs"},
        "topology.runs.s3.prefix: './runs': a key prefix has no '.' part",
        {"prefix": ".runs"},
    ),
    ({"prefix": "runs\nx"}, "a key prefix has no control characters", {"prefix": "runs x"}),
    (
        {"region": "us east 1"},
        "topology.runs.s3.region: 'us east 1' is not an S3 region: it contains ' '",
        {"region": "us-east-1"},
    ),
    (
        {"region": "-eu"},
        "topology.runs.s3.region: '-eu' is not an S3 region: it starts with '-'",
        {"region": "garage"},
    ),
    (
        {"bucket": "10.1.2.3"},
        "'10.1.2.3' is not an S3 bucket name: it is formatted as an IP address",
        {"bucket": "10.1.2.3.runs"},
    ),
    (
        {"bucket": "runs..a"},
        "'runs..a' is not an S3 bucket name: it contains '..'",
        {"bucket": "runs.a"},
    ),
    (
        {"bucket": "runs.-a"},
        "'runs.-a' is not an S3 bucket name: it contains '.-'",
        {"bucket": "runs--a"},
    ),
    (
        {"bucket": "xn--runs"},
        "'xn--runs' is not an S3 bucket name: AWS reserves names",
        {"bucket": "xn-runs"},
    ),
    ({"bucket": "a" * 64}, "it is 64 characters long", {"bucket": "a" * 63}),
]


@pytest.mark.parametrize(("fields", "line", "good"), STORES)
def test_a_run_store_an_s3_client_cannot_use_is_refused_naming_the_field(
    fields: dict[str, Any], line: str, good: dict[str, Any]
) -> None:
    found = refusal(s3(**fields))
    assert found.startswith("topology.runs.s3.") and line in found
    assert Topology.parse(s3(**good)).runs.s3 is not None


# -- the messages: the field to use, never a class name ------------------------------


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"learners": {"priority_class": "high"}},
            "topology.learners.priority_class: unknown key (did you mean priority_class_name?)",
        ),
        (
            {"workers": {"nodeSelector": {"a": "b"}}},
            "topology.workers.nodeSelector: unknown key (did you mean node_selector?)",
        ),
        (
            {"learners": {"tolerations": [{"key": "a", "tolerationSeconds": 5}]}},
            "topology.learners.tolerations[0].tolerationSeconds: unknown key (did you mean "
            "toleration_seconds?)",
        ),
        ({"runs": {"claims": {}}}, "topology.runs.claims: unknown key (did you mean claim?)"),
        ({"wrokers": {}}, "topology.wrokers: unknown key (did you mean workers?)"),
    ],
)
def test_a_near_miss_key_is_told_the_field_it_meant(data: dict[str, Any], line: str) -> None:
    assert refusal(data) == line


def _model_paths(model: Any, prefix: str = "") -> list[str]:
    """The config path of every field holding a model, or none (nested ones included)."""
    import typing

    from pydantic import BaseModel

    out = []
    for name, info in model.model_fields.items():
        if typing.get_origin(info.annotation) is list:
            continue  # a list of models: a string there is "not a valid list"
        for arg in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out.append(f"{prefix}{name}")
                out += _model_paths(arg, f"{prefix}{name}.")
    return out


@pytest.mark.parametrize("path", sorted(set(_model_paths(Topology))))
def test_a_group_given_a_string_is_told_it_wants_a_map_without_a_class_name(path: str) -> None:
    import importlib
    import pkgutil

    from pydantic import BaseModel

    import infra.topology

    modules = [
        importlib.import_module(f"infra.topology.{info.name}")
        for info in pkgutil.iter_modules(infra.topology.__path__)
    ]
    classes = [
        name
        for module in modules
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, BaseModel)
    ]
    data = merged({"pattern": "networked"}, nested(path, "oops"))
    with pytest.raises(TopologyError) as info:
        Topology.parse(data)
    message = str(info.value)
    assert f"topology.{path}: expected a map of its fields, got the string 'oops'" in message
    assert not [name for name in classes if name in message]


# -- one check for every way in ------------------------------------------------------


def test_uerl_render_refuses_a_bad_value_with_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = render.main(["--set", "topology.workers.node_selector.pool=gpu pool"])
    err = capsys.readouterr().err
    assert code == 2
    assert "topology.workers.node_selector.pool: 'gpu pool' is not a label value" in err


def test_pulumi_preview_refuses_the_same_values_with_one_run_error_creating_nothing() -> None:
    from infra_fixtures import run_program

    report = run_program("topology.name=9lives", "topology.ray.image=uerl/Ray:1")
    assert report["error"]["type"] == "RunError" and report["resources"] == []
    lines = report["error"]["message"].splitlines()
    assert lines[0] == "invalid topology (2 errors):"
    assert lines[1].strip().startswith("topology.name: '9lives' is not a topology name")
    assert lines[2].strip().startswith("topology.ray.image: 'uerl/Ray:1' is not an image")


def test_the_pod_schema_is_the_raycluster_crds_own() -> None:
    from infra import k8s_rules

    crd_file = REPO / "third_party" / "kuberay-operator-1.7.0" / "crds" / "ray.io_rayclusters.yaml"
    crd = yaml.load(crd_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert json.loads(k8s_rules.SCHEMA_FILE.read_text()) == k8s_rules.extract_pod_schema(crd)
