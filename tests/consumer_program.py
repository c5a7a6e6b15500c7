"""A team's own Pulumi program, as the harness (tests/pulumi_harness.py) runs it under
mocks: its own Kubernetes provider, and one TrainingCluster beside it. What it passes comes
from $UERL_CONSUMER (JSON): `topology`, and `kubeconfig`/`context` for the component when
given; `provider` false makes the component with no provider of its own; `options`, the
component's `protect`, `retain_on_delete`, and `label`, a label its transformation adds to
every Kubernetes object's metadata."""

from __future__ import annotations

import json
import os

import pulumi
import pulumi_kubernetes as k8s

from infra.components.training_cluster import TrainingCluster

settings = json.loads(os.environ["UERL_CONSUMER"])
args = {key: settings[key] for key in ("topology", "kubeconfig", "context") if key in settings}
options = dict(settings.get("options", {}))
label = options.pop("label", None)


def add_label(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult:
    metadata = args.props.get("metadata")
    if isinstance(metadata, dict):
        key, value = label.split("=")
        metadata["labels"] = {**metadata.get("labels", {}), key: value}
    return pulumi.ResourceTransformationResult(args.props, args.opts)


opts = pulumi.ResourceOptions(**options, transformations=[add_label] if label else None)
if settings.get("provider", True):
    provider = k8s.Provider("team-k8s", kubeconfig="/teams/own/kubeconfig")
    opts.providers = [provider]
cluster = TrainingCluster("rl", args, opts)  # type: ignore[arg-type]
pulumi.export("endpoints", cluster.endpoints)
