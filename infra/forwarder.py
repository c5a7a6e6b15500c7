"""A TCP forwarder: serves a port on every interface and relays each connection to
one upstream address (a game bound to 127.0.0.1 in the same pod).

Networked pattern: a stock Schola build listens on loopback only, so a pod's
Service/DNS name cannot reach it; this runs next to it and serves the
topology's port on the pod IP. Standard library only: the pod runs this file's
source with `python -c` in any Python 3.8+ image, no uerl image needed.

    python forwarder.py LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT
"""

import asyncio
import contextlib
import signal
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


async def _relay(client_reader, client_writer, host, port):
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        # The game is not listening (yet): refuse like it would.
        client_writer.close()
        return
    try:
        await asyncio.gather(_pipe(client_reader, up_writer), _pipe(up_reader, client_writer))
    finally:
        for writer in (up_writer, client_writer):
            writer.close()


async def serve(listen_port, host, port, ready=None, listen_host=None):
    """Serve until cancelled; `ready(bound_port)` is called once listening.

    `listen_host` None: every interface, IPv4 and IPv6 (the pod IP of either)."""
    server = await asyncio.start_server(
        lambda r, w: _relay(r, w, host, port),
        host=listen_host,
        port=listen_port,
        reuse_address=True,
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"forwarding :{bound} -> {host}:{port}", flush=True)
    if ready is not None:
        ready(bound)
    async with server:
        await server.serve_forever()


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    listen_port, host, port = int(argv[0]), argv[1], int(argv[2])
    loop = asyncio.new_event_loop()
    task = loop.create_task(serve(listen_port, host, port))
    # SIGTERM (pod deletion) stops at once: connections die with the game anyway.
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        loop.run_until_complete(task)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
