"""Registers a plain Kubernetes object dict (from infra.manifests) as a Pulumi resource.

Typed classes for core kinds (so the provider knows their await and
replacement rules), apiextensions.CustomResource for the rest. Nested keys
are passed through unchanged (camelCase), exactly as rendered.
"""

from __future__ import annotations

from collections.abc import Callable

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
# Stack config of the default Kubernetes provider that an explicit provider
# must be given too (it does not read `kubernetes:*` config itself).
_PROVIDER_CONFIG = ("kubeconfig", "context", "cluster")
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


def stack_provider(
    name: str,
    parent: pulumi.Resource | None,
    aliases: list[pulumi.Alias] | None = None,
    **options: bool,
) -> k8s.Provider:
    """An explicit provider for the stack's cluster (the default provider's config),
    with `options` (k8s.Provider's keyword arguments) on top. Moving a resource from the
    default provider to one of these replaces nothing: the engine asks the new provider's
    DiffConfig, which replaces only for another cluster."""
    config = pulumi.Config("kubernetes")
    settings = {key: config.get(key) for key in _PROVIDER_CONFIG}
    return k8s.Provider(
        name,
        **options,
        **{key: value for key, value in settings.items() if value is not None},
        opts=pulumi.ResourceOptions(parent=parent, aliases=aliases),
    )
