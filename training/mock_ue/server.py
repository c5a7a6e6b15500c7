"""A Schola-compatible GymService serving N copies of a gymnasium scenario.

Behaves like a Schola game as far as the protocol goes: StartGymConnector with an
autoreset mode, RequestTrainingDefinition, UpdateState(reset | step | CLOSED), all
three autoreset modes, one session at a time (a new StartGymConnector supersedes
a session whose client vanished without CLOSED), standard gRPC health service.
Responses are built with the batched codec: numeric conversion once per agent per
call, Python loops only over environments.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from training.mock_ue import wire
from training.mock_ue.scenarios import Scenario, scenario_for
from training.protocol import spaces as codec
from training.protocol._generated import schola_gym_pb2 as pb
from training.protocol._generated import schola_gym_pb2_grpc as pb_grpc
from training.protocol.transport import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

SERVICE_NAME = "Schola.GymService"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"

SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Fail loudly if the port is taken instead of silently sharing it (gRPC's default).
    ("grpc.so_reuseport", 0),
    # Accept the client's in-call keepalive pings.
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


@dataclass
class MockStats:
    sessions_opened: int = 0
    sessions_closed: int = 0
    sessions_superseded: int = 0
    resets: int = 0
    steps: int = 0
    env_steps: int = 0
    # Episodes the game ended (every agent of an environment done): what training may count.
    episodes_ended: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class _Abort(Exception):
    """Raised inside a handler to fail the RPC with a status and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Session:
    """The state of one client session: N environments x agents, autoreset bookkeeping."""

    def __init__(self, scenario: Scenario, num_envs: int, autoreset: int) -> None:
        self.scenario = scenario
        self.num_envs = num_envs
        self.autoreset = autoreset
        self.slots = scenario.slots
        environments = [scenario.make_environment() for _ in range(num_envs)]
        self.envs = {s.agent_id: [envs[s.agent_id] for envs, _ in environments] for s in self.slots}
        # Joint games (agents interact): every action of an environment goes in at once.
        self.seats = [seat for _, seat in environments if seat is not None]
        first = {s.agent_id: self.envs[s.agent_id][0] for s in self.slots}
        self.obs_spaces = {aid: env.observation_space for aid, env in first.items()}
        self.act_spaces = {aid: env.action_space for aid, env in first.items()}
        self.encoders = [
            wire.AgentEntryEncoder(s.agent_id, self.obs_spaces[s.agent_id]) for s in self.slots
        ]
        # Whole-reply template when every agent's entry has a fixed layout.
        self.full_reply = (
            wire.FullReply(self.encoders, num_envs) if all(e.fixed for e in self.encoders) else None
        )
        # Plain lists: per-step bookkeeping over a few dozen flags is cheaper without numpy.
        self.alive = {s.agent_id: [False] * num_envs for s in self.slots}
        self.needs_reset = [True] * num_envs
        self.episodes_ended = 0

    def close(self) -> None:
        for envs in self.envs.values():
            for env in envs:
                env.close()

    # -------------------------------------------------------------- reset

    def reset(self, request: pb.Reset, out: pb.InitialState) -> None:
        indices = sorted(request.environments.keys())
        for i in indices:
            if not 0 <= i < self.num_envs:
                raise _Abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"reset of environment {i}: this game hosts {self.num_envs}",
                )
        seeds = [
            request.environments[i].seed if request.environments[i].HasField("seed") else None
            for i in indices
        ]
        self._reset_into(indices, seeds, out)

    def _reset_into(
        self, indices: list[int], seeds: list[int | None], out: pb.InitialState
    ) -> None:
        if not indices:
            return
        states = [out.environment_states[i].agent_states for i in indices]
        for aid, obs in self._reset_envs(indices, seeds).items():
            points = [st[aid].observations for st in states]
            codec.batch_to_points(self.obs_spaces[aid], np.stack(obs), points)

    def _reset_envs(self, indices: list[int], seeds: list[int | None]) -> dict[str, list[Any]]:
        """Reset every agent of the given environments; their first observations."""
        out = {}
        for k, slot in enumerate(self.slots):
            aid, envs, alive = slot.agent_id, self.envs[slot.agent_id], self.alive[slot.agent_id]
            # Distinct seeds per agent of one environment, reproducible per environment.
            out[aid] = [
                envs[i].reset(seed=None if s is None else s * 131 + k)[0]
                for i, s in zip(indices, seeds, strict=True)
            ]
            for i in indices:
                alive[i] = True
        for i in indices:
            self.needs_reset[i] = False
        return out

    # -------------------------------------------------------------- step

    def step(self, request: pb.Step) -> tuple[bytes, int]:
        """Step all environments; returns the `State` reply as wire bytes and the env-steps."""
        n = self.num_envs
        env_msgs = request.environments
        if len(env_msgs) != n:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"step has {len(env_msgs)} environments, game hosts {n}",
            )
        restart = self.needs_reset
        restart_idx = [i for i in range(n) if restart[i]]
        if restart_idx and self.autoreset == pb.DISABLED:
            raise _Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"environment {restart_idx[0]} is done and autoreset is DISABLED: send a reset",
            )
        acting_by_agent = {
            aid: [i for i in range(n) if alive[i] and not restart[i]]
            for aid, alive in self.alive.items()
        }
        actions_by_agent = {
            aid: self._actions(env_msgs, aid, acting) if acting else []
            for aid, acting in acting_by_agent.items()
        }
        if self.seats:
            self._submit_joint(acting_by_agent, actions_by_agent)
        # Per agent: the environments it acted in and what they returned.
        results: list[tuple[list[int], list[Any], list[float], list[bool], list[bool]]] = []
        for slot in self.slots:
            aid, alive = slot.agent_id, self.alive[slot.agent_id]
            acting = acting_by_agent[aid]
            obs: list[Any] = []
            rewards: list[float] = []
            terms: list[bool] = []
            truncs: list[bool] = []
            if acting:
                envs = self.envs[aid]
                for i, action in zip(acting, actions_by_agent[aid], strict=True):
                    o, r, te, tr, _ = envs[i].step(action)
                    obs.append(o)
                    rewards.append(r)
                    terms.append(te)
                    truncs.append(tr)
                    if te or tr:
                        alive[i] = False
            results.append((acting, obs, rewards, terms, truncs))
        alives = list(self.alive.values())
        done_idx = [i for i in range(n) if not restart[i] and not any(alive[i] for alive in alives)]
        self.episodes_ended += len(done_idx)
        # NEXT_STEP: environments that finished last step restart now, ignoring actions;
        # they answer every agent's first observation with reward 0, not done.
        restart_obs = self._reset_envs(restart_idx, [None] * len(restart_idx))
        reply = self._encode(results, restart_idx, restart_obs)
        if self.autoreset == pb.SAME_STEP:
            # Reset at once; the new first observations go beside the terminal ones.
            if done_idx:
                initial = pb.State()
                initial.initial_state.SetInParent()
                self._reset_into(done_idx, [None] * len(done_idx), initial.initial_state)
                reply += initial.SerializeToString()
        else:
            for i in done_idx:
                self.needs_reset[i] = True
        return reply, n - len(restart_idx)

    def _submit_joint(self, acting: dict[str, list[int]], actions: dict[str, list[Any]]) -> None:
        """Each joint game steps once with all its agents' actions."""
        per_environment: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for aid, indices in acting.items():
            for i, action in zip(indices, actions[aid], strict=True):
                per_environment[i][aid] = action
        for i, seat in enumerate(self.seats):
            if per_environment[i]:
                seat.submit(per_environment[i])

    def _encode(
        self,
        results: list[tuple[list[int], list[Any], list[float], list[bool], list[bool]]],
        restart_idx: list[int],
        restart_obs: dict[str, list[Any]],
    ) -> bytes:
        n = self.num_envs
        if restart_idx:
            # Merge each agent's restarted environments (reward 0, not done) in index order.
            k = len(restart_idx)
            merged = []
            for slot, (acting, obs, rewards, terms, truncs) in zip(
                self.slots, results, strict=True
            ):
                rows = sorted(
                    zip(
                        acting + restart_idx,
                        obs + restart_obs[slot.agent_id],
                        rewards + [0.0] * k,
                        terms + [False] * k,
                        truncs + [False] * k,
                        strict=True,
                    ),
                    key=lambda row: row[0],
                )
                merged.append(tuple(map(list, zip(*rows, strict=True))) if rows else ([],) * 5)
            results = merged
        full = self.full_reply
        if full is not None and all(len(r[0]) == n for r in results):
            for k, (_, obs, rewards, terms, truncs) in enumerate(results):
                full.set(k, obs, rewards, terms, truncs)
            return full.tobytes()
        entries: list[list[bytes]] = [[] for _ in range(n)]
        for encoder, (idx, obs, rewards, terms, truncs) in zip(self.encoders, results, strict=True):
            if idx:
                for i, entry in zip(idx, encoder.encode(obs, rewards, terms, truncs), strict=True):
                    entries[i].append(entry)
        return wire.training_state(n, entries)

    def _actions(self, env_msgs: Any, aid: str, acting: list[int]) -> list[Any]:
        points = []
        for i in acting:
            point = env_msgs[i].updates.get(aid)
            if point is None:
                raise _Abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"environment {i}: no action for agent {aid!r}",
                )
            points.append(point)
        space = self.act_spaces[aid]
        if isinstance(space, gym.spaces.Discrete) and all(
            p.WhichOneof("point") == "discrete_point" for p in points
        ):
            # Plain ints, no numpy round trip: gymnasium's Discrete.contains is fastest on them.
            return [p.discrete_point.value for p in points]
        try:
            batch = codec.points_to_batch(space, points, f"action of {aid!r}")
        except codec.CodecError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return list(batch)


