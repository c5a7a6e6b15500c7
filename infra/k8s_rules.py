"""What Kubernetes accepts for the values a topology hands it, checked when the topology
is read, so that `uerl render`, `pulumi preview` and the tests refuse alike, before
anything is created.

- Names and labels: the rules of k8s.io/apimachinery's validation (IsDNS1123Label,
  IsDNS1035Label, IsDNS1123Subdomain, IsQualifiedName, IsValidLabelValue).
- Image references: the grammar of github.com/distribution/reference, which the kubelet
  parses every image with (ParseNormalizedNamed): an image it refuses never starts, and
  the API server does not look (it refuses only leading or trailing whitespace).
- A pod's affinity and topology spread constraints: their shape from the Kubernetes
  types' OpenAPI schema (the RayCluster CRD's pod template, which is the core API's
  PodSpec: `k8s_pod_schema.json`, kept equal to third_party's CRD by a test), then the
  rules the API server adds to the shape (k8s.io/kubernetes pkg/apis/core/validation:
  operators and their values, weights, keys). A RayCluster's pod template reaches that
  validation only when KubeRay creates the pods, after `pulumi up` has waited for them.

Each check raises `Invalid` with the path below the value it was given and a message that
names what was typed. Imports nothing of uerl.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

Where = tuple[str | int, ...]

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A label value, and the name in a label or annotation key (after an optional DNS
# subdomain and `/`).
QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

_LOWER_DIGITS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_LETTERS_DIGITS = _LOWER_DIGITS | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")

LABEL_RULE = "lower-case letters, digits and '-', starting and ending with a letter or digit"
SUBDOMAIN_RULE = "lower-case letters, digits, '-' and '.', each '.'-separated part " + (
    "starting and ending with a letter or digit"
)
QUALIFIED_RULE = "letters, digits, '-', '_' and '.', starting and ending with a letter or digit"


class Invalid(ValueError):
    """A value Kubernetes would refuse; `path` is where, below the value checked."""

    def __init__(self, path: Sequence[str | int], message: str) -> None:
        super().__init__(message)
        self.path: Where = tuple(path)


def did_you_mean(typed: str, known: Iterable[str]) -> str:
    """` (did you mean X?)` for the nearest of `known`, or ''."""
    by_case = {name.lower(): name for name in known}
    close = difflib.get_close_matches(typed.lower(), list(by_case), n=1, cutoff=0.6)
    return f" (did you mean {by_case[close[0]]}?)" if close else ""


def described(value: Any) -> str:
    """What a value is, for a message: `the string 'x'`, `a list`, `the number 3`."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return type(value).__name__


# -- names --------------------------------------------------------------------------


def _why_not(
    value: str, *, max_len: int, chars: frozenset[str], first: frozenset[str], last: frozenset[str]
) -> str | None:
    """The first reason `value` breaks a name rule, in words (None: it keeps it)."""
    if not value:
        return "it is empty"
    if len(value) > max_len:
        return f"it is {len(value)} characters long, more than {max_len}"
    if "A" not in chars and any("A" <= c <= "Z" for c in value):
        return "it has upper-case letters"
    bad = sorted({c for c in value if c not in chars})
    if bad:
        return "it contains " + ", ".join(repr(c) for c in bad)
    if value[0] not in first:
        kind = "a digit" if value[0].isdigit() else repr(value[0])
        return f"it starts with {kind}"
    if value[-1] not in last:
        return f"it ends with {value[-1]!r}"
    return None


def _label_reason(
    value: str, *, max_len: int = LABEL_MAX, letter_first: bool = False
) -> str | None:
    chars = _LOWER_DIGITS | {"-"}
    first = _LOWER_DIGITS - set("0123456789") if letter_first else _LOWER_DIGITS
    return _why_not(value, max_len=max_len, chars=chars, first=first, last=_LOWER_DIGITS)


def why_not_host_label(value: str) -> str:
    """Why `value` is not one part of a host name (letters, digits, '-'), in words."""
    return _why_not(
        value, max_len=LABEL_MAX, chars=_LETTERS_DIGITS | {"-"}, first=_LETTERS_DIGITS,
        last=_LETTERS_DIGITS,
    ) or "it is not a host name label"  # fmt: skip


