"""Pulumi components wrapping the plain objects built by infra.manifests."""

from infra.components.instances import UeGames
from infra.components.metrics_component import StackMetrics
from infra.components.network_policies import StackNetworkPolicies
from infra.components.operator_component import KubeRayOperator
from infra.components.raycluster_component import UerlRayCluster
from infra.components.runs_component import RunStorage
from infra.components.service_accounts import StackServiceAccounts
from infra.components.volume_component import UeExecutablesVolume

__all__ = [
    "KubeRayOperator",
    "RunStorage",
    "StackMetrics",
    "StackNetworkPolicies",
    "StackServiceAccounts",
    "UeExecutablesVolume",
    "UeGames",
    "UerlRayCluster",
]
