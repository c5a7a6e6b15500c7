"""Fuzz: whatever bytes a game sends back, decoding raises only a UEProtocolError that says where.

Real replies are captured from the mock game (one- and two-agent-type games,
Box and Discrete spaces, reset and step replies), then mutated thousands of
times, structurally (wrong counts, unknown agents, wrong point kinds, dtypes and
lengths, NaN rewards) and as bytes (bit flips, truncation, random bytes). Each
mutant goes through the same path a reply takes in training: bytes ->
`parse_state` -> `UEVectorEnv` decoding.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

from training.clients.game_client import parse_state
from training.mock_ue import TWO_TEAMS, MockUEServer
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.errors import UEProtocolError
from training.rllib.vector_env import UEVectorEnv

MockFactory = Callable[..., MockUEServer]
CASES_PER_GAME = 1500
RESET, STEP = "UpdateState(reset)", "UpdateState(step)"


def _captured_replies(env: UEVectorEnv, steps: int) -> list[tuple[str, bytes]]:
    """Reset and step the env against the real game, keeping every reply's bytes."""
    captured: list[tuple[str, bytes]] = []
    env._fast_step = None  # the one-call compiled step never hands bytes to Python
    original = env.client.update_bytes

    def record(request: bytes, operation: str = "UpdateState") -> bytes:
        reply = original(request, operation)
        captured.append((operation, reply))
        return reply

    env.client.update_bytes = record  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    for _ in range(steps):
        actions = [
            {aid: env.single_action_spaces[aid].sample() for aid in env.possible_agents}
            for _ in range(env.num_envs)
        ]
        env.step(actions)
        if rng.random() < 0.1:
            env.reset()
    return captured


def _mutate_point(rng: random.Random, point: pb.Point) -> None:
    kind = rng.randrange(7)
    if kind == 0:
        point.ClearField("point")
    elif kind == 1:
        point.discrete_point.value = rng.randint(-(2**31), 2**31 - 1)
    elif kind == 2:
        point.box_point.values.append(rng.uniform(-1e38, 1e38))
    elif kind == 3 and point.HasField("box_point") and point.box_point.values:
        del point.box_point.values[rng.randrange(len(point.box_point.values))]
    elif kind == 4:
        point.box_point.dtype = rng.randrange(-3, 16)  # includes values no DType names
    elif kind == 5:
        point.box_point.shape.extend([rng.randint(-2, 5) for _ in range(rng.randint(1, 3))])
    else:
        point.multi_discrete_point.values.extend([rng.randint(-5, 5)])


def _mutate_structure(rng: random.Random, state: pb.State) -> None:
    if state.HasField("training_state"):
        envs = state.training_state.environment_states
        choice = rng.randrange(8)
        if choice == 0 and len(envs) > 0:
            del envs[rng.randrange(len(envs))]
        elif choice == 1:
            envs.add().agent_states["intruder"].reward = 1.0
        elif choice == 2:
            state.ClearField("optional_training_state")
            state.initial_state.SetInParent()
        else:
            env = envs[rng.randrange(len(envs))] if len(envs) else envs.add()
            agents = env.agent_states
            if choice == 3 and agents:
                del agents[rng.choice(list(agents))]
            elif choice == 4:
                agents[rng.choice(["", "x" * 300, "agent_9", "\u00e9"])].reward = 0.5
            elif agents:
                agent = agents[rng.choice(list(agents))]
                if choice == 5:
                    agent.reward = rng.choice([float("nan"), float("inf"), -float("inf")])
                else:
                    _mutate_point(rng, agent.observations)
    else:
        initial = state.initial_state.environment_states
        choice = rng.randrange(5)
        if choice == 0 and initial:
            del initial[rng.choice(list(initial))]
        elif choice == 1:
            initial[rng.randint(-3, 40)].agent_states["intruder"].SetInParent()
        elif choice == 2:
            state.ClearField("optional_initial_state")
        elif initial:
            env = initial[rng.choice(list(initial))]
            if choice == 3 and env.agent_states:
                del env.agent_states[rng.choice(list(env.agent_states))]
            elif env.agent_states:
                agent = env.agent_states[rng.choice(list(env.agent_states))]
                _mutate_point(rng, agent.observations)


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0 and data:
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf)
    if kind == 1 and data:
        return data[: rng.randrange(len(data))]
    if kind == 2:
        at = rng.randrange(len(data) + 1)
        return data[:at] + rng.randbytes(rng.randint(1, 16)) + data[at:]
    return rng.randbytes(rng.randint(0, 64))


def mutant(rng: random.Random, data: bytes, *, structural: bool) -> bytes:
    """A reply mutated structurally (as a message) or as bytes."""
    if not structural:
        return _mutate_bytes(rng, data)
    state = pb.State.FromString(data)
    _mutate_structure(rng, state)
    return state.SerializeToString()


def _decode(env: UEVectorEnv, operation: str, data: bytes) -> None:
    if operation == RESET:
        env.decode_reset(parse_state(data, env.endpoint, operation))
    else:
        env.decode_step(data)


@pytest.mark.parametrize("scenario", ["CartPole-v1", "Pendulum-v1", "two-teams"])
def test_every_mutated_reply_fails_only_with_a_protocol_error_naming_where(
    mock_ue: MockFactory, scenario: str
) -> None:
    server = (
        mock_ue(TWO_TEAMS, num_envs=3) if scenario == "two-teams" else mock_ue(scenario, num_envs=3)
    )
    env = UEVectorEnv(server.address, startup_timeout_s=5, request_timeout_s=5)
    try:
        replies = _captured_replies(env, steps=30)
        assert {op for op, _ in replies} == {RESET, STEP}
        rng = random.Random(scenario)
        outcomes = {"decoded": 0, "rejected": 0}
        for case in range(CASES_PER_GAME):
            operation, data = rng.choice(replies)
            data = mutant(rng, data, structural=bool(case % 2))
            try:
                _decode(env, operation, data)
                outcomes["decoded"] += 1
            except UEProtocolError as exc:
                outcomes["rejected"] += 1
                message = str(exc)
                assert server.address in message and operation in message, message
            except Exception as exc:  # the defect this test exists to catch
                raise AssertionError(
                    f"case {case} ({operation}) raised {type(exc).__name__}: {exc}"
                ) from exc
        # Both outcomes happen: mutants the protocol allows decode, the rest are rejected.
        assert outcomes["decoded"] > 50 and outcomes["rejected"] > CASES_PER_GAME // 4, outcomes
    finally:
        env.close()


def test_a_structural_error_names_environment_agent_and_field(mock_ue: MockFactory) -> None:
    server = mock_ue(TWO_TEAMS, num_envs=2)
    env = UEVectorEnv(server.address, startup_timeout_s=5, request_timeout_s=5)
    try:
        replies = dict(_captured_replies(env, steps=1))
        state = pb.State.FromString(replies[STEP])
        agent = state.training_state.environment_states[1].agent_states["cart_1"]
        agent.observations.box_point.values.append(3.0)
        with pytest.raises(UEProtocolError) as caught:
            env.decode_step(state.SerializeToString())
        assert "environment 1" in str(caught.value)
        assert "'cart_1'" in str(caught.value) and "observations" in str(caught.value)
    finally:
        env.close()


def test_bytes_that_are_not_a_state_message_are_a_protocol_error() -> None:
    with pytest.raises(UEProtocolError) as caught:
        parse_state(b"\xff\xff\xff", "127.0.0.1:1", STEP)
    assert "127.0.0.1:1" in str(caught.value) and "not a State message" in str(caught.value)
