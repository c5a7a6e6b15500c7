"""The value types the topology's models share, and the models' base.

Each is a string, number or map checked as Kubernetes (infra/k8s_rules.py) or Ray would
check it, so a bad value is refused when the topology is read, naming its path. Every
string type takes what `pulumi config set --path` typed (`Text`).
"""

from __future__ import annotations

import re
import typing
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationInfo,
    field_validator,
)

from infra import k8s_rules
from infra.k8s_rules import DNS1123_SUBDOMAIN, QUALIFIED_NAME
from infra.topology.validation_errors import FieldError

# Kubernetes resource.Quantity, e.g. 500m, 2, 1.5, 4Gi, 1e3.
QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# CPUs of one container, at most: no node offers more (the largest cloud machines have
# 448 to 896 vCPUs), so a larger figure is a typo (`1e9`) that would leave every pod
# pending for ever rather than a real request.
MAX_CPUS = 1024
# What a container's GPUs are called unless the topology says otherwise (NVIDIA's device plugin).
GPU_RESOURCE = "nvidia.com/gpu"
# The labels uerl puts on every object and pod (infra/manifests/common.py): the games'
# Service and the NetworkPolicies select pods by them, so no group's `labels` may set one.
OWN_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)
# KubeRay labels the Ray pods `ray.io/...` and finds them by those labels; a pod
# template's own value replaces some of KubeRay's (and is ignored for others).
KUBERAY_LABEL_PREFIX = "ray.io/"
# Binary and decimal suffixes of a Kubernetes quantity, as multipliers.
QUANTITY_SUFFIXES = {
    **{s: 1024 ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: 1000.0 ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{s: 1000.0 ** -(i + 1) for i, s in enumerate("mun")},
    "": 1,
}

ImagePullPolicy = Literal["IfNotPresent", "Always", "Never"]


def _config_text(value: Any) -> Any:
    """`pulumi config set --path` stores `true`/`false` as booleans and digits as
    integers; in a string field they are the text the user typed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return value


# Every string field of the spec: accepts what `pulumi config set --path` typed.
Text = Annotated[str, BeforeValidator(_config_text)]


class Spec(BaseModel):
    """The base of every topology model: unknown keys refused, values frozen; each field's
    docstring (the string under it) is its description, the one text the reference, the
    component's schema and its SDKs show."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 in a number field; `--set workers.replicas=true` (or
        # `replicas: yes` in YAML) is a mistake, not one replica.
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if annotation in (int, float) or set(typing.get_args(annotation)) & {int, float}:
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


def checked_text(check: Any) -> Any:
    """A string field that `check` (value -> value, or ValueError) accepts."""
    return Annotated[str, BeforeValidator(_config_text), AfterValidator(check)]


def _quantity(value: str) -> str:
    match = QUANTITY.fullmatch(value)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 512Mi, 4Gi, 500m, 2)")
    if float(match.group(1)) == 0:  # every quantity here is a size a container needs
        raise ValueError(f"{value!r} is zero: give a size (e.g. 512Mi, 4Gi)")
    return value


Quantity = checked_text(_quantity)


def _resource_name(value: str) -> str:
    if not RESOURCE_NAME.fullmatch(value) or value in ("CPU", "GPU", "memory"):
        raise ValueError(
            f"{value!r} is not a usable Ray custom resource name "
            "(letters, digits and '_', not starting with a digit, not CPU/GPU/memory)"
        )
    return value


ResourceName = checked_text(_resource_name)


def quantity_value(value: str) -> float:
    """A valid quantity's amount in its unit: "4Gi" -> 4294967296.0, "1e3" -> 1000.0."""
    match = QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix = float(match.group(1)), match.group(3) or ""
    if suffix[:1] in ("e", "E") and suffix[1:2] not in ("", "i"):  # an exponent, not exa
        return number * 10.0 ** int(suffix[1:])
    return number * QUANTITY_SUFFIXES[suffix]


def _object_name(kind: str) -> Any:
    return checked_text(partial(k8s_rules.dns1123_subdomain, kind=kind))


SecretName = _object_name("Secret")
AccountName = _object_name("ServiceAccount")
PriorityClassName = _object_name("PriorityClass")
ClaimName = _object_name("PersistentVolumeClaim")
# A namespace's name is a DNS-1123 label (the stack's, the operator's, a scraper's).
NamespaceName = checked_text(partial(k8s_rules.dns1123_label, kind="namespace"))


def _storage_class(value: str) -> str:
    # "" is Kubernetes' "no class" (a claim bound to a volume made by hand).
    return value if value == "" else k8s_rules.dns1123_subdomain(value, "StorageClass")


StorageClassName = checked_text(_storage_class)
# An image reference the kubelet can pull.
Image = checked_text(k8s_rules.image_reference)


def _extended_resource(value: str) -> str:
    domain, _, name = value.partition("/")
    if (
        not name
        or len(domain) > 253
        or not DNS1123_SUBDOMAIN.fullmatch(domain)
        or domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or len(name) > 63
        or not QUALIFIED_NAME.fullmatch(name)
    ):
        raise ValueError(
            f"{value!r} is not an extended resource name (a domain outside kubernetes.io, "
            "'/' and a name, e.g. nvidia.com/gpu or amd.com/gpu)"
        )
    return value


GpuResource = checked_text(_extended_resource)


def _metadata_keys(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        k8s_rules.located((key,), k8s_rules.label_key, key, "a label or annotation key")
    return value


def _labels(value: dict[str, str]) -> dict[str, str]:
    _metadata_keys(value)
    for key in value:
        if key in OWN_LABELS:
            raise FieldError(
                (key,),
                f"{key!r} is one of uerl's own labels (the games' Service and the "
                "NetworkPolicies find the pods by them): choose another key",
            )
        if key.startswith(KUBERAY_LABEL_PREFIX):
            raise FieldError(
                (key,),
                f"{key!r}: labels starting {KUBERAY_LABEL_PREFIX!r} are KubeRay's (it finds "
                "the Ray pods by them): choose another key",
            )
    k8s_rules.labels(value)
    return value


def _label_map(value: dict[str, str]) -> dict[str, str]:
    k8s_rules.labels(value)  # label keys and values, nothing reserved
    return value


# Labels a topology adds to what uerl makes (pods, a PodMonitor): not uerl's own, nor KubeRay's.
Labels = Annotated[dict[Text, Text], AfterValidator(_labels)]
Annotations = Annotated[dict[Text, Text], AfterValidator(_metadata_keys)]
# Labels uerl selects by, which others set: a node's, a scraper's pods'.
NodeSelector = Annotated[dict[Text, Text], AfterValidator(_label_map)]
SelectorLabels = NodeSelector
# A Kubernetes affinity, checked against the core API's schema and the API server's rules.
Affinity = Annotated[dict[str, Any], AfterValidator(k8s_rules.affinity)]
# A Kubernetes topology spread constraint (the list is checked as a whole: SimulatorSpec).
SpreadConstraint = dict[str, Any]
