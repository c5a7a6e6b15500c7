"""KubeRayCRDs: the operator chart's CRDs as one resource that diffs a digest.

A Pulumi dynamic resource (its provider runs in the venv's Python, beside the
program) whose inputs are the CRD bundle's digest and path (infra.manifests.
operator_crds): a no-change `pulumi preview` no longer sends 4.1 MB of CRDs through
the engine and the Kubernetes provider, and a chart upgrade (a new digest) applies
the new CRDs, which `helm` itself never does. Applied server-side with the field
manager `uerl`, forcing only when `adopt` takes over CRDs that were there before the
stack. `pulumi destroy` deletes the CRDs the stack installed (once its RayClusters are
gone, and refusing while another stack's custom resources use them); adopted ones stay.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic
import yaml

from infra.components.k8s import ClusterAccess, kubeconfig_is_text
from infra.manifests.operator import leftover_crd_message
from infra.manifests.operator_crds import CrdBundle

FIELD_MANAGER = "uerl"
ESTABLISH_TIMEOUT_S = 120.0
DELETE_TIMEOUT_S = 180.0
# Inputs an update acts on; the rest (where the bundle sits, the cluster's address)
# may differ between the machines that run `pulumi up`. The stack's namespace and name
# are diffed so that a stack made before they were inputs gets them into its state,
# which is what `delete` reads.
_DIFFED = ("version", "digest", "mode", "stack_namespace", "stack_name")
# The label saying which stack an object is of (infra.manifests.common.labels).
INSTANCE_LABEL = "app.kubernetes.io/instance"
# How many of another stack's custom resources a refused destroy names.
_NAMED = 3


class CrdError(Exception):
    """A CRD could not be applied or deleted; the message says which and why."""


class CrdConflict(CrdError):
    """A server-side apply would change fields another field manager owns."""

    def __init__(self, message: str, managers: list[str]) -> None:
        super().__init__(message)
        self.managers = managers


def _api(props: dict[str, Any]) -> Any:
    """The API client for the stack's cluster: the Kubernetes provider's own settings
    (`kubernetes:kubeconfig` as a path or the file's text, `kubernetes:context`), else
    $KUBECONFIG or ~/.kube/config, else the pod's service account."""
    from kubernetes import client, config

    kubeconfig, context = props.get("kubeconfig"), props.get("context")
    try:
        if kubeconfig:
            if kubeconfig_is_text(kubeconfig):
                api = config.new_client_from_config_dict(yaml.safe_load(kubeconfig), context)
            else:
                path = Path(kubeconfig).expanduser()
                api = config.new_client_from_config(str(path), context=context)
        else:
            try:
                api = config.new_client_from_config(context=context)
            except config.ConfigException:
                config.load_incluster_config()
                api = client.ApiClient()
    except (config.ConfigException, OSError, yaml.YAMLError) as exc:
        raise CrdError(f"kubernetes:kubeconfig / kubernetes:context: {exc}") from None
    return client.ApiextensionsV1Api(api)


def _call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One API call; None for 404; the body as JSON; a refusal as a CrdError."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = fn(*args, _preload_content=False, _request_timeout=60, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        try:
            detail = json.loads(exc.body or "{}").get("message") or exc.reason
        except ValueError:
            detail = exc.reason
        if exc.status == 409 and "conflict with" in str(detail):
            managers = sorted(set(re.findall(r'conflict with "([^"]+)"', str(detail))))
            raise CrdConflict(f"{what}: {detail}", managers) from None
        raise CrdError(f"{what}: the API server answered {exc.status}: {detail}") from None
    except HTTPError as exc:
        raise CrdError(f"{what}: the Kubernetes API is unreachable: {exc}") from None
    return json.loads(response.data or b"{}")


def _read(api: Any, name: str) -> dict[str, Any] | None:
    return _call(f"reading CRD {name}", api.read_custom_resource_definition, name)


def served_crd(kubeconfig: str | None, context: str | None, name: str) -> bool | None:
    """Whether the stack's cluster serves the CRD `name`; None when there is no cluster
    to ask (no kubeconfig, or its API unreachable): the provider then says so itself."""
    try:
        return _read(_api({"kubeconfig": kubeconfig, "context": context}), name) is not None
    except CrdError:
        return None


def _managers(crd: dict[str, Any]) -> set[str]:
    return {str(m.get("manager")) for m in crd["metadata"].get("managedFields") or []}


def _established(crd: dict[str, Any] | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _refuse_foreign(name: str, existing: dict[str, Any], mode: str) -> None:
    """A CRD another Pulumi resource manages would be deleted by it (a stack made
    before the CRDs were one resource deletes its chart's CRD children on its next
    update): say how to hand it over instead. Otherwise `install` refuses any CRD
    that is there already, as Helm does."""
    if any(m.startswith("pulumi-kubernetes") for m in _managers(existing)):
        raise CrdError(
            f"topology.operator.crds: the CRD {name} is managed by a Pulumi Kubernetes "
            "resource (this stack's chart before uerl installed CRDs as one resource, or "
            "another stack). Hand it over without deleting it: `pulumi state delete` its "
            "URN (`pulumi stack --show-urns | grep CustomResourceDefinition`), then "
            "`pulumi up` again."
        )
    if mode == "install":
        raise CrdError(leftover_crd_message(name))


def _foreign_resources(api: Any, crd: dict[str, Any], props: dict[str, Any]) -> list[str]:
    """`Kind namespace/name` of the custom resources of `crd`'s kind that are not this
    stack's (another namespace, or not labelled as its): deleting the CRD deletes them."""
    from kubernetes import client

    spec = crd["spec"]
    versions = spec.get("versions") or []
    version = next((v["name"] for v in versions if v.get("storage")), versions[0]["name"])
    plural = spec["names"]["plural"]
    listed = _call(
        f"listing {plural}.{spec['group']}",
        client.CustomObjectsApi(api.api_client).list_cluster_custom_object,
        spec["group"],
        version,
        plural,
    )
    # A stack made before its namespace and name were inputs owns none for sure.
    ours = (props.get("stack_namespace"), props.get("stack_name"))
    found = []
    for item in (listed or {}).get("items") or []:
        meta = item.get("metadata") or {}
        owner = (meta.get("namespace"), (meta.get("labels") or {}).get(INSTANCE_LABEL))
        if None in ours or owner != ours:
            found.append(f"{item.get('kind', plural)} {meta.get('namespace')}/{meta.get('name')}")
    return found


def _refuse_in_use(api: Any, names: list[str], props: dict[str, Any]) -> None:
    """Deleting a CRD deletes every custom resource of its kind, on the whole cluster."""
    found: list[str] = []
    for name in names:
        crd = _read(api, name)
        if crd is not None:
            found += _foreign_resources(api, crd, props)
    if found:
        more = f" and {len(found) - _NAMED} more" if len(found) > _NAMED else ""
        raise CrdError(
            "topology.operator.crds: 'install', and the KubeRay CRDs this stack installed "
            f"are in use by other stacks ({', '.join(found[:_NAMED])}{more}): deleting them "
            "would delete those too. Delete those first, or leave the CRDs to them: "
            "`pulumi state delete` this stack's KubeRayCRDs "
            "(`pulumi stack --show-urns | grep KubeRayCRDs`), then destroy again."
        )


def _apply_crd(api: Any, name: str, doc: dict[str, Any], *, force: bool) -> None:
    _call(
        f"applying CRD {name}",
        api.patch_custom_resource_definition,
        name,
        doc,
        field_manager=FIELD_MANAGER,
        force=force,
        _content_type="application/apply-patch+yaml",
    )


class CrdsProvider(pulumi.dynamic.ResourceProvider):
    """Applies, diffs and deletes the bundle's CRDs (stateless: all it needs is in
    the inputs and outputs)."""

    def _apply(self, props: dict[str, Any], creating: bool) -> dict[str, Any]:
        api = _api(props)
        text = Path(props["path"]).read_text()
        docs = [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]
        names = [d["metadata"]["name"] for d in docs]
        if creating:
            for name in names:
                existing = _read(api, name)
                if existing is not None:
                    _refuse_foreign(name, existing, props["mode"])
        # Force only where the user said so: `adopt` taking over CRDs that were there
        # before the stack. Otherwise a field another manager owns stops the update.
        may_force = creating and props["mode"] == "adopt"
        for name, doc in zip(names, docs, strict=True):
            try:
                _apply_crd(api, name, doc, force=False)
            except CrdConflict as exc:
                if not may_force:
                    raise CrdError(
                        f"topology.operator.crds: the CRD {name} has fields that "
                        f"{', '.join(exc.managers) or 'another field manager'} owns and this "
                        "chart's CRDs change; uerl takes over no other manager's fields. "
                        f"Give them up (or set crds 'skip'), then `pulumi up` again ({exc})"
                    ) from None
                _apply_crd(api, name, doc, force=True)
        deadline = time.monotonic() + ESTABLISH_TIMEOUT_S
        for name in names:
            while not _established(_read(api, name)):
                if time.monotonic() > deadline:
                    raise CrdError(f"CRD {name} not Established after {ESTABLISH_TIMEOUT_S:.0f}s")
                time.sleep(0.5)
        return {**props, "names": names}

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        outs = self._apply(props, True)
        return pulumi.dynamic.CreateResult(f"kuberay-crds-{props['version']}", outs)

    def diff(
        self, _id: str, olds: dict[str, Any], news: dict[str, Any]
    ) -> pulumi.dynamic.DiffResult:
        changed = [key for key in _DIFFED if olds.get(key) != news.get(key)]
        return pulumi.dynamic.DiffResult(changes=bool(changed), replaces=[])

    def update(
        self, _id: str, _olds: dict[str, Any], news: dict[str, Any]
    ) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(self._apply(news, False))

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        """A refresh finds a CRD deleted behind the stack's back: the digest is
        cleared, so the next `pulumi up` applies the bundle again."""
        api = _api(props)
        names = props.get("names") or []
        missing = [name for name in names if _read(api, name) is None]
        digest = "" if missing else props["digest"]
        return pulumi.dynamic.ReadResult(id_, {**props, "digest": digest})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        if props.get("mode") == "adopt":
            # They were there before the stack, and so, likely, are other teams'
            # RayClusters and RayJobs, which deleting a CRD deletes with it.
            return
        api = _api(props)
        names = props.get("names") or []
        _refuse_in_use(api, names, props)
        for name in names:
            _call(f"deleting CRD {name}", api.delete_custom_resource_definition, name)
        deadline = time.monotonic() + DELETE_TIMEOUT_S
        for name in names:
            while _read(api, name) is not None:
                if time.monotonic() > deadline:
                    raise CrdError(
                        f"CRD {name} still there {DELETE_TIMEOUT_S:.0f}s after its deletion "
                        "(custom resources of its kind may hold finalizers)"
                    )
                time.sleep(0.5)


class KubeRayCRDs(pulumi.dynamic.Resource, module="uerl", name="KubeRayCRDs"):
    """The chart's CRDs (`topology.operator.crds`: `install` refuses ones already
    there, `adopt` takes them over and leaves them on `pulumi destroy`)."""

    names: pulumi.Output[list[str]]

    def __init__(
        self,
        name: str,
        bundle: CrdBundle,
        mode: str,
        stack: tuple[str, str],
        access: ClusterAccess,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        kubeconfig = access.kubeconfig
        props: dict[str, Any] = {
            "version": bundle.version,
            "digest": bundle.digest,
            "path": str(bundle.path),
            "mode": mode,
            # (namespace, topology name): whose RayClusters a destroy may take with it.
            "stack_namespace": stack[0],
            "stack_name": stack[1],
            "context": access.context,
            "kubeconfig": None if kubeconfig is None else pulumi.Output.secret(kubeconfig),
            "names": None,
        }
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"])
        )
        super().__init__(CrdsProvider(), name, props, opts)
