"""The stack's Ray head pod: found by KubeRay's labels in the stack's namespace, and
usable only when Running and Ready; otherwise one line saying what is not ready.

The pods are plain dicts as the API serves them (`kubectl get -o json`'s shape), from an
injected lister, so the choice is tested against fake pod lists."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.endpoints import Endpoints
from training.submit.submit_error import BAD_INPUT, CLUSTER_UNUSABLE, SubmitError

Pod = dict[str, Any]
# (namespace, label selector) -> the pods, as the API's JSON.
PodLister = Callable[[str, str], list[Pod]]

# A list of pods answers in well under this; an unreachable API fails at it, not later.
API_TIMEOUT_S = 15


def head_selector(cluster_name: str) -> str:
    return f"ray.io/cluster={cluster_name},ray.io/node-type=head"


def running_and_ready(pod: Pod) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _name(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def _terminating(pod: Pod) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def not_ready_reason(pod: Pod) -> str:
    """Why a pod is not Running and Ready, for a person: its phase and what holds it."""
    status = pod.get("status") or {}
    parts = [f"phase {status.get('phase') or 'unknown'}"]
    for container in status.get("containerStatuses") or []:
        if container.get("ready"):
            continue
        state = container.get("state") or {}
        if "waiting" in state:
            reason = state["waiting"].get("reason") or "waiting"
            parts.append(f"container {container.get('name')} waiting ({reason})")
        elif "terminated" in state:
            ended = state["terminated"]
            parts.append(
                f"container {container.get('name')} terminated "
                f"({ended.get('reason') or 'exit'} {ended.get('exitCode', '?')})"
            )
        else:
            parts.append(f"container {container.get('name')} running, not ready yet")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        parts.append(f"not scheduled: {scheduled.get('message') or scheduled.get('reason')}")
    elif len(parts) == 1 and (ready := conditions.get("Ready")) is not None:
        parts.append(str(ready.get("message") or ready.get("reason") or "not Ready"))
    return "; ".join(parts)


def ready_head(pods: list[Pod], *, where: str, prefer: str | None = None) -> str:
    """The name of a Running and Ready head among `pods` (`prefer` if it still is one),
    or a SubmitError (cluster not usable) saying what is not ready."""
    live = [p for p in pods if not _terminating(p)]
    ready = sorted(_name(p) for p in live if running_and_ready(p))
    if prefer in ready:
        return str(prefer)
    if ready:
        return ready[0]
    if live:
        pod = sorted(live, key=_name)[0]
        raise SubmitError(
            f"the Ray head pod {_name(pod)} ({where}) is not ready: {not_ready_reason(pod)}",
            CLUSTER_UNUSABLE,
        )
    if pods:
        raise SubmitError(
            f"the Ray head pod {_name(pods[0])} ({where}) is terminating, being replaced: "
            "try again once its successor is Ready",
            CLUSTER_UNUSABLE,
        )
    raise SubmitError(
        f"no Ray head pod ({where}): is the stack up (`pulumi up`), and is this its "
        "cluster (--kubeconfig, --context)?",
        CLUSTER_UNUSABLE,
    )


class HeadFinder:
    """Finds the stack's Ray head pod, staying with the one it found while that one is
    still Running and Ready (a replaced head has another name)."""

    def __init__(self, endpoints: Endpoints, list_pods: PodLister) -> None:
        self.namespace = endpoints.namespace
        self.selector = head_selector(endpoints.cluster_name)
        self._list_pods = list_pods
        self.current: str | None = None

    @property
    def where(self) -> str:
        return f"namespace {self.namespace}, labels {self.selector}"

    def find(self) -> str:
        pods = self._list_pods(self.namespace, self.selector)
        self.current = ready_head(pods, where=self.where, prefer=self.current)
        return self.current


# ---- the official Kubernetes client -------------------------------------------------


def kube_api_client(kubeconfig: str | Path | None, context: str | None) -> Any:
    """An ApiClient from `kubeconfig` (default: $KUBECONFIG, else ~/.kube/config) and
    `context` (default: its current one); bad input when it cannot be loaded."""
    from kubernetes import config
    from kubernetes.client import Configuration

    # urllib3 would retry a refused connection with a WARNING line each time: one
    # attempt, and its failure is said once, by us.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise SubmitError(f"--kubeconfig {kubeconfig}: no such file", BAD_INPUT)
    configuration = Configuration()
    try:
        # persist_config=False: never write refreshed tokens back into the user's file.
        config.load_kube_config(
            config_file=None if kubeconfig is None else str(kubeconfig),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except Exception as exc:  # ConfigException, or a file that is not YAML
        source = kubeconfig or "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
        shown = f" (context {context})" if context else ""
        reason = str(exc)
        if isinstance(exc, (TypeError, AttributeError)):
            # The client indexes whatever YAML the file holds as a map: 'str' object does
            # not support item assignment, for a file of one line of text.
            reason = "not a kubeconfig (a YAML map of clusters, users and contexts)"
        raise SubmitError(f"cannot load {source}{shown}: {reason}", BAD_INPUT) from None
    configuration.retries = False
    from kubernetes.client import ApiClient

    return ApiClient(configuration=configuration)


def api_failure(api_client: Any, exc: Exception) -> str:
    """An API call's failure in a line: the HTTP status and reason, or why no answer."""
    from kubernetes.client.exceptions import ApiException

    host = api_client.configuration.host
    if isinstance(exc, ApiException) and exc.status:
        try:  # the Status object's message says who may not do what
            detail = ": " + str(json.loads(exc.body)["message"])
        except (TypeError, ValueError, KeyError):
            detail = ""
        return f"the Kubernetes API at {host} answered {exc.status} {exc.reason}{detail}"
    reason = getattr(exc, "reason", None) or exc
    # urllib3 prefixes the connection object's repr: "<...HTTPSConnection object at 0x..>: "
    return f"cannot reach the Kubernetes API at {host}: " + re.sub(r"<[^>]*>: ", "", str(reason))


def kube_pod_lister(api_client: Any) -> PodLister:
    """A PodLister on the cluster; failures are SubmitErrors (cluster not usable)."""
    from kubernetes.client import CoreV1Api

    core = CoreV1Api(api_client)

    def list_pods(namespace: str, selector: str) -> list[Pod]:
        try:
            found = core.list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=API_TIMEOUT_S
            )
        except Exception as exc:  # ApiException, urllib3's errors, a TLS failure
            raise SubmitError(api_failure(api_client, exc), CLUSTER_UNUSABLE) from None
        # The API's JSON shape (camelCase), as the readiness checks read it.
        return list(api_client.sanitize_for_serialization(found).get("items") or [])

    return list_pods
