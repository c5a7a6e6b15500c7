"""The compiled game client (`native/`) against the pure-Python one: same wire, same results.

Both are run on the same games, seeds and actions, and on the same replies (the fuzz
test's captured and mutated ones), and must agree on everything RLlib sees, and on
which replies are rejected and where.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from native_required import require_compiled_client
from test_decode_fuzz import STEP, _captured_replies, mutant

from training.clients.native import NativeStepCodec
from training.mock_ue import TWO_TEAMS, MockUEServer
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol.step_codec import PythonStepCodec
from training.protocol.step_layout import StepLayout, WireError
from training.rllib.episodes import PythonEpisodes
from training.rllib.vector_env import UEVectorEnv

MockFactory = Callable[..., MockUEServer]

require_compiled_client()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray | np.generic):
        return np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize(
    ("scenario", "num_envs"), [("CartPole-v1", 4), ("Pendulum-v1", 3), (TWO_TEAMS, 3)]
)
def test_both_clients_step_a_game_to_the_same_observations_rewards_and_terminations(
    mock_ue: MockFactory, scenario: str, num_envs: int
) -> None:
    envs = {
        kind: UEVectorEnv(mock_ue(scenario, num_envs=num_envs).address, client=kind)
        for kind in ("python", "native")
    }
    try:
        assert envs["native"].client.transport_name == "native"
        assert envs["python"].client.transport_name == "python"
        resets = {kind: env.reset(seed=7) for kind, env in envs.items()}
        assert _same(resets["python"], resets["native"])
        reference = envs["python"]
        ended = 0
        for step in range(260):  # Pendulum truncates at 200
            spaces = reference.single_action_spaces
            actions = [{a: space.sample() for a, space in spaces.items()} for _ in range(num_envs)]
            replies = {kind: env.step(actions) for kind, env in envs.items()}
            assert _same(replies["python"], replies["native"]), f"step {step}"
            terminateds, truncateds = replies["python"][2:4]
            ended += sum(
                t["__all__"] or u["__all__"] for t, u in zip(terminateds, truncateds, strict=True)
            )
            if step == 230:
                resets = {kind: env.reset(seed=step) for kind, env in envs.items()}
                assert _same(resets["python"], resets["native"])
        assert ended > 0  # episodes ended (and restarted) along the way
    finally:
        for env in envs.values():
            env.close()


def _canonical(data: bytes) -> bool:
    """Bytes every protobuf parser reads alike: they are what serialising their parse gives."""
    try:
        return pb.State.FromString(data).SerializeToString(deterministic=True) == data
    except Exception:
        return False


def _codecs(env: UEVectorEnv) -> tuple[PythonStepCodec, NativeStepCodec]:
    return PythonStepCodec(env.layout), NativeStepCodec(env.layout)


@pytest.mark.parametrize("scenario", ["CartPole-v1", "Pendulum-v1", "two-teams"])
def test_both_step_codecs_accept_and_reject_the_same_mutated_replies(
    mock_ue: MockFactory, scenario: str
) -> None:
    server = mock_ue(TWO_TEAMS if scenario == "two-teams" else scenario, num_envs=3)
    env = UEVectorEnv(server.address, startup_timeout_s=5, request_timeout_s=5)
    try:
        steps = [data for op, data in _captured_replies(env, steps=30) if op == STEP]
        python, native = _codecs(env)
        rng = random.Random(scenario)
        outcomes = {"decoded": 0, "rejected": 0, "non-canonical": 0}
        for case in range(1500):
            structural = bool(case % 2)
            data = mutant(rng, rng.choice(steps), structural=structural)
            if not structural and not _canonical(data):
                # Protobuf parsers legitimately differ on malformed encodings (e.g. a map
                # entry with an unknown field): each codec alone must still only decode
                # or raise WireError, which the fuzz test checks.
                outcomes["non-canonical"] += 1
                continue
            results = []
            for codec in (python, native):
                try:
                    results.append(codec.decode(data))
                except WireError as exc:
                    results.append(str(exc))
            ours, theirs = results
            if isinstance(ours, str) or isinstance(theirs, str):
                assert isinstance(ours, str) and isinstance(theirs, str), (case, ours, theirs)
                outcomes["rejected"] += 1
                # The same environment is named (parsers word their own failures).
                if "not a State message" not in ours + theirs:
                    assert (
                        ours.split(":")[0].split(" agent")[0]
                        == theirs.split(":")[0].split(" agent")[0]
                    ), (case, ours, theirs)
            else:
                outcomes["decoded"] += 1
                assert _same(list(ours), list(theirs)), case
        assert outcomes["decoded"] > 50 and outcomes["rejected"] > 300, outcomes
    finally:
        env.close()


SPACES: dict[str, gym.Space] = {
    "box": gym.spaces.Box(-2.0, 2.0, (2, 3), np.float32),
    "box64": gym.spaces.Box(-1.0, 1.0, (4,), np.float64),
    "discrete": gym.spaces.Discrete(5),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 4, 2]),
    "multi_binary": gym.spaces.MultiBinary(5),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_both_step_codecs_encode_the_same_actions_to_the_same_message(name: str) -> None:
    space = SPACES[name]
    layout = StepLayout({"a": space, "b": space}, {"a": space, "b": space})
    python, native = PythonStepCodec(layout), NativeStepCodec(layout)
    space.seed(3)
    # Agent "b" acts in some environments only, as agents that are done do.
    actions = [{"a": space.sample(), **({"b": space.sample()} if i % 2 else {})} for i in range(5)]
    columns = layout.gather(actions)
    ours = pb.StateUpdate.FromString(python.encode(5, columns))
    theirs = pb.StateUpdate.FromString(native.encode(5, columns))
    assert ours == theirs
    assert len(theirs.step.environments) == 5 and "b" not in theirs.step.environments[0].updates


def test_a_dict_observation_decodes_to_the_same_nested_values(mock_ue: MockFactory) -> None:
    space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "mode": gym.spaces.Discrete(3)}
    )
    layout = StepLayout({"a": space}, {"a": gym.spaces.Discrete(2)})
    state = pb.State()
    for i in range(3):
        agent = state.training_state.environment_states.add().agent_states["a"]
        values = agent.observations.dict_point.values
        values["pos"].box_point.values.extend([i, -i / 2])
        values["mode"].discrete_point.value = i
        agent.reward = float(i)
    data = state.SerializeToString()
    decoded = [codec.decode(data) for codec in (PythonStepCodec(layout), NativeStepCodec(layout))]
    assert _same(list(decoded[0][1][0]), list(decoded[1][1][0]))
    batch = layout.observations(0, decoded[1][1][0].leaves, 3)
    assert batch["mode"].tolist() == [0, 1, 2] and batch["pos"].shape == (3, 2)


def test_both_episode_bookkeepers_agree_across_restarts_and_agents_that_leave() -> None:
    import uerl_native

    agents, n = ["a", "b"], 3
    books = [PythonEpisodes(agents, n), uerl_native.Episodes(agents, n)]
    for book in books:
        book.reset([[0, 1], [0, 1], [0]])
    from training.protocol.step_layout import AgentColumns

    rng = np.random.default_rng(1)
    for _ in range(200):
        columns, rows = [], []
        for _k in agents:
            env = np.flatnonzero(rng.random(n) < 0.8).astype(np.int32)
            m = len(env)
            columns.append(
                AgentColumns(
                    env,
                    rng.random(m).astype(np.float32),
                    rng.random(m) < 0.2,
                    rng.random(m) < 0.1,
                    [],
                    [(0, {"k": "v"})] if m else [],
                )
            )
            rows.append([np.float32(x) for x in rng.random(m)])
        ours, theirs = (book.step(columns, rows) for book in books)
        assert _same(ours, list(theirs))


def test_an_action_the_compiled_encoder_cannot_read_takes_the_python_path(
    mock_ue: MockFactory,
) -> None:
    envs = [
        UEVectorEnv(mock_ue("Pendulum-v1", num_envs=2).address, client=k)
        for k in ("python", "native")
    ]
    try:
        assert envs[1]._fast_step is not None
        for env in envs:
            env.reset(seed=1)
        # Plain lists, not arrays: the Python gather reads them, the compiled one does not.
        actions = [{"agent_0": [0.5]}, {"agent_0": [-1.0]}]
        replies = [env.step(actions) for env in envs]
        assert _same(replies[0], replies[1])
    finally:
        for env in envs:
            env.close()


def test_a_closed_env_is_not_reconnected_by_the_compiled_step(mock_ue: MockFactory) -> None:
    from training.protocol.errors import UEConnectionError

    server = mock_ue("CartPole-v1", num_envs=2)
    env = UEVectorEnv(server.address, client="native")
    env.reset(seed=0)
    env.close()
    with pytest.raises(UEConnectionError, match="is not connected"):
        env.step([{"agent_0": 0}, {"agent_0": 1}])
    assert server.stats.sessions_closed == 1


@pytest.mark.parametrize("client", ["python", "native"])
def test_each_client_runs_a_session_against_the_compiled_server(
    mock_ue: MockFactory, client: str
) -> None:
    from training.clients.choice import open_transport
    from training.clients.game_client import UPDATE_STATE, GymClient
    from training.protocol.transport import CallError

    server = mock_ue("CartPole-v1", num_envs=2, transport="native")
    transport = open_transport(server.address, None, client)
    assert transport.wait_ready(5)
    reset = pb.StateUpdate(reset=pb.Reset()).SerializeToString()
    with pytest.raises(CallError) as failed:  # a status and its message cross intact
        transport.call(UPDATE_STATE, reset, 5)
    assert (failed.value.code, failed.value.details) == (
        "FAILED_PRECONDITION",
        "no session: call StartGymConnector first",
    )
    transport.close()
    with GymClient(server.address, startup_timeout_s=5, transport=client) as game:
        game.connect()
        assert len(game.training_definition().environment_definitions) == 2
        assert set(game.reset({0: 1, 1: 2}).initial_state.environment_states) == {0, 1}
        env = UEVectorEnv(server.address, client=client)  # supersedes this session
        env.reset(seed=0)
        observations, *_ = env.step([{"agent_0": 0}, {"agent_0": 1}])
        assert len(observations) == 2
        env.close()
    stats = server.stats
    assert (stats.sessions_opened, stats.sessions_superseded, stats.steps) == (2, 1, 1)


def test_the_compiled_server_answers_grpc_health_checks(mock_ue: MockFactory) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    server = mock_ue("CartPole-v1", transport="native")
    with grpc.insecure_channel(server.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="Schola.GymService"), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
