"""Where a group's pods run, as whom, and how big their container is: the fields every
pod uerl makes shares (the Ray groups, networked games, the loader Job)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from infra import k8s_rules
from infra.topology.validation_errors import FieldError
from infra.topology.value_types import (
    MAX_CPUS,
    AccountName,
    Affinity,
    Annotations,
    Labels,
    NodeSelector,
    PriorityClassName,
    Quantity,
    SecretName,
    Spec,
    Text,
)


class Toleration(Spec):
    """A Kubernetes toleration of the group's pods (the pod spec's own fields)."""

    key: Text | None = None
    """The taint key tolerated, a label key (none with `Exists`: every taint)."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """`Equal`: the taint's value must be `value`; `Exists`: any value."""
    value: Text | None = None
    """The taint value tolerated with `Equal`, a label value."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect tolerated (none: every effect)."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """With `NoExecute`: how long a pod stays on a node after the taint appears."""

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return value if not value else k8s_rules.label_key(value, "a taint key")

    @field_validator("value")
    @classmethod
    def _value(cls, value: str | None) -> str | None:
        return value if value is None else k8s_rules.label_value(value, "a taint value")

    @model_validator(mode="after")
    def _seconds_need_no_execute(self) -> Toleration:
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise FieldError(
                ("toleration_seconds",),
                "counts only for effect NoExecute (a taint that evicts pods): set effect "
                "NoExecute, or leave toleration_seconds out",
            )
        return self

    @model_validator(mode="after")
    def _operator_fits(self) -> Toleration:
        # The API server refuses these at `pulumi up`, after other objects were created.
        if self.operator == "Exists" and self.value:
            raise FieldError(
                ("value",),
                f"operator Exists tolerates every value of the taint: leave out value "
                f"{self.value!r}, or use operator Equal",
            )
        if self.operator == "Equal" and not self.key:
            raise FieldError(
                ("key",),
                "operator Equal needs the taint's key (operator Exists without a key "
                "tolerates every taint)",
            )
        return self

    def to_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {"operator": self.operator}
        for key, value in (
            ("key", self.key),
            ("value", self.value),
            ("effect", self.effect),
            ("tolerationSeconds", self.toleration_seconds),
        ):
            if value is not None:
                out[key] = value
        return out


class ServiceAccountSpec(Spec):
    """The Kubernetes service account the group's pods run as, e.g. one bound to a cloud
    identity (GKE Workload Identity, EKS IAM roles for service accounts, Azure Workload
    Identity)."""

    name: AccountName
    """The account's name, in the stack's namespace."""
    create: bool = False
    """Create the account with the stack (and delete it with it); false: it must exist."""
    annotations: Annotations = {}
    """Annotations of the account the stack creates, e.g. `{eks.amazonaws.com/role-arn:
    arn:aws:iam::123456789012:role/uerl}`."""
    automount_token: bool = False
    """Mount the account's Kubernetes API token in the pods. Off: nothing uerl runs calls the
    Kubernetes API, and cloud workload identity does without it."""

    @model_validator(mode="after")
    def _annotations_need_create(self) -> ServiceAccountSpec:
        if self.annotations and not self.create:
            raise FieldError(
                ("annotations",),
                f"the stack annotates only an account it creates: set create true, or "
                f"annotate {self.name!r} where it is made",
            )
        return self


class PodSpec(Spec):
    """Where a group's pods run and as whom: every pod uerl makes has these fields."""

    node_selector: NodeSelector = {}
    """Node labels the group's pods must be scheduled on."""
    tolerations: list[Toleration] = []
    """Taints the group's pods tolerate."""
    affinity: Affinity | None = None
    """The pods' Kubernetes affinity (`nodeAffinity`, `podAffinity`, `podAntiAffinity`), in
    Kubernetes' field names, checked as the API server would."""
    priority_class_name: PriorityClassName | None = None
    """The PriorityClass of the group's pods (it must exist). None: the cluster's default."""
    labels: Labels = {}
    """Extra labels of the group's pods (not uerl's `app.kubernetes.io/` ones, nor KubeRay's
    `ray.io/` ones)."""
    annotations: Annotations = {}
    """Extra annotations of the group's pods."""
    image_pull_secrets: list[SecretName] = []
    """Secrets (kubernetes.io/dockerconfigjson, in the stack's namespace) the kubelet pulls every
    image of the group's pods with."""
    service_account: ServiceAccountSpec | None = None
    """The account the group's pods run as. None: the namespace's `default`, its API token mounted
    as the cluster does by default."""

    @classmethod
    def pod_field_names(cls) -> tuple[str, ...]:
        """The fields of the group's pod (not of a container in it)."""
        return tuple(PodSpec.model_fields)

    def pod_fields_set(self) -> list[str]:
        """The pod fields given a value other than their default."""
        fields = type(self).model_fields
        return [n for n in self.pod_field_names() if getattr(self, n) != fields[n].get_default()]


class SizedSpec(Spec):
    """The size of the container a group runs."""

    cpus: float = Field(default=1, gt=0, le=MAX_CPUS)
    """CPUs of the container (fractions become millicores)."""
    memory: Quantity = "2Gi"
    """Memory of the container, a Kubernetes quantity (requests = limits)."""
    cpu_limits: bool = True
    """CPU limits equal to `cpus` (Guaranteed QoS: the container gets what it asked for and no
    more); false: CPU requests only, so it may use idle CPUs of its node."""
    ephemeral_storage: Quantity | None = None
    """Node disk requested for what the container writes (its root filesystem, /tmp), a Kubernetes
    quantity; a request for the scheduler, not a limit. None: no request."""
