"""Why no gRPC connection could be made to a game: asked once a connection has failed,
so the error says what is at the endpoint instead of only that nothing answered."""

from __future__ import annotations

import socket

from training.tls.handshake import serves_tls, split_endpoint

# An HTTP/2 client's first bytes (RFC 9113 3.4) and an empty SETTINGS frame.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# The frame type an HTTP/2 server's first frame has (its SETTINGS).
SETTINGS = 0x04


def why_unreachable(endpoint: str, *, timeout_s: float = 0.5, tls_timeout_s: float = 2.0) -> str:
    """One phrase: the name does not resolve, nothing listens, a TLS or HTTP/1 server
    answers, or (none of those) no gRPC connection could be made. Takes at most about
    `timeout_s` and then `tls_timeout_s` for the TLS handshake: a TLS server, loaded,
    may take longer to drop a plaintext preface than to answer a handshake."""
    try:
        host, port = split_endpoint(endpoint)
    except ValueError as exc:
        return str(exc)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"the name {host!r} does not resolve: {exc.strerror}"
    reply: bytes | None
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(HTTP2_PREFACE)
            reply = sock.recv(16)
    except ConnectionRefusedError:
        return "nothing listens there (connection refused)"
    except TimeoutError:  # accepts TCP and says nothing yet: starting, hung, or TLS
        reply = None
    except OSError:
        reply = b""
    if reply is not None and reply.startswith((b"HTTP/1", b"<")):  # an error page, too
        return "an HTTP/1 server answers there (a web server?), not a gRPC game"
    if serves_tls(endpoint, timeout_s=tls_timeout_s):
        return "it serves TLS and this client connects without: give it the game's CA"
    if reply and not (len(reply) >= 4 and reply[3] == SETTINGS):
        return "something that does not speak HTTP/2 answers there, not a gRPC game"
    return "no gRPC connection could be made"