def dns1123_label(value: str, kind: str, *, max_len: int = LABEL_MAX) -> str:
    """An object name that must be a DNS-1123 label (a namespace's)."""
    reason = _label_reason(value, max_len=max_len) or _unless(DNS1123_LABEL, value)
    if reason is not None:
        raise Invalid(
            (),
            f"{value!r} is not a {kind} name: {reason} ({LABEL_RULE}, at most {max_len} "
            "characters)",
        )
    return value


def dns1035_label(value: str, kind: str, *, max_len: int = LABEL_MAX) -> str:
    """A name that must be a DNS-1035 label: a Service's, which also starts with a letter."""
    reason = _label_reason(value, max_len=max_len, letter_first=True)
    reason = reason or _unless(DNS1035_LABEL, value)
    if reason is not None:
        raise Invalid(
            (),
            f"{value!r} is not a {kind} name: {reason} (lower-case letters, digits and '-', "
            f"starting with a letter and ending with a letter or digit, at most {max_len} "
            "characters)",
        )
    return value


def _subdomain_reason(value: str) -> str | None:
    if not value:
        return "it is empty"
    if len(value) > SUBDOMAIN_MAX:
        return f"it is {len(value)} characters long, more than {SUBDOMAIN_MAX}"
    for part in value.split("."):
        if not part:
            return "it has an empty part between dots"
        # Kubernetes bounds the whole name, not each part (IsDNS1123Subdomain).
        reason = _label_reason(part, max_len=SUBDOMAIN_MAX)
        if reason is not None:
            return reason if part == value else f"its part {part!r}: {reason}"
    return None


def dns1123_subdomain(value: str, kind: str) -> str:
    """An object name that must be a DNS-1123 subdomain (most kinds' names)."""
    reason = _subdomain_reason(value) or _unless(DNS1123_SUBDOMAIN, value)
    if reason is not None:
        raise Invalid(
            (),
            f"{value!r} is not a {kind} name: {reason} (a DNS-1123 subdomain: "
            f"{SUBDOMAIN_RULE}, at most {SUBDOMAIN_MAX} characters)",
        )
    return value


def _qualified_reason(name: str) -> str | None:
    return _why_not(
        name, max_len=LABEL_MAX, chars=_LETTERS_DIGITS | set("-_."), first=_LETTERS_DIGITS,
        last=_LETTERS_DIGITS,
    ) or _unless(QUALIFIED_NAME, name)  # fmt: skip


def _unless(rule: re.Pattern[str], value: str) -> str | None:
    """The rule itself, behind the reasons in words: should they miss a case, the value is
    still refused."""
    return None if rule.fullmatch(value) else "it breaks Kubernetes' rule for it"


def label_key(key: str, what: str = "a label key") -> str:
    """A label or annotation key: an optional DNS subdomain and '/', then a qualified name
    (IsQualifiedName)."""
    prefix, slash, name = key.rpartition("/")
    reason = "it has more than one '/'" if prefix.count("/") else None
    if slash and reason is None:
        prefix_reason = _subdomain_reason(prefix)
        if prefix_reason is not None:
            reason = f"its prefix {prefix!r}: {prefix_reason}"
    if reason is None:
        name_reason = _qualified_reason(name)
        if name_reason is not None:
            reason = f"its name {name!r}: {name_reason}" if slash else name_reason
    if reason is not None:
        raise Invalid(
            (),
            f"{key!r} is not {what}: {reason} (an optional DNS subdomain and '/', then at "
            f"most {LABEL_MAX} {QUALIFIED_RULE})",
        )
    return key


def label_value(value: str, what: str = "a label value") -> str:
    """A label value (IsValidLabelValue): empty, or a qualified name."""
    reason = None if value == "" else _qualified_reason(value)
    if reason is not None:
        raise Invalid(
            (),
            f"{value!r} is not {what}: {reason} (empty, or at most {LABEL_MAX} {QUALIFIED_RULE})",
        )
    return value


