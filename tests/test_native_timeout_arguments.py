"""A timeout the compiled client cannot honour (NaN, infinite, negative) is a
`ValueError` naming the argument, at every entry point that takes one: never a Rust
panic reaching Python (a `PanicException` is a `BaseException`, which `except
Exception` does not catch)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from native_required import require_compiled_client

from training.clients.game_client import UPDATE_STATE
from training.mock_ue import MockUEServer
from training.protocol.transport import MAX_MESSAGE_BYTES
from training.rllib.vector_env import UEVectorEnv

MockFactory = Callable[..., MockUEServer]
DEFINITION = "/Schola.GymService/RequestTrainingDefinition"
BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, -1.0]

require_compiled_client()


def _channel(address: str) -> Any:  # uerl_native.Channel (no stubs)
    import uerl_native

    return uerl_native.Channel(address, MAX_MESSAGE_BYTES)


@pytest.mark.parametrize("timeout_s", BAD_TIMEOUTS)
def test_call_refuses_a_timeout_that_is_not_a_finite_non_negative_number(
    mock_ue: MockFactory, timeout_s: float
) -> None:
    channel = _channel(mock_ue(transport="native").address)
    with pytest.raises(ValueError, match="timeout_s"):
        channel.call(DEFINITION, b"", timeout_s)


@pytest.mark.parametrize("timeout_s", BAD_TIMEOUTS)
def test_wait_ready_refuses_a_timeout_that_is_not_a_finite_non_negative_number(
    closed_port: int, timeout_s: float
) -> None:
    # Nothing listens: the timeout is what wait_ready would spend retrying.
    channel = _channel(f"127.0.0.1:{closed_port}")
    with pytest.raises(ValueError, match="timeout_s"):
        channel.wait_ready(timeout_s)


@pytest.mark.parametrize("timeout_s", BAD_TIMEOUTS)
def test_vector_step_refuses_a_timeout_that_is_not_a_finite_non_negative_number(
    mock_ue: MockFactory, timeout_s: float
) -> None:
    import uerl_native

    env = UEVectorEnv(mock_ue(num_envs=2, transport="native").address, client="native")
    try:
        env.reset(seed=0)
        fast = env._fast_step  # the one compiled call a step is
        assert fast is not None
        with pytest.raises(ValueError, match="timeout_s"):
            uerl_native.vector_step(
                fast._codec, env.client.transport.channel, fast._episodes,
                [{"agent_0": 0}, {"agent_0": 1}], 2, UPDATE_STATE, timeout_s, fast._rows,
            )  # fmt: skip
    finally:
        env.close()