class _NativeStatus(Exception):
    """A failed call as uerl_native.Server reports it (it reads these two attributes)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.grpc_code = code.value[0]
        self.grpc_message = message


class _GymServicer(pb_grpc.GymServiceServicer):
    def __init__(self, server: MockUEServer) -> None:
        self._server = server

    def StartGymConnector(self, request, context):
        return self._server._handle(context, self._server._start, request)

    def RequestTrainingDefinition(self, request, context):
        return self._server._handle(context, self._server._definition, request)

    def UpdateState(self, request, context):
        return self._server._handle(context, self._server._update, request)


def _serialize_state(state: pb.State | bytes) -> bytes:
    # Step replies are pre-encoded wire bytes (see wire.py); the rest are messages.
    return state if isinstance(state, bytes) else state.SerializeToString()


def _add_servicer(servicer: _GymServicer, server: grpc.Server) -> None:
    """The generated registration, except that UpdateState may answer raw bytes."""
    handlers = {
        "StartGymConnector": grpc.unary_unary_rpc_method_handler(
            servicer.StartGymConnector,
            request_deserializer=pb.GymConnectorStartRequest.FromString,
            response_serializer=pb.GymConnectorStartResponse.SerializeToString,
        ),
        "RequestTrainingDefinition": grpc.unary_unary_rpc_method_handler(
            servicer.RequestTrainingDefinition,
            request_deserializer=pb.TrainingDefinitionRequest.FromString,
            response_serializer=pb.TrainingDefinition.SerializeToString,
        ),
        "UpdateState": grpc.unary_unary_rpc_method_handler(
            servicer.UpdateState,
            request_deserializer=pb.StateUpdate.FromString,
            response_serializer=_serialize_state,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class MockUEServer:
    """GymService over N copies of a gymnasium scenario; usable in-process or via `uerl mock-ue`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        env_id: str = "CartPole-v1",
        num_envs: int = 1,
        *,
        step_delay_s: float = 0.0,
        max_workers: int = 4,
        on_reply: Callable[[pb.StateUpdate, pb.State], None] | None = None,
        tls_cert_path: str | None = None,
        tls_key_path: str | None = None,
        tls_client_ca_path: str | None = None,
        transport: str = "grpcio",
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        if transport not in ("grpcio", "native"):
            raise ValueError(f"transport {transport!r}: expected grpcio or native")
        if transport == "native" and tls_cert_path is not None:
            raise ValueError("the native transport serves plaintext only: drop TLS or use grpcio")
        # "native": uerl's compiled server (uerl_native.Server) calls `_native_call`.
        self.transport = transport
        self._native: Any = None
        self.host = host
        self.requested_port = port
        self.env_id = env_id
        self.num_envs = num_envs
        self.step_delay_s = step_delay_s
        # Fault injection for tests: may rewrite each UpdateState reply before it is sent.
        self.on_reply = on_reply
        self.scenario = scenario_for(env_id)
        self._definition_msg = self._build_definition()
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._stats = MockStats()
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self._max_workers = max_workers
        # Serve TLS when both PEM paths are given; mutual TLS (clients must present a
        # certificate this CA signed) when a client CA is given too.
        if (tls_cert_path is None) != (tls_key_path is None):
            raise ValueError("tls_cert_path and tls_key_path go together")
        if tls_client_ca_path is not None and tls_cert_path is None:
            raise ValueError("tls_client_ca_path (mutual TLS) needs tls_cert_path and tls_key_path")
        self._tls = (tls_cert_path, tls_key_path) if tls_cert_path and tls_key_path else None
        self._tls_client_ca = tls_client_ca_path
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Bind and serve; returns the bound port (port 0 picks a free one)."""
        if self.requested_port != 0:
            _check_port_free(self.host, self.requested_port)
        if self.transport == "native":
            import uerl_native

            self._native = uerl_native.Server(self.host, self.requested_port, self._native_call)
            self.port = self._native.port
            self._stopped = threading.Event()
            log.info(
                "mock-ue %s x%d on %s (native%s)",
                self.env_id,
                self.num_envs,
                self.address,
                ", and its local socket" if self._native.local_socket else "",
            )
            return self.port
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers), options=SERVER_OPTIONS
        )
        _add_servicer(_GymServicer(self), server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = f"{self.host}:{self.requested_port}"
        try:
            if self._tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, self._server_credentials())
        except RuntimeError as exc:
            raise OSError(f"cannot bind {address}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot bind {address}")
        server.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.port = port
        log.info("mock-ue %s x%d listening on %s:%d", self.env_id, self.num_envs, self.host, port)
        return port

    def _server_credentials(self) -> grpc.ServerCredentials:
        assert self._tls is not None
        cert, key = (Path(p).read_bytes() for p in self._tls)
        if self._tls_client_ca is None:
            return grpc.ssl_server_credentials([(key, cert)])
        return grpc.ssl_server_credentials(
            [(key, cert)],
            root_certificates=Path(self._tls_client_ca).read_bytes(),
            require_client_auth=True,
        )

    def stop(self, grace: float | None = None) -> None:
        if self._native is not None:
            self._native.stop()
            self._native = None
            self._stopped.set()
            self._close_session()
            return
        if self._server is None:
            return
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        self._server = None
        self._close_session()

    def _close_session(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._native is not None:
            return self._stopped.wait(timeout)
        return self._server.wait_for_termination(timeout) if self._server else True

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def stats(self) -> MockStats:
        with self._lock:
            return MockStats(**self._stats.to_dict())

    # ------------------------------------------------------------------ handlers

    def _handle(self, context: grpc.ServicerContext, handler, request):
        try:
            # One session, strictly serialised: a game steps one request at a time.
            with self._lock:
                return handler(request)
        except _Abort as exc:
            context.abort(exc.code, exc.message)
        except Exception as exc:  # the game reports internal failures as INTERNAL
            log.exception("mock-ue handler failed")
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _native_call(self, method: str, data: bytes) -> bytes:
        """What uerl_native.Server calls per request: the same handlers as gRPC Python's."""
        if method == HEALTH_CHECK:
            status = health_pb2.HealthCheckResponse.SERVING
            return health_pb2.HealthCheckResponse(status=status).SerializeToString()
        service, _, name = method.rpartition("/")
        entry = self._native_methods.get(name) if service == f"/{SERVICE_NAME}" else None
        if entry is None:
            raise _NativeStatus(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method}")
        kind, handler = entry
        try:
            request = kind.FromString(data)
        except Exception as exc:
            raise _NativeStatus(grpc.StatusCode.INVALID_ARGUMENT, f"request: {exc}") from None
        try:
            with self._lock:
                reply = handler(request)
        except _Abort as exc:
            raise _NativeStatus(exc.code, exc.message) from None
        except Exception as exc:
            log.exception("mock-ue handler failed")
            raise _NativeStatus(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}") from None
        return _serialize_state(reply)

    @property
    def _native_methods(self) -> dict[str, tuple[Any, Callable[[Any], Any]]]:
        return {
            "StartGymConnector": (pb.GymConnectorStartRequest, self._start),
            "RequestTrainingDefinition": (pb.TrainingDefinitionRequest, self._definition),
            "UpdateState": (pb.StateUpdate, self._update),
        }

    def _build_definition(self) -> pb.TrainingDefinition:
        msg = pb.TrainingDefinition()
        env_def = pb.EnvironmentDefinition()
        envs, _ = self.scenario.make_environment()
        for slot in self.scenario.slots:
            env = envs[slot.agent_id]
            agent = env_def.agent_definitions[slot.agent_id]
            codec.space_to_proto(env.observation_space, agent.obs_space)
            codec.space_to_proto(env.action_space, agent.action_space)
            agent.agent_type = slot.agent_type
            env.close()
        for _ in range(self.num_envs):
            msg.environment_definitions.add().CopyFrom(env_def)
        return msg

    def _start(self, request: pb.GymConnectorStartRequest) -> pb.GymConnectorStartResponse:
        if self._session is not None:
            # The previous client vanished without CLOSED (e.g. a crashed env runner).
            self._session.close()
            self._stats.sessions_superseded += 1
        self._session = _Session(self.scenario, self.num_envs, request.autoreset_type)
        self._stats.sessions_opened += 1
        return pb.GymConnectorStartResponse()

    def _definition(self, _request: pb.TrainingDefinitionRequest) -> pb.TrainingDefinition:
        return self._definition_msg

    def _update(self, request: pb.StateUpdate) -> pb.State | bytes:
        kind = request.WhichOneof("update")
        if kind is None and request.status == pb.CLOSED:
            if self._session is not None:
                self._session.close()
                self._session = None
                self._stats.sessions_closed += 1
            return pb.State()
        session = self._session
        if session is None:
            raise _Abort(
                grpc.StatusCode.FAILED_PRECONDITION, "no session: call StartGymConnector first"
            )
        if kind == "reset":
            state = pb.State()
            state.initial_state.SetInParent()
            session.reset(request.reset, state.initial_state)
            self._stats.resets += 1
        elif kind == "step":
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            ended = session.episodes_ended
            reply, env_steps = session.step(request.step)
            self._stats.env_steps += env_steps
            self._stats.episodes_ended += session.episodes_ended - ended
            self._stats.steps += 1
            if self.on_reply is None:
                return reply  # already wire bytes: the hot path skips message objects
            state = pb.State.FromString(reply)
        else:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"StateUpdate with neither reset nor step (status={request.status})",
            )
        if self.on_reply is not None:
            self.on_reply(request, state)
        return state


def _check_port_free(host: str, port: int) -> None:
    """OSError naming the address if something listens there. gRPC Python binds with
    SO_REUSEPORT (a second server would share the port with a live game, or fail with a
    C-core log line and no reason): a plain bind says it plainly first."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot bind {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise OSError(f"cannot bind {host}:{port}: {exc.strerror}") from None
