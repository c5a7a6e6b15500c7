"""TLS to the games, for real: the mock game and the forwarder serve it, the client
checks it, and every way it can fail is one line naming the endpoint, at once."""

from __future__ import annotations

import contextlib
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from forwarder_thread import start_forwarder, stop_forwarder
from host_speed import guard

from infra import forwarder
from infra.endpoints import Endpoints, GameTLS
from training.clients.game_client import GymClient
from training.preflight.discovery import DiscoveryError, discover_game
from training.protocol.errors import UEConnectionError, UETLSError
from training.tls import certificates
from training.tls.config import TLSConfig

MockFactory = Callable[..., Any]
# Far above what a refused handshake takes (milliseconds), far below a startup timeout.
FAST_S = 3.0
STARTUP_S = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, certificates.TLSFiles]:
    root = tmp_path_factory.mktemp("pki")
    hosts = ["127.0.0.1", "localhost"]
    return {
        "good": certificates.issue(root / "good", hosts),
        "other": certificates.issue(root / "other", hosts),
        "expired": certificates.issue(root / "expired", hosts, expired=True),
        "ip-only": certificates.issue(root / "ip-only", ["127.0.0.1"]),
    }


def serving(files: certificates.TLSFiles, *, client_ca: Path | None = None) -> dict[str, str]:
    out = {"tls_cert_path": str(files.cert), "tls_key_path": str(files.key)}
    if client_ca is not None:
        out["tls_client_ca_path"] = str(client_ca)
    return out


def trusting(
    files: certificates.TLSFiles, client: certificates.TLSFiles | None = None
) -> TLSConfig:
    if client is None:
        return TLSConfig(str(files.ca))
    return TLSConfig(str(files.ca), str(client.cert), str(client.key))


def connect(endpoint: str, tls: TLSConfig | None, startup_s: float = STARTUP_S) -> float:
    """Connect, reset, close; return how long connect took."""
    started = time.monotonic()
    with GymClient(endpoint, startup_timeout_s=startup_s, request_timeout_s=10, tls=tls) as client:
        client.connect()
        took = time.monotonic() - started
        client.reset({0: 0})
    return took


def refused(
    endpoint: str, tls: TLSConfig | None, startup_s: float = STARTUP_S
) -> tuple[str, float]:
    """The one-line error connecting gives, and how long it took."""
    started = time.monotonic()
    with pytest.raises(UEConnectionError) as info:
        connect(endpoint, tls, startup_s)
    message = str(info.value)
    assert "\n" not in message
    return message, time.monotonic() - started


def test_a_tls_game_slow_to_answer_a_plaintext_preface_is_still_said_to_serve_tls(pki) -> None:
    # As a loaded host's game does: it reads nothing for a second, then handshakes. The
    # plaintext client's own probe times out first; that is no reason to stop asking.
    import ssl

    from training.clients.unreachable import why_unreachable

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki["good"].cert), str(pki["good"].key))
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            listener.settimeout(0.2)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                time.sleep(1.0)
                with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        said = why_unreachable(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.3)
    finally:
        stop.set()
        thread.join(5)
        listener.close()
    assert said == "it serves TLS and this client connects without: give it the game's CA"


def test_a_session_over_tls_checks_the_game_against_the_ca(mock_ue: MockFactory, pki) -> None:
    server = mock_ue(**serving(pki["good"]))
    connect(server.address, trusting(pki["good"]))
    assert server.stats.sessions_opened == 1


def test_the_name_dialled_may_be_localhost_when_the_certificate_holds_it(
    mock_ue: MockFactory, pki
) -> None:
    server = mock_ue(**serving(pki["good"]))
    connect(f"localhost:{server.port}", trusting(pki["good"]))


def test_mutual_tls_session_presents_the_client_certificate(mock_ue: MockFactory, pki) -> None:
    server = mock_ue(**serving(pki["good"], client_ca=pki["good"].ca))
    connect(server.address, trusting(pki["good"], client=pki["good"]))
    assert server.stats.sessions_opened == 1


def test_a_plaintext_client_is_refused_and_told_the_game_serves_tls(
    mock_ue: MockFactory, pki
) -> None:
    server = mock_ue(**serving(pki["good"]))
    message, _ = refused(server.address, None, startup_s=1.0)
    assert message == (
        f"UE game at {server.address} did not answer StartGymConnector within 1 s "
        "(it serves TLS and this client connects without: give it the game's CA)"
    )
    assert server.stats.sessions_opened == 0