def located(path: Where, check: Any, *args: Any, **kwargs: Any) -> Any:
    """`check(*args)`, its Invalid placed at `path`."""
    try:
        return check(*args, **kwargs)
    except Invalid as exc:
        raise Invalid((*path, *exc.path), str(exc)) from None


def labels(pairs: Mapping[str, str], path: Where = ()) -> None:
    """A map of labels (a node selector, a selector's matchLabels)."""
    for key, value in pairs.items():
        located((*path, key), label_key, key)
        located((*path, key), label_value, value)


# -- image references ---------------------------------------------------------------

_ALNUM = "[a-z0-9]+"
_SEPARATOR = "(?:[._]|__|[-]+)"
_PATH_COMPONENT = re.compile(rf"^{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*$")
_DOMAIN_PART = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# The digests the kubelet's parser takes (go-digest's registered algorithms), by hex length.
DIGESTS = {"sha256": 64, "sha384": 96, "sha512": 128}
_IDENTIFIER = re.compile(r"^[a-f0-9]{64}$")
REPOSITORY_MAX = 255
IMAGE_EXAMPLE = (
    "e.g. ubuntu:22.04, registry.example.com:5000/team/ray:2.60.0, image@sha256:<64 hex>"
)


def image_reference(value: str) -> str:
    """An image reference the kubelet pulls: `[registry[:port]/]path[:tag][@digest]`."""

    def refuse(reason: str) -> Invalid:
        return Invalid((), f"{value!r} is not an image reference: {reason} ({IMAGE_EXAMPLE})")

    if not value:
        raise refuse("it is empty")
    if any(c.isspace() for c in value):
        raise refuse("it contains whitespace")
    if _IDENTIFIER.fullmatch(value):
        raise refuse("a bare 64-hex-digit id names no repository")
    rest, at, digest = value.partition("@")
    if at:
        algorithm, colon, encoded = digest.partition(":")
        length = DIGESTS.get(algorithm)
        if not colon or length is None:
            raise refuse(f"digest {digest!r} is not sha256:, sha384: or sha512: and its hex")
        if not re.fullmatch(f"[a-f0-9]{{{length}}}", encoded):
            raise refuse(f"a {algorithm} digest is {length} lower-case hex digits")
    name, tag = rest, None
    if rest.rfind(":") > rest.rfind("/"):
        name, _, tag = rest.rpartition(":")
    if tag is not None and not _TAG.fullmatch(tag):
        raise refuse(
            f"tag {tag!r}: at most 128 letters, digits, '_', '.' and '-', not starting with "
            "'.' or '-'"
        )
    first, slash, remainder = name.partition("/")
    # Docker's rule: the first part names a registry if it has '.' or ':', is localhost, or
    # has upper-case letters (no repository has).
    if slash and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        if not _DOMAIN.fullmatch(first):
            raise refuse(f"registry {first!r} is not a host name or [IPv6] with an optional port")
        # The kubelet's parser takes any digits; the pull then fails on each retry.
        port = first.rpartition("]")[2].partition(":")[2]
        if port and not 1 <= int(port) <= 65535:
            raise refuse(f"registry {first!r}: port {port} is not a port number (1 to 65535)")
        path = remainder
    else:
        path = name
    if not path:
        raise refuse("it names no repository")
    if path.lower() != path:
        raise refuse(f"the repository name {path!r} must be lower case")
    if len(path) > REPOSITORY_MAX:
        raise refuse(f"the repository name is {len(path)} characters long, more than 255")
    for component in path.split("/"):
        if not _PATH_COMPONENT.fullmatch(component):
            raise refuse(
                f"{component!r} is not a repository path component (lower-case letters and "
                "digits, separated by one '.', one or two '_', or '-'s)"
            )
    return value


# -- the shape of pod fields: the OpenAPI schema of the Kubernetes types ---------------

