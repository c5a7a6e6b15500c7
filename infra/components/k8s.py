"""Registers a plain Kubernetes object dict (from infra.manifests) as a Pulumi resource.

Typed classes for core kinds (so the provider knows their await and
replacement rules), apiextensions.CustomResource for the rest. Nested keys
are passed through unchanged (camelCase), exactly as rendered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.manifests.common import K8sObject

_TYPED: dict[tuple[str, str], Callable[..., pulumi.CustomResource]] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("batch/v1", "Job"): k8s.batch.v1.Job,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
}
# Top-level fields besides apiVersion/kind/metadata that the builders emit;
# their names are also the typed classes' keyword arguments.
_BODY_FIELDS = ("spec", "data")


def resource_name(obj: K8sObject) -> str:
    """The Pulumi name: the object's own name (unique per type), so URNs never change."""
    return str(obj["metadata"]["name"])


def register(obj: K8sObject, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    api_version, kind = obj["apiVersion"], obj["kind"]
    unknown = set(obj) - {"apiVersion", "kind", "metadata", *_BODY_FIELDS}
    if unknown:
        raise ValueError(f"{kind} {resource_name(obj)}: unsupported top-level fields {unknown}")
    body = {key: obj[key] for key in _BODY_FIELDS if key in obj}
    typed = _TYPED.get((api_version, kind))
    if typed is not None:
        return typed(resource_name(obj), metadata=obj["metadata"], **body, opts=opts)
    return k8s.apiextensions.CustomResource(
        resource_name(obj),
        api_version=api_version,
        kind=kind,
        metadata=obj["metadata"],
        spec=obj.get("spec"),
        opts=opts,
    )


def kubeconfig_is_text(value: str) -> bool:
    """A kubeconfig value is the file's text (YAML over lines, or the one-line JSON a
    cluster resource outputs, e.g. EKS's) rather than the file's path."""
    return "\n" in value or value.lstrip().startswith("{")


@dataclass(frozen=True)
class ClusterAccess:
    """How uerl reaches the stack's cluster itself, beside the Kubernetes provider that
    creates the objects: for the CRDs (a dynamic resource), the providers that take back
    kept objects, and preview's check that a PodMonitor can be made. A kubeconfig is a
    path or the file's text, and may be another resource's (secret) output."""

    kubeconfig: pulumi.Input[str] | None = None
    context: pulumi.Input[str] | None = None
    cluster: pulumi.Input[str] | None = None

    @classmethod
    def from_config(cls) -> ClusterAccess:
        """The default provider's: `kubernetes:` config (else, where that is empty, the
        provider's own fallback, $KUBECONFIG or ~/.kube/config)."""
        config = pulumi.Config("kubernetes")
        # Plain, as the providers made from it always had it: a secret now would be a
        # change to every one of them in the stacks made before.
        return cls(config.get("kubeconfig"), config.get("context"), config.get("cluster"))

    def settings(self) -> dict[str, pulumi.Input[str]]:
        """k8s.Provider's keyword arguments for this cluster."""
        given = {"kubeconfig": self.kubeconfig, "context": self.context, "cluster": self.cluster}
        return {key: value for key, value in given.items() if value is not None}


def stack_provider(
    name: str,
    parent: pulumi.Resource | None,
    access: ClusterAccess,
    aliases: list[pulumi.Alias] | None = None,
    **options: bool,
) -> k8s.Provider:
    """An explicit provider for the stack's cluster (`access`), with `options`
    (k8s.Provider's keyword arguments) on top. Moving a resource from the default
    provider to one of these replaces nothing: the engine asks the new provider's
    DiffConfig, which replaces only for another cluster."""
    return k8s.Provider(
        name,
        **options,
        **access.settings(),
        opts=pulumi.ResourceOptions(parent=parent, aliases=aliases),
    )