def test_the_wrong_ca_fails_at_once_naming_the_endpoint_and_the_ca(
    mock_ue: MockFactory, pki
) -> None:
    server = mock_ue(**serving(pki["good"]))
    message, took = refused(server.address, trusting(pki["other"]))
    assert took < FAST_S
    assert message == (
        f"UE game at {server.address} presented a certificate the CA in {pki['other'].ca} "
        "did not sign (unable to get local issuer certificate)"
    )


def test_an_expired_certificate_is_reported_as_expired_with_its_end(
    mock_ue: MockFactory, pki
) -> None:
    server = mock_ue(**serving(pki["expired"]))
    message, took = refused(server.address, trusting(pki["expired"]))
    assert took < FAST_S
    assert message.startswith(
        f"UE game at {server.address} presented an expired certificate (not valid after "
    )
    assert message.endswith(" UTC, 60 minutes ago)")


def test_a_certificate_without_the_dialled_name_is_reported(mock_ue: MockFactory, pki) -> None:
    server = mock_ue(**serving(pki["ip-only"]))
    endpoint = f"localhost:{server.port}"
    message, took = refused(endpoint, trusting(pki["ip-only"]))
    assert took < FAST_S
    assert message.startswith(
        f"UE game at {endpoint} presented a certificate that does not name 'localhost' ("
    )


def test_a_tls_client_dialling_a_plaintext_game_is_told_so(mock_ue: MockFactory, pki) -> None:
    server = mock_ue()
    message, took = refused(server.address, trusting(pki["good"]))
    assert took < FAST_S
    assert message == (
        f"UE game at {server.address} answered without TLS (a plaintext game: give it the "
        "topology's simulator.tls, or connect without TLS)"
    )


def test_mutual_tls_refuses_a_client_without_a_certificate(mock_ue: MockFactory, pki) -> None:
    server = mock_ue(**serving(pki["good"], client_ca=pki["good"].ca))
    message, took = refused(server.address, trusting(pki["good"]))
    assert took < FAST_S
    assert message == (
        f"UE game at {server.address} closes the connection right after the TLS handshake: "
        "it requires a client certificate (mutual TLS), and none was given"
    )
    assert server.stats.sessions_opened == 0


def test_mutual_tls_refuses_a_certificate_another_ca_signed(mock_ue: MockFactory, pki) -> None:
    server = mock_ue(**serving(pki["good"], client_ca=pki["good"].ca))
    message, took = refused(server.address, trusting(pki["good"], client=pki["other"]))
    assert took < FAST_S
    assert message.startswith(
        f"UE game at {server.address} refused our client certificate {pki['other'].cert} "
    )


def test_a_game_not_listening_yet_is_waited_for_not_called_a_tls_failure(
    mock_ue: MockFactory, pki
) -> None:
    probe = mock_ue()  # a free port, then nothing on it
    port = probe.port
    probe.stop(grace=0)
    message, took = refused(f"127.0.0.1:{port}", trusting(pki["good"]), startup_s=1.5)
    assert took >= 1.5
    assert "did not answer StartGymConnector within 1.5 s" in message


def test_tls_errors_keep_their_fields_when_ray_ships_them() -> None:
    error = UETLSError("game-1:50051", "presented an expired certificate (x)")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is UETLSError
    assert (copy.endpoint, str(copy)) == ("game-1:50051", str(error))


def test_an_unreadable_ca_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"
    with pytest.raises(ValueError, match=f"cannot read the TLS CA bundle {missing}"):
        TLSConfig(str(missing)).credentials()


def test_discovery_over_tls_with_the_wrong_ca_is_one_line_naming_the_game(
    mock_ue: MockFactory, pki
) -> None:
    server = mock_ue(**serving(pki["good"]))
    endpoints = Endpoints.model_validate(
        {
            "namespace": "t",
            "cluster_name": "t",
            "pattern": "networked",
            "ray": {"dashboard_url": "", "client_address": "ray://x:1", "gcs_address": "x:1"},
            "discovery_endpoint": server.address,
            "worker_url_template": "127.0.0.1",
            "port": server.port,
            "port_offset_mode": "fixed",
            "num_env_runners": 1,
            "num_learners": 0,
            "custom_resource": "ue_worker",
            "resources": {"cpus_per_learner": 1, "gpus_per_learner": 0, "cpus_per_env_runner": 1},
            "simulator_startup_timeout_s": STARTUP_S,
            "tls": GameTLS.in_directory(str(pki["other"].directory), mutual=False).model_dump(),
        }
    )
    started = time.monotonic()
    with pytest.raises(DiscoveryError) as info:
        discover_game(endpoints)
    assert time.monotonic() - started < FAST_S
    assert str(info.value) == (
        f"discovery against {server.address} (networked pattern) failed: UE game at "
        f"{server.address} presented a certificate the CA in {pki['other'].ca} did not sign "
        "(unable to get local issuer certificate)"
    )