SCHEMA_FILE = Path(__file__).with_name("k8s_pod_schema.json")
# The pod spec fields a topology passes through, whose schema the file holds.
POD_FIELDS = ("affinity", "topologySpreadConstraints")
SCHEMA_SOURCE = (
    "KubeRay 1.7.0's RayCluster CRD (third_party/kuberay-operator-1.7.0/crds/"
    "ray.io_rayclusters.yaml), v1 spec.headGroupSpec.template.spec: the core API's PodSpec"
)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def extract_pod_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    """The schema of POD_FIELDS in the RayCluster CRD: what `k8s_pod_schema.json` holds.
    Regenerate it after a KubeRay update:
    `python -c 'import json, yaml; from infra.k8s_rules import *; print(json.dumps(
    extract_pod_schema(yaml.safe_load(open(CRD))), indent=1, sort_keys=True))'`."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    pod = spec["headGroupSpec"]["properties"]["template"]["properties"]["spec"]["properties"]
    return {"$comment": SCHEMA_SOURCE, **{name: pod[name] for name in POD_FIELDS}}


@cache
def pod_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


def conform(value: Any, schema: Mapping[str, Any], path: Where = ()) -> Any:
    """`value` as the API server reads it against `schema`: unknown keys refused (as
    kubectl's and the API server's strict field validation do), required keys present,
    types kept, a null field unset; `pulumi config set --path`'s numbers and booleans in
    a string field read as the text typed. Returns the value so read."""
    kind = schema.get("type")
    if kind == "object":
        return _conform_object(value, schema, path)
    if kind == "array":
        if not isinstance(value, list):
            raise Invalid(path, f"expected a list, got {described(value)}")
        items = []
        for index, item in enumerate(value):
            if item is None:
                raise Invalid((*path, index), "a list item has no value (null)")
            items.append(conform(item, schema.get("items", {}), (*path, index)))
        _unique(items, schema, path)
        return items
    if kind == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if not isinstance(value, str):
            raise Invalid(path, f"expected a string, got {described(value)}")
        return value
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(path, f"expected an integer, got {described(value)}")
        low, high = INT32 if schema.get("format") == "int32" else INT64
        if not low <= value <= high:
            raise Invalid(path, f"{value} is out of range ({low} to {high})")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise Invalid(path, f"expected true or false, got {described(value)}")
        return value
    return value  # a schema that says nothing of the type keeps anything


def _conform_object(value: Any, schema: Mapping[str, Any], path: Where) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(path, f"expected a map, got {described(value)}")
    properties: Mapping[str, Any] | None = schema.get("properties")
    extra = schema.get("additionalProperties")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise Invalid(path, f"key {key!r} is not a string")
        if item is None:  # null is unset, as the API server reads it
            continue
        if properties is not None and key in properties:
            out[key] = conform(item, properties[key], (*path, key))
        elif isinstance(extra, dict):
            out[key] = conform(item, extra, (*path, key))
        elif properties is not None:
            raise Invalid((*path, key), f"unknown key{did_you_mean(key, properties)}")
        else:
            out[key] = item
    missing = [key for key in schema.get("required", ()) if key not in out]
    if missing:
        raise Invalid(path, f"missing {', '.join(missing)} (required by Kubernetes)")
    return out


def _unique(items: list[Any], schema: Mapping[str, Any], path: Where) -> None:
    """x-kubernetes-list-type: a `set` holds each value once, a `map` each key once."""
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        keys: list[Any] = [json.dumps(item, sort_keys=True) for item in items]
        names = "value"
    elif list_type == "map":
        fields = schema.get("x-kubernetes-list-map-keys", ())
        keys = [tuple(item.get(field) for field in fields) for item in items]
        names = " and ".join(fields)
    else:
        return
    for index, key in enumerate(keys):
        if key in keys[:index]:
            raise Invalid((*path, index), f"repeats the {names} of item {keys.index(key)}")


# -- what the API server adds to the shape (pkg/apis/core/validation) -----------------

NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
WHEN_UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
INCLUSION_POLICIES = ("Honor", "Ignore")
# The only field a node field selector may name.
NODE_FIELD = "metadata.name"
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def affinity(value: Any) -> dict[str, Any]:
    """A pod's `affinity`, as the API server validates it; returns it as read."""
    read = conform(value, pod_schema()["affinity"])
    node = read.get("nodeAffinity", {})
    if REQUIRED in node:
        terms = node[REQUIRED]["nodeSelectorTerms"]
        where: Where = ("nodeAffinity", REQUIRED, "nodeSelectorTerms")
        if not terms:
            raise Invalid(where, "needs at least one node selector term")
        for index, term in enumerate(terms):
            _node_selector_term(term, (*where, index))
    for index, preferred in enumerate(node.get(PREFERRED, [])):
        where = ("nodeAffinity", PREFERRED, index)
        _weight(preferred["weight"], (*where, "weight"))
        _node_selector_term(preferred["preference"], (*where, "preference"))
    for kind in ("podAffinity", "podAntiAffinity"):
        pods = read.get(kind, {})
        for index, term in enumerate(pods.get(REQUIRED, [])):
            _pod_affinity_term(term, (kind, REQUIRED, index))
        for index, preferred in enumerate(pods.get(PREFERRED, [])):
            where = (kind, PREFERRED, index)
            _weight(preferred["weight"], (*where, "weight"))
            _pod_affinity_term(preferred["podAffinityTerm"], (*where, "podAffinityTerm"))
    return read


