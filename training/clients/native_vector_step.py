"""A whole `UEVectorEnv.step` in one compiled call: actions in, RLlib's five lists out.

Used when the env runs entirely on the compiled client (transport, codec and episode
bookkeeping); `UEVectorEnv` keeps its step-by-step path for everything else and for
action values the compiled encoder cannot read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from training.clients.game_client import UPDATE_STATE, GymClient
from training.clients.native_step_codec import NativeStepCodec
from training.clients.native_transport import NativeTransport, call_error
from training.protocol.errors import UEProtocolError
from training.protocol.transport import STEP


class NativeVectorStep:
    def __init__(
        self,
        client: GymClient,
        codec: NativeStepCodec,
        episodes: Any,
        num_envs: int,
        rows: Callable[[int, list, int], list],
    ) -> None:
        import uerl_native

        self._native = uerl_native
        self._client = client
        self._codec = codec._codec
        self._episodes = episodes
        self._num_envs = num_envs
        self._rows = rows

    @staticmethod
    def fits(client: GymClient, codec: Any, episodes: Any) -> bool:
        import uerl_native

        return (
            isinstance(client.transport, NativeTransport)
            and isinstance(codec, NativeStepCodec)
            and isinstance(episodes, uerl_native.Episodes)
        )

    def __call__(self, actions: Sequence[Any]) -> list | None:
        """The step's five lists; None when an action value needs the Python path (nothing
        was sent then)."""
        transport = self._client.transport
        if not isinstance(transport, NativeTransport):
            return None  # closed: the general path says so
        native = self._native
        try:
            return native.vector_step(
                self._codec,
                transport.channel,
                self._episodes,
                actions if type(actions) is list else list(actions),
                self._num_envs,
                UPDATE_STATE,
                self._client.request_timeout_s,
                self._rows,
            )
        except native.ActionTypeError:
            return None
        except native.RpcError as exc:
            raise self._client.failure(call_error(exc), STEP) from None
        except native.WireError as exc:
            raise UEProtocolError(self._client.endpoint, STEP, str(exc)) from None
