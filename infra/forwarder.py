"""A TCP forwarder: serves a port on every interface and relays each connection to
one upstream address (a game bound to 127.0.0.1 in the same pod).

Networked pattern: a stock Schola build listens on loopback only, so a pod's
Service/DNS name cannot reach it; this runs next to it and serves the
topology's port on the pod IP. Standard library only: the pod runs this file's
source with `python -c` in any Python 3.8+ image (3.11+ for TLS), no uerl image needed.

With `--tls-cert/--tls-key` it terminates TLS (the topology's `simulator.tls`) in
front of the plaintext game, and with `--tls-client-ca` it also requires a client
certificate that CA signed (mutual TLS). The handshake starts only once the game
accepted the upstream connection, so a client that reaches a game not listening
yet sees the connection closed before TLS, as it would by the game itself.

    python forwarder.py LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT \
        [--tls-cert F --tls-key F [--tls-client-ca F]]
"""

import argparse
import asyncio
import contextlib
import signal
import ssl
import sys

CHUNK = 1 << 16


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        # Half-close: the peer sees EOF and finishes its side (HTTP/2 GOAWAY).
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass


def tls_context(cert, key, client_ca=None):
    """Server side of TLS for gRPC clients: HTTP/2 offered with ALPN (gRPC needs it)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class _TLSAfterUpstream(asyncio.StreamReaderProtocol):
    """Reads nothing until TLS starts: a ClientHello read as plaintext while the
    upstream connection is being made would be lost to the handshake."""

    def connection_made(self, transport):
        transport.pause_reading()  # start_tls resumes it under TLS
        super().connection_made(transport)


async def _relay(client_reader, client_writer, host, port, tls=None):
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        # The game is not listening (yet): refuse like it would.
        client_writer.close()
        return
    if tls is not None:
        try:
            await client_writer.start_tls(tls)
        except (OSError, ssl.SSLError):
            # A plaintext client, an untrusted client certificate, a client gone.
            for writer in (up_writer, client_writer):
                writer.close()
            return
    try:
        await asyncio.gather(_pipe(client_reader, up_writer), _pipe(up_reader, client_writer))
    finally:
        for writer in (up_writer, client_writer):
            writer.close()


async def serve(listen_port, host, port, ready=None, listen_host=None, tls=None):
    """Serve until cancelled; `ready(bound_port)` is called once listening.

    `listen_host` None: every interface, IPv4 and IPv6 (the pod IP of either).
    `tls`: an `ssl.SSLContext` (`tls_context`) to serve TLS with."""
    loop = asyncio.get_running_loop()

    def connection():
        protocol = _TLSAfterUpstream if tls is not None else asyncio.StreamReaderProtocol
        reader = asyncio.StreamReader(limit=CHUNK, loop=loop)
        return protocol(reader, lambda r, w: _relay(r, w, host, port, tls), loop=loop)

    server = await loop.create_server(
        connection, host=listen_host, port=listen_port, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"forwarding :{bound}{' (TLS)' if tls else ''} -> {host}:{port}", flush=True)
    if ready is not None:
        ready(bound)
    async with server:
        await server.serve_forever()


def main(argv):
    parser = argparse.ArgumentParser(prog="forwarder", description=__doc__.split("\n\n")[0])
    parser.add_argument("listen_port", type=int)
    parser.add_argument("upstream_host")
    parser.add_argument("upstream_port", type=int)
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--tls-client-ca")
    args = parser.parse_args(argv)
    tls = None
    if args.tls_cert or args.tls_key or args.tls_client_ca:
        if not (args.tls_cert and args.tls_key):
            parser.error("--tls-cert and --tls-key go together (and --tls-client-ca needs them)")
        try:
            tls = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            print(f"forwarder: cannot load the TLS files: {exc}", file=sys.stderr)
            return 1
    listen_port, host, port = args.listen_port, args.upstream_host, args.upstream_port
    loop = asyncio.new_event_loop()
    task = loop.create_task(serve(listen_port, host, port, tls=tls))
    # SIGTERM (pod deletion) stops at once: connections die with the game anyway.
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        loop.run_until_complete(task)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
