"""Pulumi components wrapping the plain objects built by infra.manifests."""

from infra.components.instances import UeGames
from infra.components.operator import KubeRayOperator
from infra.components.raycluster import UerlRayCluster
from infra.components.volume import UeExecutablesVolume

__all__ = ["KubeRayOperator", "UeExecutablesVolume", "UeGames", "UerlRayCluster"]
