"""Random topology values of the kinds Kubernetes validates, and what the renderer makes of
them: shared by the property test of `make test` (tests/test_topology_oracle.py, against
independent oracles) and the tier's (tests/k8s/test_render_dry_run.py, against the real
API server).

A case puts one random value at one place of a base topology that uses every such place.
`rendered` gives the objects `uerl render` prints for it when the topology takes it; when
the topology refuses it, the objects it would have printed: the base rendered with a
placeholder there, the raw value patched in where the placeholder went. No imports of the
tier's harness: `make test` loads this alone.
"""

from __future__ import annotations

import copy
import json
import random
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from infra import manifests
from infra.manifests.common import K8sObject
from infra.topology import Topology, TopologyError

NAMESPACE = "uerl-values"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
# The games' own labelSelector a spread constraint without one is given (manifests/simulator).
# A registry as a host name (RFC 1123 labels) or [IPv6], with an optional port.
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
REGISTRY = rf"(?:{_LABEL}(?:\\.{_LABEL})*|\\[[0-9A-Fa-f:]+\\])(?::[0-9]+)?"
GAME_SELECTOR_KEYS = ("app.kubernetes.io/instance", "app.kubernetes.io/name")

# A valid affinity using every part whose shape the schema gives; the placeholder of the
# affinity kind (its marker key names no node label anyone sets).
AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        REQUIRED: {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "zqx-affinity", "operator": "In", "values": ["a", "b"]},
                        {"key": "spot", "operator": "DoesNotExist"},
                    ],
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": ["node-9"]}
                    ],
                }
            ]
        },
        PREFERRED: [
            {
                "weight": 10,
                "preference": {
                    "matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["1"]}]
                },
            }
        ],
    },
    "podAffinity": {
        PREFERRED: [
            {
                "weight": 50,
                "podAffinityTerm": {
                    "topologyKey": "topology.kubernetes.io/zone",
                    "labelSelector": {"matchLabels": {"team": "rl"}},
                    "namespaceSelector": {},
                },
            }
        ]
    },
    "podAntiAffinity": {
        REQUIRED: [
            {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {
                    "matchExpressions": [{"key": "role", "operator": "In", "values": ["x"]}]
                },
                "namespaces": [NAMESPACE],
            }
        ]
    },
}
SPREAD: list[dict[str, Any]] = [
    {"maxSkew": 1, "topologyKey": "zqx-spread", "whenUnsatisfiable": "DoNotSchedule"},
    {
        "maxSkew": 2,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
    },
]


@dataclass(frozen=True)
class Place:
    """Where a kind of value goes in the topology, and the valid value standing in for it
    (unique in the rendered objects, so that the raw value can be patched in for it)."""

    kind: str
    path: tuple[str | int, ...]
    placeholder: Any
    generate: Callable[[random.Random], Any]
    # The value is a map key (a label's key): the last part of `path` is the placeholder
    # key, which holds KEY_VALUE.
    key: bool = False


KEY_VALUE = "v"


# -- random strings, valid and not, near the rules' edges ----------------------------

LOWER = string.ascii_lowercase
ALNUM = LOWER + string.digits
# What users mistype: upper case, spaces, '_', '.', '/', ':', '@', a tab, a YAML block's
# newline, a non-ASCII letter.
STRAY = "AZ _./:@\t\n\u00e9"


def _label(rng: random.Random, length: int, first: str = ALNUM) -> str:
    if length <= 0:
        return ""
    body = [rng.choice(ALNUM + "-") for _ in range(length)]
    body[0] = rng.choice(first)
    body[-1] = rng.choice(ALNUM)
    return "".join(body)


def _mutated(rng: random.Random, value: str) -> str:
    """`value` with one mistake a user makes."""
    at = rng.randint(0, len(value))
    return rng.choice(
        [
            lambda: value[:at] + rng.choice(STRAY) + value[at:],
            lambda: value.upper(),
            lambda: rng.choice(string.digits) + value,
            lambda: value + rng.choice("-_."),
            lambda: rng.choice("-_.") + value,
            lambda: value + "x" * rng.randint(1, 40),
            lambda: "",
            lambda: f" {value}",
        ]
    )()