def _weight(weight: int, where: Where) -> None:
    if not 1 <= weight <= 100:
        raise Invalid(where, f"{weight} is not a weight from 1 to 100")


def _operator(operator: str, allowed: Sequence[str], where: Where, what: str) -> None:
    if operator not in allowed:
        raise Invalid(
            (*where, "operator"),
            f"{operator!r} is not {what} operator ({', '.join(allowed)})"
            f"{did_you_mean(operator, allowed)}",
        )


def _node_selector_term(term: Mapping[str, Any], where: Where) -> None:
    for index, requirement in enumerate(term.get("matchExpressions", [])):
        at = (*where, "matchExpressions", index)
        operator, values = requirement["operator"], requirement.get("values", [])
        _operator(operator, NODE_OPERATORS, at, "a node selector")
        _values_fit(operator, values, at)
        located((*at, "key"), label_key, requirement["key"])
        # Node label values: a recent API server checks them (and nothing else matches).
        for number, value in enumerate(values):
            located((*at, "values", number), label_value, value)
        # The scheduler reads a Gt/Lt value as an integer; a pod with another never runs.
        if operator in ("Gt", "Lt") and not _INTEGER.fullmatch(values[0]):
            raise Invalid((*at, "values", 0), f"{values[0]!r}: {operator} compares integers")
    for index, requirement in enumerate(term.get("matchFields", [])):
        at = (*where, "matchFields", index)
        operator, values = requirement["operator"], requirement.get("values", [])
        _operator(operator, ("In", "NotIn"), at, "a node field selector")
        if len(values) != 1:
            raise Invalid((*at, "values"), f"{operator} on a node field takes exactly one value")
        if requirement["key"] != NODE_FIELD:
            raise Invalid(
                (*at, "key"), f"{requirement['key']!r}: a node field selector names {NODE_FIELD}"
            )
        located((*at, "values", 0), dns1123_subdomain, values[0], "node")


