"""The uerl component package's provider: Pulumi runs this (PulumiPlugin.yaml beside it)
when a program made with `pulumi package add <this directory>` creates a
`uerl:index:TrainingCluster`. The schema, and each language's SDK, come from the
component's typed arguments (infra/components/training_cluster.py)."""

from pulumi.provider.experimental import component_provider_host

from infra.components.training_cluster import TrainingCluster

if __name__ == "__main__":
    component_provider_host(name="uerl", components=[TrainingCluster])
