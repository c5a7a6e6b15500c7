"""Pulumi components wrapping the plain objects built by infra.manifests."""

from infra.components.instances import UeGames
from infra.components.network_policies import StackNetworkPolicies
from infra.components.operator import KubeRayOperator
from infra.components.raycluster import UerlRayCluster
from infra.components.volume import UeExecutablesVolume

__all__ = [
    "KubeRayOperator",
    "StackNetworkPolicies",
    "UeExecutablesVolume",
    "UeGames",
    "UerlRayCluster",
]