# -- the forwarder terminates TLS in front of a plaintext game (networked pattern) -----------


def test_forwarder_terminates_tls_in_front_of_a_plaintext_game(mock_ue: MockFactory, pki) -> None:
    game = mock_ue()
    context = forwarder.tls_context(str(pki["good"].cert), str(pki["good"].key))
    port, loop, task = start_forwarder(game.port, tls=context)
    try:
        connect(f"127.0.0.1:{port}", trusting(pki["good"]))
        assert game.stats.sessions_opened == 1
    finally:
        stop_forwarder(loop, task)


def test_forwarder_with_mutual_tls_lets_only_certified_clients_through(
    mock_ue: MockFactory, pki
) -> None:
    game = mock_ue()
    files = pki["good"]
    context = forwarder.tls_context(str(files.cert), str(files.key), str(files.ca))
    port, loop, task = start_forwarder(game.port, tls=context)
    endpoint = f"127.0.0.1:{port}"
    try:
        message, took = refused(endpoint, trusting(files))
        assert took < FAST_S
        assert "it requires a client certificate (mutual TLS), and none was given" in message
        assert game.stats.sessions_opened == 0
        connect(endpoint, trusting(files, client=files))
        assert game.stats.sessions_opened == 1
    finally:
        stop_forwarder(loop, task)


def test_forwarder_refuses_a_plaintext_client(mock_ue: MockFactory, pki) -> None:
    game = mock_ue()
    context = forwarder.tls_context(str(pki["good"].cert), str(pki["good"].key))
    port, loop, task = start_forwarder(game.port, tls=context)
    try:
        message, _ = refused(f"127.0.0.1:{port}", None, startup_s=1.0)
        assert message.endswith(
            "(it serves TLS and this client connects without: give it the game's CA)"
        )
        assert game.stats.sessions_opened == 0
    finally:
        stop_forwarder(loop, task)


def test_forwarder_whose_game_is_down_looks_like_a_game_starting(mock_ue: MockFactory, pki) -> None:
    probe = mock_ue()
    dead_port = probe.port
    probe.stop(grace=0)
    context = forwarder.tls_context(str(pki["good"].cert), str(pki["good"].key))
    port, loop, task = start_forwarder(dead_port, tls=context)
    try:
        # Closed before TLS starts, as the game itself would refuse: waited for.
        message, took = refused(f"127.0.0.1:{port}", trusting(pki["good"]), startup_s=1.5)
        assert took >= 1.5
        assert "did not answer StartGymConnector within 1.5 s" in message
    finally:
        stop_forwarder(loop, task)


# -- `uerl tls-secret`: the Secret's three files for a stack ----------------------------------


def test_tls_secret_writes_a_chain_for_the_names_the_stacks_env_runners_dial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cryptography import x509

    from training.commands import tls_secret

    out = tmp_path / "secret"
    assert tls_secret.main(["--out", str(out), "--set", "topology.pattern=networked"]) == 0
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["*.uerl-ue.uerl.svc.cluster.local"]
    printed = capsys.readouterr().out
    assert (
        f"kubectl -n uerl create secret generic uerl-game-tls --from-file={out}/ca.crt "
        f"--from-file={out}/tls.crt --from-file={out}/tls.key"
    ) in printed
    # Never overwrites a key someone already has.
    key = (out / "tls.key").read_bytes()
    assert tls_secret.main(["--out", str(out)]) == 1
    assert (out / "tls.key").read_bytes() == key
    assert f"{out}/ca.crt exists; not overwriting it" in capsys.readouterr().err


# -- preflight checks the discovery game the way discovery will talk to it --------------------


