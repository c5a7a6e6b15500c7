"""A TCP forwarder: serves a port on every interface and relays each connection to
one upstream address (a game bound to 127.0.0.1 in the same pod).

Networked pattern: a stock Schola build listens on loopback only, so a pod's
Service/DNS name cannot reach it; this runs next to it and serves the
topology's port on the pod IP. Standard library only: the pod runs this file's
source with `python -c` in any Python 3.8+ image (3.11+ for TLS), no uerl image needed.

With `--tls-cert/--tls-key` it terminates TLS (the topology's `simulator.tls`) in
front of the plaintext game, and with `--tls-client-ca` it also requires a client
certificate that CA signed (mutual TLS). The game connection is opened only after a
client's handshake, which has a deadline: a client that never finishes one holds no
game connection. A client that reaches a game not listening yet (read from the pod's
/proc/net/tcp) sees the connection closed before TLS, as it would by the game itself.
At most MAX_CONNECTIONS are relayed at once; a failed accept (out of file descriptors)
is logged and retried, not the end of the forwarder.

    python forwarder.py LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT \
        [--tls-cert F --tls-key F [--tls-client-ca F]]
"""

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import socket
import ssl
import sys

CHUNK = 1 << 16
# Connections relayed (or in their handshake) at once, at most; more are closed at once.
# A game serves one env runner, plus discovery, reconnects and rescale probes now and then:
# a few. Hundreds at once are a flood or a leak, and each holds two sockets (and a game
# connection): the cap keeps the forwarder, and the game behind it, within their files.
MAX_CONNECTIONS = 64
# After a failed accept (EMFILE: out of file descriptors), wait this long before the next.
ACCEPT_RETRY_S = 0.5
# /proc/net/tcp's state of a listening socket.
TCP_LISTEN = "0A"


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


# A client that neither finishes its handshake nor leaves must not hold a relay long. A
# gRPC client's handshake takes milliseconds, on a loaded node well under a second.
HANDSHAKE_TIMEOUT_S = 10.0


def _listening(host, port):
    """Whether something listens on `port` in this network namespace (the pod's), read
    from /proc/net/tcp{,6} without connecting; None where that cannot be read (not Linux)
    or `host` is not this machine's loopback."""
    try:
        if not ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a name
        return None
    read_any = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]  # after the header
        except OSError:
            continue
        read_any = True
        for row in rows:
            fields = row.split()  # sl, local address (hex IP:hex port), remote, state, ...
            listens = len(fields) > 3 and fields[3] == TCP_LISTEN
            if listens and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False if read_any else None


async def _relay(client, host, port, tls=None):
    """Relay one accepted socket. With TLS, the handshake comes first, on the raw socket
    (no plaintext transport is upgraded in place: asyncio's `start_tls` on a paused server
    transport never finished a handshake under Debian 12's Python 3.11.2, the images'
    Python), and the game connection only after it."""
    loop = asyncio.get_running_loop()
    if tls is None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            # The game is not listening (yet): refuse like it would.
            client.close()
            return
    elif _listening(host, port) is False:
        client.close()  # as the game would, before TLS: a client waits as for a game starting
        return
    reader = asyncio.StreamReader(limit=CHUNK, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    try:
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol,
            client,
            ssl=tls,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls is not None else None,
        )
    except (OSError, ssl.SSLError):  # TimeoutError is an OSError (3.11+, as TLS here)
        # A plaintext client, an untrusted client certificate, a client gone or too slow.
        client.close()
        if tls is None:
            up_writer.close()
        return
    client_writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    if tls is not None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:  # the game went between the check and now
            client_writer.close()
            return
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, client_writer))
    finally:
        for writer in (up_writer, client_writer):
            writer.close()


def _listeners(listen_host, listen_port):
    """`listen_host` None: every interface, IPv6 and IPv4 on one socket where the
    kernel has IPv6 (a pod IP of either family), IPv4 alone where it does not."""
    if listen_host is not None:
        return [socket.create_server((listen_host, listen_port))]
    if socket.has_dualstack_ipv6():
        return [
            socket.create_server(("", listen_port), family=socket.AF_INET6, dualstack_ipv6=True)
        ]
    return [socket.create_server(("", listen_port))]


async def _accept(listener, host, port, tls, relays):
    loop = asyncio.get_running_loop()
    failing = False
    full = False
    while True:
        try:
            client, _ = await loop.sock_accept(listener)
        except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: the next may work
            if not failing:
                _warn(f"accepting a connection failed ({exc}); retrying every {ACCEPT_RETRY_S} s")
            failing = True
            await asyncio.sleep(ACCEPT_RETRY_S)
            continue
        if failing:
            _warn("accepting connections again")
            failing = False
        if len(relays) >= MAX_CONNECTIONS:
            client.close()
            if not full:
                _warn(f"{MAX_CONNECTIONS} connections already relayed; closing new ones")
            full = True
            continue
        full = False
        relay = loop.create_task(_relay(client, host, port, tls))
        relays.add(relay)  # a strong reference until it ends
        relay.add_done_callback(relays.discard)


def _warn(message):
    print(f"forwarder: {message}", file=sys.stderr, flush=True)


async def serve(listen_port, host, port, ready=None, listen_host=None, tls=None):
    """Serve until cancelled; `ready(bound_port)` is called once listening.

    `listen_host` None: every interface, IPv4 and IPv6 (the pod IP of either).
    `tls`: an `ssl.SSLContext` (`tls_context`) to serve TLS with."""
    listeners = _listeners(listen_host, listen_port)
    relays = set()
    try:
        for listener in listeners:
            listener.setblocking(False)
        bound = listeners[0].getsockname()[1]
        print(f"forwarding :{bound}{' (TLS)' if tls else ''} -> {host}:{port}", flush=True)
        if ready is not None:
            ready(bound)
        await asyncio.gather(*(_accept(lst, host, port, tls, relays) for lst in listeners))
    finally:
        for listener in listeners:
            listener.close()
        for relay in list(relays):
            relay.cancel()


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
