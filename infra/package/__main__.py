"""The uerl component package's provider: Pulumi runs this (PulumiPlugin.yaml beside it)
when a program made with `pulumi package add <this directory>` creates a
`uerl:index:TrainingCluster`. The schema, and each language's SDK, come from the
component's typed arguments (infra/components/training_cluster.py)."""

import re
import sys
from typing import Any

import pulumi
from pulumi.errors import InputPropertyErrorDetails
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ComponentInitError

from infra.components.training_cluster import TrainingCluster

# A refusal's lines: `  topology.workers.replicas: Input should be ...`, or one naming
# another input (`kubeconfig: ...`).
FIELD_LINE = re.compile(r"^\s*((?:topology|kubeconfig|context)\b\S*): (.+)$")


def input_errors(message: str) -> list[InputPropertyErrorDetails]:
    """Each refused field of a topology refusal as an input property error."""
    found = [FIELD_LINE.match(line) for line in message.splitlines()]
    errors: list[InputPropertyErrorDetails] = [
        {"property_path": m.group(1), "reason": m.group(2)} for m in found if m
    ]
    return errors or [{"property_path": "topology", "reason": message}]


class UerlProvider(ComponentProvider):
    """Pulumi's component provider, but a topology the component refuses is an input
    error: the consumer's `pulumi preview` says the field's one line, as uerl's own
    program does, not the host's traceback under it. The errors are always given: the
    SDK's gRPC status has no trailing metadata without them, and aborting with it fails
    (AttributeError) in place of the message."""

    def construct(self, name: str, resource_type: str, inputs: Any, options: Any = None) -> Any:
        try:
            return super().construct(name, resource_type, inputs, options)
        except ComponentInitError as exc:
            if isinstance(exc.inner, pulumi.RunError):
                message = str(exc.inner)
                raise pulumi.InputPropertiesError(message, input_errors(message)) from None
            raise


if __name__ == "__main__":
    main(UerlProvider([TrainingCluster], "uerl", None, "0.0.0"), sys.argv[1:])