def test_preflight_checks_a_tls_game_over_tls(mock_ue: MockFactory, pki) -> None:
    from training.preflight.checks import grpc_ready

    server = mock_ue(**serving(pki["good"], client_ca=pki["good"].ca))
    grpc_ready(
        server.address,
        timeout_s=5,
        what="discovery endpoint",
        tls=trusting(pki["good"], pki["good"]),
    )


def test_preflight_names_a_tls_failure_at_once(mock_ue: MockFactory, pki) -> None:
    from training.preflight.checks import PreflightError, grpc_ready

    server = mock_ue(**serving(pki["expired"]))
    started = time.monotonic()
    with pytest.raises(PreflightError) as info:
        grpc_ready(
            server.address, timeout_s=20, what="discovery endpoint", tls=trusting(pki["expired"])
        )
    assert time.monotonic() - started < FAST_S
    assert str(info.value).startswith(
        f"discovery endpoint: UE game at {server.address} presented an expired certificate"
    )


def test_preflight_says_when_a_game_serves_tls_the_endpoints_do_not_mention(
    mock_ue: MockFactory, pki
) -> None:
    from training.preflight.checks import PreflightError, grpc_ready

    server = mock_ue(**serving(pki["good"]))
    with pytest.raises(PreflightError) as info:
        grpc_ready(server.address, timeout_s=1, what="discovery endpoint")
    assert str(info.value) == (
        f"discovery endpoint {server.address} accepts TCP but no gRPC server answered within "
        "1s (it serves TLS: the endpoints object has no `tls` for it)"
    )


def test_uerl_discover_names_an_unreadable_ca_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.commands import discover

    missing = tmp_path / "ca.crt"
    assert discover.main(["127.0.0.1:1", "--tls-ca", str(missing), "--timeout", "2"]) == 2
    assert capsys.readouterr().err == (
        f"uerl discover: cannot read the TLS CA bundle {missing}: No such file or directory\n"
    )


def test_uerl_discover_speaks_tls_to_a_tls_game(
    mock_ue: MockFactory, pki, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.commands import discover

    server = mock_ue(**serving(pki["good"]))
    assert discover.main([server.address, "--tls-ca", str(pki["good"].ca), "--json"]) == 0
    assert '"agents"' in capsys.readouterr().out


class CountingGame:
    """A plaintext stand-in game on 127.0.0.1 that counts the connections it accepted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def counting_game() -> Iterator[CountingGame]:
    game = CountingGame()
    yield game
    game.close()


def _silent_client(port: int) -> socket.socket:
    """A client that connects and never starts its handshake."""
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_forwarder_opens_the_game_connection_only_after_the_handshake(
    counting_game: CountingGame, pki
) -> None:
    # Before: every client got a game connection at once, held through its handshake.
    context = forwarder.tls_context(str(pki["good"].cert), str(pki["good"].key))
    port, loop, task = start_forwarder(counting_game.port, tls=context)
    try:
        with _silent_client(port):
            time.sleep(0.3)
            assert counting_game.accepted == 0
        client = trusting(pki["good"]).ssl_context()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            deadline = time.monotonic() + guard(30)
            while counting_game.accepted == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert counting_game.accepted == 1
    finally:
        stop_forwarder(loop, task)


def test_forwarder_closes_a_client_that_does_not_finish_its_handshake_in_time(
    counting_game: CountingGame, pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forwarder, "HANDSHAKE_TIMEOUT_S", 0.3)
    context = forwarder.tls_context(str(pki["good"].cert), str(pki["good"].key))
    port, loop, task = start_forwarder(counting_game.port, tls=context)
    try:
        with _silent_client(port) as client:
            assert _closed_within(client, FAST_S)
    finally:
        stop_forwarder(loop, task)


def test_forwarder_relays_at_most_its_cap_at_once_and_says_so(
    counting_game: CountingGame, pki, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(forwarder, "MAX_CONNECTIONS", 2)
    context = forwarder.tls_context(str(pki["good"].cert), str(pki["good"].key))
    port, loop, task = start_forwarder(counting_game.port, tls=context)
    try:
        with _silent_client(port) as first, _silent_client(port) as second:
            time.sleep(0.2)  # both accepted, in their handshakes
            with _silent_client(port) as third:
                assert _closed_within(third, FAST_S)
            assert not _closed_within(first, 0.2) and not _closed_within(second, 0.2)
        assert "forwarder: 2 connections already relayed; closing new ones" in (
            capsys.readouterr().err
        )
    finally:
        stop_forwarder(loop, task)