def _lengths(rng: random.Random) -> int:
    return rng.choice([1, 2, rng.randint(3, 30), 39, 40, 41, 62, 63, 64])


def dns_label(rng: random.Random, first: str = ALNUM) -> str:
    value = _label(rng, _lengths(rng), first)
    return value if rng.random() < 0.5 else _mutated(rng, value)


def service_name(rng: random.Random) -> str:
    return dns_label(rng, first=LOWER if rng.random() < 0.8 else ALNUM)


def subdomain(rng: random.Random) -> str:
    parts = [_label(rng, rng.randint(1, 20)) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.1:
        parts.append(_label(rng, 253))  # past 253 in all
    value = ".".join(parts)
    return value if rng.random() < 0.5 else _mutated(rng, value)


def label_value(rng: random.Random) -> str:
    chars = string.ascii_letters + string.digits + "-_."
    length = _lengths(rng) if rng.random() < 0.9 else 0
    value = "".join(rng.choice(chars) for _ in range(length))
    if value:
        value = rng.choice(string.ascii_letters) + value[1:-1] + rng.choice(string.digits)
        value = value[:length]
    return value if rng.random() < 0.5 else _mutated(rng, value)


def label_key(rng: random.Random) -> str:
    name = label_value(rng) or "k"
    if rng.random() < 0.5:
        return name
    prefix = subdomain(rng) if rng.random() < 0.5 else rng.choice(["example.com", "a.b", "k8s.io"])
    return f"{prefix}/{name}" if rng.random() < 0.9 else f"{prefix}//{name}"


def image(rng: random.Random) -> str:
    registry = rng.choice(
        ["", "", "registry.example.com/", "localhost:5000/", "10.0.0.1:5000/", "[::1]:5000/"]
    )
    path = "/".join(
        rng.choice(["ray", "uerl", "team-a", "a__b", "c.d", "game_1", "x--y"])
        for _ in range(rng.randint(1, 3))
    )
    tag = rng.choice(["", ":2.60.0", ":latest", ":v1_rc.2", ":" + "t" * 128, ":" + "t" * 129])
    digest = rng.choice(["", "", "@sha256:" + "ab" * 32, "@sha512:" + "0f" * 64])
    value = f"{registry}{path}{tag}{digest}"
    if rng.random() < 0.5:
        return value
    return rng.choice(
        [
            lambda: _mutated(rng, value),
            lambda: value.replace("/", "//", 1),
            lambda: f"{registry}{path}:",
            lambda: f"{registry}{path}@sha256:abc",
            lambda: f"{registry}{path}@md5:" + "0" * 32,
            lambda: f"{registry}{path.title()}{tag}",
            lambda: "Registry.Example.com/" + path,
        ]
    )()


# -- random shapes: the valid ones above, with shape mistakes ------------------------


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _nodes(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nodes(item, (*path, index))


def _set(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = root
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return root


# Keys the core API's schema requires where they appear.
REQUIRED_KEYS = frozenset(
    {"nodeSelectorTerms", "key", "operator", "weight", "preference", "podAffinityTerm",
     "topologyKey", "maxSkew", "whenUnsatisfiable"}
)  # fmt: skip


def shape_mutated(rng: random.Random, valid: Any) -> Any:
    """`valid` unchanged, or with up to two shape mistakes: an unknown key, a required key
    left out, a map where a list goes (or the other way round, or a string's place). None
    of them a mistake in values, which only the API server's rules judge."""
    value = copy.deepcopy(valid)
    for _ in range(rng.choice([0, 1, 1, 2])):
        nodes = list(_nodes(value))
        path, node = rng.choice(nodes)
        kind = rng.choice(["unknown", "missing", "type"])
        if kind == "unknown" and isinstance(node, dict):
            node[rng.choice(["unknownField", "value", "Key", "topology_key"])] = "x"
        elif kind == "missing":
            holders = [(p, n) for p, n in nodes if isinstance(n, dict) and REQUIRED_KEYS & set(n)]
            if holders:
                _, holder = rng.choice(holders)
                del holder[rng.choice(sorted(REQUIRED_KEYS & set(holder)))]
        elif kind == "type" and isinstance(node, dict | list | str):
            wrong = ["x"] if isinstance(node, dict | str) else {"x": "y"}
            value = _set(value, path, wrong)
    return value


def affinity(rng: random.Random) -> Any:
    return shape_mutated(rng, AFFINITY)


def spread(rng: random.Random) -> Any:
    return shape_mutated(rng, SPREAD)


# -- the places, and the base topology that uses them all ----------------------------

TOLERATION = {"key": "zqxtk", "operator": "Equal", "value": "zqxtv", "effect": "NoSchedule"}
PLACES = [
    Place("topology name", ("name",), "zqxname", service_name),
    Place("namespace", ("namespace",), "zqxns", dns_label),
    Place("storage class", ("executables", "storage_class"), "zqxsc", subdomain),
    Place("runs storage class", ("runs", "claim", "storage_class"), "zqxrsc", subdomain),
    Place("label value", ("workers", "labels", "team"), "zqxlv", label_value),
    Place("label key", ("workers", "labels", "zqxlk"), "zqxlk", label_key, key=True),
    Place("node selector key", ("learners", "node_selector", "zqxnk"), "zqxnk", label_key, True),
    Place("node selector value", ("learners", "node_selector", "pool"), "zqxnv", label_value),
    Place("toleration key", ("ray", "head", "tolerations", 0, "key"), "zqxtk", label_key),
    Place("toleration value", ("ray", "head", "tolerations", 0, "value"), "zqxtv", label_value),
    Place("ray image", ("ray", "image"), "zqxray", image),
    Place("learner image", ("learners", "image"), "zqxlearner", image),
    Place("game image", ("simulator", "image"), "zqxgame", image),
    Place("forwarder image", ("simulator", "forwarder_image"), "zqxforwarder", image),
    Place("loader image", ("executables", "loader_image"), "zqxloader", image),
    Place("affinity", ("learners", "affinity"), AFFINITY, affinity),
    Place("spread constraints", ("simulator", "topology_spread_constraints"), SPREAD, spread),
]


def base_topology() -> dict[str, Any]:
    """A networked Unreal stack whose every object exists (loader Job, both claims, the
    games' Service and StatefulSet), with each place holding its placeholder (the
    namespace aside: NAMESPACE, which the tier creates)."""
    data: dict[str, Any] = {
        "namespace": NAMESPACE,
        "create_namespace": False,
        "pattern": "networked",
        "simulator": {"kind": "unreal"},
        "executables": {"source_url": "https://example.com/builds/game.tar.gz"},
        "ray": {"head": {"tolerations": [dict(TOLERATION)]}},
        "workers": {"labels": {"team": "rl"}},
        "learners": {"node_selector": {"pool": "gpu"}},
    }
    for place in PLACES:
        if place.kind != "namespace":
            value = KEY_VALUE if place.key else copy.deepcopy(place.placeholder)
            _put(data, place.path, value, key=False)
    return data


def _put(data: dict[str, Any], path: tuple[str | int, ...], value: Any, *, key: bool) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    if key:
        node[value] = node.pop(path[-1])
    else:
        node[path[-1]] = value


@dataclass(frozen=True)
class Case:
    place: Place
    value: Any

    def topology_data(self) -> dict[str, Any]:
        data = base_topology()
        if self.place.kind == "namespace":
            data["create_namespace"] = True  # the Namespace object is the one it names
        _put(data, self.place.path, copy.deepcopy(self.value), key=self.place.key)
        return data

    @property
    def refused_outside_kubernetes(self) -> bool:
        """Whether the API server is not the judge of this value (so a dry run takes it):
        an image only the kubelet parses (the API server refuses only an empty one or
        whitespace at its ends)."""
        value = self.value
        if self.place.kind.endswith("image") and isinstance(value, str):
            return value != "" and value == value.strip()
        return False

    def describe(self) -> str:
        return f"{self.place.kind} {self.value!r}"


def cases(rng: random.Random, count: int) -> list[Case]:
    """`count` cases, every place in turn."""
    return [
        Case(place, place.generate(rng))
        for place in (PLACES[i % len(PLACES)] for i in range(count))
    ]


@dataclass(frozen=True)
class Verdict:
    """What the topology made of a case: its error (None: accepted), and the objects
    rendered (or, refused, those it would have rendered with the raw value)."""

    error: str | None
    objects: list[K8sObject]


def rendered(case: Case) -> Verdict:
    """The one renderer `uerl render` and `pulumi up` use (infra.manifests.build)."""
    try:
        topology = Topology.parse(case.topology_data())
    except TopologyError as exc:
        return Verdict(str(exc), _patched(case))
    return Verdict(None, manifests.build(topology).objects())


def _patched(case: Case) -> list[K8sObject]:
    base = Case(case.place, case.place.placeholder)
    objects = manifests.build(Topology.parse(base.topology_data())).objects()
    placeholder, value = case.place.placeholder, case.value
    if isinstance(placeholder, str):
        # Every string the placeholder went into (derived names too), and map keys.
        text = json.dumps(objects).replace(placeholder, json.dumps(value)[1:-1])
        return json.loads(text)
    if case.place.kind == "spread constraints":
        # A constraint without a labelSelector is given the games' (manifests/simulator.py).
        selector = _game_selector(objects)
        placeholder = [{"labelSelector": selector} | c for c in placeholder]
        if isinstance(value, list):
            value = [{"labelSelector": selector} | c if isinstance(c, dict) else c for c in value]
    return [_replace(obj, placeholder, value) for obj in objects]


def _game_selector(objects: list[K8sObject]) -> dict[str, Any]:
    (games,) = [o for o in objects if o["kind"] == "StatefulSet"]
    return copy.deepcopy(games["spec"]["selector"])


def _replace(node: Any, old: Any, new: Any) -> Any:
    if node == old:
        return copy.deepcopy(new)
    if isinstance(node, dict):
        return {key: _replace(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [_replace(value, old, new) for value in node]
    return node


def ray_pods(objects: list[K8sObject]) -> list[K8sObject]:
    """The pods the controllers would make from the objects' templates: KubeRay's of a
    RayCluster's groups, a Job's, a StatefulSet's. The API server checks some of a pod's
    spec only on a Pod (a RayCluster's templates meet only the CRD's schema; an image
    with whitespace at its ends passes a Job's template), and the controller's pods then
    fail."""
    pods = []
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "RayCluster":
            groups = [("head", spec["headGroupSpec"])]
            groups += [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]
        elif obj["kind"] in ("Job", "StatefulSet"):
            groups = [(f"{obj['kind'].lower()}-{obj['metadata']['name']}", spec)]
        else:
            continue
        for name, group in groups:
            template = copy.deepcopy(group["template"])
            meta = template.get("metadata", {})
            meta["name"] = f"dry-run-{name}"
            meta["namespace"] = obj["metadata"]["namespace"]
            pods.append(
                {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
            )
    return pods


def uerl_stricter(case: Case) -> str | None:
    """Why the topology may refuse a value Kubernetes takes: a rule of uerl's own."""
    value = case.value
    if case.place.kind == "topology name" and isinstance(value, str) and len(value) > 40:
        return "topology.name: at most 40 characters (KubeRay's names derived from it)"
    if case.place.kind == "topology name" and isinstance(value, str) and value[:1].isdigit():
        # Kubernetes 1.36 takes a Service name starting with a digit (RelaxedServiceName-
        # Validation, beta, on by default); 1.34 and 1.35 refuse it: uerl keeps to both.
        return "topology.name: starts with a letter (Service names before Kubernetes 1.36)"
    if case.place.kind.endswith("image") and isinstance(value, str):
        registry = value.partition("/")[0].rpartition("]")[2]
        port = registry.partition(":")[2] if "/" in value else ""
        if port.isdigit() and not 1 <= int(port) <= 65535:
            # The kubelet parses any digits, and its pull fails on each retry.
            return "images: a registry's port is from 1 to 65535"
        first, slash, _ = value.partition("/")
        named_registry = "." in first or ":" in first or first.lower() != first
        if slash and named_registry and not re.fullmatch(REGISTRY, first, re.ASCII):
            # distribution/reference then reads the registry as the repository's first
            # path part (with no registry at all): 'reg_istry.example.com/ray' parses.
            return "images: a registry is a host name (letters, digits and '-') or [IPv6]"
    own = ("ray.io/", "app.kubernetes.io/")
    if case.place.kind == "label key" and isinstance(value, str) and value.startswith(own):
        return "labels: uerl's and KubeRay's own keys"
    return None
