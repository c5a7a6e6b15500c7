"""KubeRayOperator: the kuberay-operator Helm chart, pinned to the configured version."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.manifests.operator import ChartRelease, leftover_crd_message

CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"

# Stack config of the default Kubernetes provider that an explicit provider
# must be given too (it does not read `kubernetes:*` config itself).
_PROVIDER_CONFIG = ("kubeconfig", "context", "cluster")


def adopting_provider(name: str, parent: pulumi.Resource) -> k8s.Provider:
    """A provider that takes over objects that already exist instead of failing
    with AlreadyExists (upsert), forcing field-manager conflicts with whoever
    applied them before (Helm, kubectl)."""
    config = pulumi.Config("kubernetes")
    settings = {key: config.get(key) for key in _PROVIDER_CONFIG}
    return k8s.Provider(
        name,
        upsert_existing_objects=True,
        enable_patch_force=True,
        **{key: value for key, value in settings.items() if value is not None},
        opts=pulumi.ResourceOptions(parent=parent),
    )


def _engine_makes_callbacks() -> bool:
    """Transforms and hooks are calls the engine makes into the program; Pulumi's
    mocks (the unit tests) run the program with no engine to make them."""
    from pulumi.runtime.proto import resource_pb2_grpc
    from pulumi.runtime.settings import SETTINGS

    return isinstance(SETTINGS.monitor, resource_pb2_grpc.ResourceMonitorStub)


def _explain_leftover_crd(args: pulumi.ErrorHookArgs) -> bool:
    """On a CRD whose create failed because it exists: say which setting fixes it."""
    if args.failed_operation == "create" and any("already exists" in e for e in args.errors):
        pulumi.log.error(leftover_crd_message(args.name))
    return False  # no retry: the CRD will still be there


def _hook_leftover_crds(hook: pulumi.ErrorHook) -> pulumi.ResourceTransform:
    """A transform for the chart's children (the provider registers them, so
    options reach them only this way): CRDs get the error hook."""

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        if args.type_ != CRD_TYPE:
            return None
        opts = pulumi.ResourceOptions.merge(
            args.opts, pulumi.ResourceOptions(hooks=pulumi.ResourceHookBinding(on_error=[hook]))
        )
        return pulumi.ResourceTransformResult(args.props, opts)

    return transform


class KubeRayOperator(pulumi.ComponentResource):
    """helm.v4.Chart installs the chart's CRDs and upgrades them with the chart
    (helm itself never upgrades crds/); every RayCluster depends on this.

    CRDs left behind by an earlier KubeRay (Helm never deletes them) make a
    plain install fail with AlreadyExists: `crds: adopt` takes them over (and
    the rest of the chart's objects, should they exist too), `crds: skip`
    leaves them alone (they must then serve KubeRay 1.7's schema)."""

    chart: k8s.helm.v4.Chart

    def __init__(
        self,
        name: str,
        release: ChartRelease,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("uerl:infra:KubeRayOperator", name, None, opts)
        repository_opts = (
            k8s.helm.v4.RepositoryOptsArgs(repo=release.repository) if release.repository else None
        )
        chart_opts = pulumi.ResourceOptions(parent=self, depends_on=list(depends_on))
        if release.crds == "adopt":
            # `providers`: a component (the chart) hands it to the objects it creates.
            chart_opts.providers = [adopting_provider(f"{name}-adopt", self)]
        elif release.crds == "install" and _engine_makes_callbacks():
            # A leftover CRD fails its create with the provider's AlreadyExists;
            # this names the setting that fixes it.
            hook = pulumi.ErrorHook(f"{name}-leftover-crds", _explain_leftover_crd)
            chart_opts.transforms = [_hook_leftover_crds(hook)]
        self.chart = k8s.helm.v4.Chart(
            release.release_name,
            chart=release.chart,
            version=release.version,
            repository_opts=repository_opts,
            namespace=release.namespace,
            name=release.release_name,
            values=release.values or None,
            skip_crds=True if release.crds == "skip" else None,
            opts=chart_opts,
        )
        self.register_outputs({"version": release.version, "namespace": release.namespace})
