"""A TLS handshake with a game before gRPC connects, so that what gRPC would only
retry until its deadline (a CA that did not sign the game's certificate, an expired
certificate, a name the certificate does not hold, a game that answers in plaintext,
a client certificate the game refuses) fails at once with one line naming the
endpoint. A game that is not listening yet is waited for, as gRPC would."""

from __future__ import annotations

import socket
import ssl
import time
from datetime import UTC, datetime

from training.protocol.errors import UETLSError
from training.tls.config import ALPN_PROTOCOLS, TLSConfig

RETRY_S = 0.2
# After the handshake, how long to wait for the game's first bytes (its HTTP/2
# SETTINGS): under TLS 1.3 a server checks the client's certificate after the client
# has finished its handshake, and one that refuses it just closes the connection.
FIRST_READ_S = 1.0
# Closed right after the handshake this many times in a row: refused, not restarting
# (a restarting game refuses the TCP connection instead).
CLOSED_AFTER_HANDSHAKE_LIMIT = 3
# OpenSSL's reasons for a peer that does not speak TLS at all.
_PLAINTEXT_REASONS = (
    "WRONG_VERSION_NUMBER",
    "RECORD_LAYER_FAILURE",
    "HTTP_REQUEST",
    "PACKET_LENGTH",
)
# Alerts a server sends when it refuses (or wanted) our client certificate.
_CLIENT_CERT_REASONS = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_EXPIRED",
    "HANDSHAKE_FAILURE",
)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT`; a ValueError naming the endpoint otherwise."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"endpoint {endpoint!r}: port {port} is not from 1 to 65535")
    return host.strip("[]"), int(port)


def check_handshake(endpoint: str, tls: TLSConfig, *, timeout_s: float) -> None:
    """Return once a TLS session with `endpoint` is established and kept, or when
    `timeout_s` passes with nothing listening (gRPC then reports that). Raise
    UETLSError when the game answers but TLS cannot work."""
    host, port = split_endpoint(endpoint)
    context = tls.ssl_context()
    deadline = time.monotonic() + timeout_s
    closed = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 5.0)) as sock:
                if _handshake(context, sock, host, port, endpoint, tls):
                    return
            closed += 1
            if closed >= CLOSED_AFTER_HANDSHAKE_LIMIT:
                raise UETLSError(endpoint, _closed_after_handshake(tls))
            time.sleep(min(RETRY_S, max(deadline - time.monotonic(), 0)))
        except OSError:
            # Refused, reset or closed mid-handshake, name not resolvable yet: the game
            # is starting or restarting. Wait, like gRPC would.
            time.sleep(min(RETRY_S, max(deadline - time.monotonic(), 0)))


def serves_tls(endpoint: str, *, timeout_s: float = 0.5) -> bool:
    """Whether `endpoint` completes a TLS handshake (its certificate unchecked): why a
    plaintext client gets no connection."""
    try:
        host, port = split_endpoint(endpoint)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(ALPN_PROTOCOLS)
        with (
            socket.create_connection((host, port), timeout=timeout_s) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):
        return False


def _closed_after_handshake(tls: TLSConfig) -> str:
    if tls.mutual:
        return (
            f"refused our client certificate {tls.cert_path} (it closes the connection "
            "right after the TLS handshake: is the certificate signed by the CA the "
            "game trusts, and still valid?)"
        )
    return (
        "closes the connection right after the TLS handshake: it requires a client "
        "certificate (mutual TLS), and none was given"
    )


def _handshake(
    context: ssl.SSLContext,
    sock: socket.socket,
    host: str,
    port: int,
    endpoint: str,
    tls: TLSConfig,
) -> bool:
    """True: a TLS session is up and the game kept it; False: it closed it at once."""
    try:
        with context.wrap_socket(sock, server_hostname=host) as tls_sock:
            tls_sock.settimeout(FIRST_READ_S)
            try:
                return tls_sock.recv(1) != b""
            except TimeoutError:
                return True  # nothing sent yet, nothing refused either
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError):
                return False
    except ssl.SSLCertVerificationError as exc:
        raise UETLSError(endpoint, _verify_failure(exc, host, port, tls)) from None
    except ssl.SSLError as exc:
        if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError):
            raise  # the connection went away: transient
        reason = (exc.reason or str(exc)).upper()
        if any(r in reason for r in _PLAINTEXT_REASONS):
            raise UETLSError(
                endpoint,
                "answered without TLS (a plaintext game: give it the topology's "
                "simulator.tls, or connect without TLS)",
            ) from None
        if any(r in reason for r in _CLIENT_CERT_REASONS):
            which = (
                f"our client certificate {tls.cert_path}"
                if tls.mutual
                else "the connection: it requires a client certificate (mutual TLS)"
            )
            raise UETLSError(endpoint, f"refused {which} ({exc.reason})") from None
        raise UETLSError(endpoint, f"failed the TLS handshake: {exc.reason or exc}") from None


def _verify_failure(exc: ssl.SSLCertVerificationError, host: str, port: int, tls: TLSConfig) -> str:
    message = exc.verify_message or str(exc)
    trusted = f"the CA in {tls.ca_path}" if tls.ca_path else "the system's CAs"
    if exc.verify_code == 10:  # X509_V_ERR_CERT_HAS_EXPIRED
        return f"presented an expired certificate ({_expiry(host, port)})"
    if exc.verify_code == 9:  # X509_V_ERR_CERT_NOT_YET_VALID
        return "presented a certificate that is not valid yet (check the clocks)"
    if exc.verify_code in (2, 18, 19, 20, 21):  # issuer unknown / self-signed
        return f"presented a certificate {trusted} did not sign ({message})"
    if "mismatch" in message.lower() or exc.verify_code == 62:
        return f"presented a certificate that does not name {host!r} ({message})"
    return f"presented a certificate that failed verification against {trusted} ({message})"


def _expiry(host: str, port: int) -> str:
    """When the game's certificate expired, read without verifying it (for the message)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=5.0) as sock,
            context.wrap_socket(sock, server_hostname=host) as tls_sock,
        ):
            der = tls_sock.getpeercert(binary_form=True)
        from cryptography import x509

        not_after = x509.load_der_x509_certificate(der).not_valid_after_utc
    except Exception:  # only the message's detail is lost
        return "certificate has expired"
    ago = datetime.now(UTC) - not_after
    when = f"{not_after:%Y-%m-%d %H:%M:%S} UTC"
    return f"not valid after {when}, {_duration(ago.total_seconds())} ago"


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 7200:
        return f"{seconds / 3600:.0f} hours"
    return f"{max(seconds, 0) / 60:.0f} minutes"
