"""The uerl component package's provider: Pulumi runs this (PulumiPlugin.yaml beside it)
when a program made with `pulumi package add <this directory>` creates a
`uerl:index:TrainingCluster`. The schema, and each language's SDK, come from the
component's typed arguments (infra/components/training_cluster.py)."""

import sys
from typing import Any

import pulumi
from pulumi.errors import InputPropertyErrorDetails
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ComponentInitError

from infra.components.training_cluster import InputRefused, TrainingCluster


def input_errors(refused: InputRefused) -> list[InputPropertyErrorDetails]:
    """Each refused input (a topology field, `kubeconfig`) as an input property error."""
    return [{"property_path": path, "reason": reason} for path, reason in refused.problems]


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
            inner = exc.inner
            if isinstance(inner, InputRefused):
                raise pulumi.InputPropertiesError(str(inner), input_errors(inner)) from None
            if isinstance(inner, pulumi.RunError):  # another refusal: the whole topology's
                errors: list[InputPropertyErrorDetails] = [
                    {"property_path": "topology", "reason": str(inner)}
                ]
                raise pulumi.InputPropertiesError(str(inner), errors) from None
            raise


if __name__ == "__main__":
    main(UerlProvider([TrainingCluster], "uerl", None, "0.0.0"), sys.argv[1:])
