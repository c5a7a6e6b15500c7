"""`StepCodec` over the compiled codec: prost messages straight to and from numpy."""

from __future__ import annotations

from training.protocol.step_codec import PythonStepCodec
from training.protocol.step_layout import ActionColumn, AgentColumns, StepLayout, WireError


class NativeStepCodec:
    name = "native"

    def __init__(self, layout: StepLayout) -> None:
        import uerl_native

        self.layout = layout
        self._codec = uerl_native.StepCodec(layout.native(), layout.row_shapes())
        self._wire_error = uerl_native.WireError
        # Dict action spaces have no flat form: those games encode in Python.
        self._encoder = None if layout.flat_actions else PythonStepCodec(layout)

    def encode(self, num_envs: int, actions: list[ActionColumn]) -> bytes:
        if self._encoder is not None:
            return self._encoder.encode(num_envs, actions)
        return self._codec.encode(num_envs, [(c.agent, c.env, c.values) for c in actions])

    def decode(self, data: bytes) -> tuple[int, list[AgentColumns]]:
        try:
            num_envs, agents = self._codec.decode(data)
        except self._wire_error as exc:
            raise WireError(str(exc)) from None
        return num_envs, [AgentColumns._make(agent) for agent in agents]
