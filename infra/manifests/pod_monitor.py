"""The stack's PodMonitor (`metrics.pod_monitor`): a Prometheus run by the Prometheus
Operator scrapes every Ray pod of the stack (head, learners, env runners) on its
`metrics` port, where each Ray node's metrics agent serves Ray's and uerl's metrics.

Its CRD is the Prometheus Operator's (third_party/prometheus-operator-crds-*/), not
uerl's: `pulumi preview` refuses the topology on a cluster without it.
"""

from __future__ import annotations

from infra.manifests import network_policy, raycluster
from infra.manifests.common import K8sObject, metadata
from infra.topology import Topology

API_VERSION = "monitoring.coreos.com/v1"
KIND = "PodMonitor"
CRD_NAME = "podmonitors.monitoring.coreos.com"
COMPONENT = "metrics"


def name(topology: Topology) -> str:
    return f"{topology.name}-ray"


def pod_monitor(topology: Topology) -> K8sObject | None:
    metrics = topology.metrics
    if not metrics.pod_monitor:
        return None
    meta = metadata(topology, name(topology), name="uerl", component=COMPONENT)
    meta["labels"] = {**metrics.pod_monitor_labels, **meta["labels"]}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "spec": {
            "selector": network_policy.ray_pods(topology),
            "namespaceSelector": {"matchNames": [topology.namespace]},
            "podMetricsEndpoints": [
                {
                    "port": raycluster.METRICS_PORT_NAME,
                    "path": "/metrics",
                    "interval": metrics.interval,
                }
            ],
        },
    }
