"""What the stack runs beside the Ray cluster and the games: the KubeRay operator
(`operator`), who may reach what (`security`) and the metrics (`metrics`)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from infra.contract import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT
from infra.k8s_rules import described
from infra.topology.value_types import (
    Labels,
    NamespaceName,
    SelectorLabels,
    Spec,
    Text,
    checked_text,
)

KUBERAY_CHART_VERSION = "1.7.0"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"


class OperatorSpec(Spec):
    """The KubeRay operator (Helm chart `kuberay-operator`)."""

    install: bool = True
    """Install the chart; false on clusters that already run KubeRay."""
    chart_version: Text = KUBERAY_CHART_VERSION
    """The chart version, pinned."""
    repository: Text = KUBERAY_REPOSITORY
    """The Helm repository the chart comes from."""
    chart_path: Text | None = None
    """A local chart directory or .tgz, for air-gapped clusters (wins over repository). Relative
    paths are relative to the project root (Pulumi.yaml)."""
    values: dict[str, Any] = {}
    """Helm values for the chart, e.g. {image: {repository: mirror/kuberay/operator}}."""
    crds: Literal["install", "adopt", "skip"] = "install"
    """The chart's CRDs, one resource of the stack's. `install`: created before the chart (refused,
    naming this field, if a former KubeRay left them: Helm never deletes CRDs), deleted by
    `pulumi destroy` unless other stacks' RayClusters or RayJobs use them; `adopt`: take over
    existing ones and update them to the chart's, left in place by `pulumi destroy`; `skip`:
    leave them as they are."""
    namespace: NamespaceName | None = None
    """None: the topology's namespace."""


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a CIDR block (e.g. 10.0.0.0/8): {exc}") from None


Cidr = checked_text(_cidr)


class SecuritySpec(Spec):
    """Who may reach what, and how the pods run. Everything is on by default."""

    network_policies: bool = True
    """Per-stack NetworkPolicies: games only from the stack's Ray pods, the Ray pods only from each
    other (plus `allowed_cidrs` on the head's ports). Off only for a CNI without NetworkPolicy
    support, where they would silently do nothing."""
    allowed_cidrs: list[Cidr] = []
    """Who else may reach the head's GCS, client and dashboard ports (job submission from outside
    the cluster), e.g. ["10.20.0.0/16"]. Empty: nobody."""
    restrict_egress: bool = False
    """Egress only to the stack's own pods and DNS (the game or Ray then cannot download anything at
    run time), and the head's to the run store: with `runs.store: s3`, `runs.s3.endpoint` must
    then be an IP address or an in-cluster Service."""
    pod_security: Literal["restricted", "baseline", "privileged"] = "restricted"
    """The Pod Security Standard a namespace uerl creates enforces; every pod uerl creates passes
    `restricted`."""


# Ray's metrics export port on every Ray node (KubeRay's default, kept): each node's
# metrics agent serves Ray's and uerl's metrics there, in Prometheus' text format.
METRICS_PORT = 8080
# Prometheus' duration syntax as the PodMonitor's `interval` takes it: 30s, 1m, 1m30s.
DURATION = re.compile(r"^(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?$")


def _duration(value: str) -> str:
    match = DURATION.fullmatch(value)
    if not value or match is None:
        raise ValueError(f"{described(value)} is not a duration such as 30s, 1m or 1m30s")
    if not any(match.group(g) and int(match.group(g)) for g in (2, 4, 6)):
        raise ValueError(f"{described(value)}: a scrape interval must be longer than 0s")
    return value


Duration = checked_text(_duration)


class MetricsScraperSpec(Spec):
    """The Prometheus that scrapes the stack's Ray pods: the stack's NetworkPolicies let
    its pods, and no others, reach the metrics port."""

    namespace: NamespaceName
    """The namespace its pods run in, e.g. monitoring."""
    labels: SelectorLabels = {}
    """Labels its pods carry, e.g. {app.kubernetes.io/name: prometheus}. Empty: every pod of the
    namespace."""


class MetricsSpec(Spec):
    """Ray's and uerl's metrics (docs/kubernetes.md, "Watching a training"): every Ray
    pod's metrics agent serves them on `port`."""

    port: int = Field(default=METRICS_PORT, ge=1, le=65535)
    """The port every Ray pod serves metrics on (Ray's --metrics-export-port), named `metrics` in
    the pods."""
    pod_monitor: bool = False
    """Make a PodMonitor (the Prometheus Operator's CRD, which the cluster must have) that selects
    the stack's Ray pods' metrics port."""
    interval: Duration = "30s"
    """How often Prometheus scrapes the pods (the PodMonitor's interval)."""
    pod_monitor_labels: Labels = {}
    """Labels of the PodMonitor itself, for a Prometheus that picks PodMonitors by label
    (kube-prometheus-stack's: {release: <its Helm release>})."""
    scraper: MetricsScraperSpec | None = None
    """Who scrapes: with `security.network_policies`, only the Ray pods of the stack may reach each
    other, so a PodMonitor needs its Prometheus named here."""

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        taken = {
            GCS_PORT: "Ray's GCS",
            CLIENT_PORT: "Ray's client",
            DASHBOARD_PORT: "Ray's dashboard",
        }
        if value in taken:
            raise ValueError(f"{value} is {taken[value]} port on the head: choose another")
        return value