def _values_fit(operator: str, values: list[str], at: Where) -> None:
    if operator in ("In", "NotIn") and not values:
        raise Invalid((*at, "values"), f"operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise Invalid((*at, "values"), f"operator {operator} takes no values, got {values}")
    if operator in ("Gt", "Lt") and len(values) != 1:
        raise Invalid((*at, "values"), f"operator {operator} takes exactly one value")


def label_selector(selector: Mapping[str, Any], where: Where) -> None:
    """A LabelSelector (matchLabels, matchExpressions), values as label values."""
    labels(selector.get("matchLabels", {}), (*where, "matchLabels"))
    for index, requirement in enumerate(selector.get("matchExpressions", [])):
        at = (*where, "matchExpressions", index)
        operator, values = requirement["operator"], requirement.get("values", [])
        _operator(operator, SELECTOR_OPERATORS, at, "a label selector")
        _values_fit(operator, values, at)
        located((*at, "key"), label_key, requirement["key"])
        for number, value in enumerate(values):
            located((*at, "values", number), label_value, value)


def _selector_keys(selector: Mapping[str, Any] | None) -> set[str]:
    if selector is None:
        return set()
    return set(selector.get("matchLabels", {})) | {
        requirement["key"] for requirement in selector.get("matchExpressions", [])
    }


def _label_keys(
    term: Mapping[str, Any], field: str, selector_keys: set[str] | None, where: Where
) -> None:
    """matchLabelKeys / mismatchLabelKeys: label keys, only beside a labelSelector, none
    of them a key the selector has."""
    keys = term.get(field, [])
    if not keys:
        return
    if selector_keys is None:
        raise Invalid((*where, field), "needs a labelSelector beside it")
    for index, key in enumerate(keys):
        located((*where, field, index), label_key, key)
        if key in selector_keys:
            raise Invalid((*where, field, index), f"{key!r} is also in the labelSelector")


def _pod_affinity_term(term: Mapping[str, Any], where: Where) -> None:
    for selector in ("labelSelector", "namespaceSelector"):
        if selector in term:
            label_selector(term[selector], (*where, selector))
    for index, namespace in enumerate(term.get("namespaces", [])):
        located((*where, "namespaces", index), dns1123_label, namespace, "namespace")
    if not term["topologyKey"]:
        raise Invalid((*where, "topologyKey"), "is empty: give a node label key")
    located((*where, "topologyKey"), label_key, term["topologyKey"])
    keys = _selector_keys(term["labelSelector"]) if "labelSelector" in term else None
    _label_keys(term, "matchLabelKeys", keys, where)
    _label_keys(term, "mismatchLabelKeys", keys, where)
    both = set(term.get("matchLabelKeys", [])) & set(term.get("mismatchLabelKeys", []))
    if both:
        raise Invalid((*where, "mismatchLabelKeys"), f"{sorted(both)} also in matchLabelKeys")


def spread_constraints(value: Any, default_selector_keys: set[str]) -> list[dict[str, Any]]:
    """A pod's topologySpreadConstraints, as the API server validates them, given the keys
    of the labelSelector a constraint without one is given; returns them as read."""
    read: list[dict[str, Any]] = conform(value, pod_schema()["topologySpreadConstraints"])
    for index, constraint in enumerate(read):
        _spread_constraint(constraint, default_selector_keys, (index,))
    return read


def _spread_constraint(
    constraint: Mapping[str, Any], default_selector_keys: set[str], where: Where
) -> None:
    if constraint["maxSkew"] < 1:
        raise Invalid((*where, "maxSkew"), f"{constraint['maxSkew']} is not above 0")
    if not constraint["topologyKey"]:
        raise Invalid((*where, "topologyKey"), "is empty: give a node label key")
    located((*where, "topologyKey"), label_key, constraint["topologyKey"])
    when = constraint["whenUnsatisfiable"]
    if when not in WHEN_UNSATISFIABLE:
        raise Invalid(
            (*where, "whenUnsatisfiable"),
            f"{when!r} is not one of {', '.join(WHEN_UNSATISFIABLE)}"
            f"{did_you_mean(when, WHEN_UNSATISFIABLE)}",
        )
    if "minDomains" in constraint:
        if constraint["minDomains"] < 1:
            raise Invalid((*where, "minDomains"), f"{constraint['minDomains']} is not above 0")
        if when != "DoNotSchedule":
            raise Invalid(
                (*where, "minDomains"), "counts only with whenUnsatisfiable DoNotSchedule"
            )
    for policy in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
        if policy in constraint and constraint[policy] not in INCLUSION_POLICIES:
            raise Invalid(
                (*where, policy),
                f"{constraint[policy]!r} is not one of {', '.join(INCLUSION_POLICIES)}",
            )
    if "labelSelector" in constraint:
        label_selector(constraint["labelSelector"], (*where, "labelSelector"))
        keys = _selector_keys(constraint["labelSelector"])
    else:
        keys = default_selector_keys
    _label_keys(constraint, "matchLabelKeys", keys, where)
