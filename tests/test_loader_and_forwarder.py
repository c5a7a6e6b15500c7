"""The scripts the pods run, run for real here: the build loader (sh, unzip) and
the game-port forwarder (TCP on 127.0.0.1)."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
from forwarder_thread import start_forwarder
from infra_fixtures import dev_topology

from infra import forwarder, manifests
from infra.manifests.pod_security import UNREAL_UID
from infra.manifests.volume import READY_MARKER

# -- loader: a build zipped on Windows comes out runnable ----------------------------------


def windows_zip(path: Path, names: list[str]) -> None:
    """A zip as Windows tools write it: MS-DOS attributes, no Unix mode bits."""
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            info = zipfile.ZipInfo(name)
            info.create_system = 0
            info.external_attr = 0
            archive.writestr(info, "#!/bin/sh\necho hi\n" if name.endswith(".sh") else "data")


def run_loader(tmp_path: Path, archive: Path, user: int | None = None) -> Path:
    """The loader Job's script on `archive`, as `user` (default: this process's)."""
    dest = tmp_path / "ue"
    dest.mkdir(exist_ok=True)
    topology = dev_topology(
        "topology.simulator.kind=unreal",
        "topology.simulator.executable=Game.sh",
        f"topology.executables.mount_path={dest}",
        "topology.executables.source_url=https://example.com/builds/game.zip",
    )
    job = manifests.build(topology).loader_job
    assert job is not None
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    # A `wget` that "downloads" the local archive: everything else is the pod's script.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "wget"
    fake.write_text(f'#!/bin/sh\nwhile [ "$1" != "-O" ]; do shift; done\ncp {archive} "$2"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    # From `/`, as in a container without a WORKDIR: the clone's own directory may be one
    # `user` cannot enter (a `mktemp -d` is 0700), and `find` fails where it cannot return.
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, umask=0o022, user=user, group=user,
        cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return dest


def test_loader_restores_execute_bits_a_windows_zip_lost(tmp_path: Path) -> None:
    archive = tmp_path / "game.zip"
    windows_zip(
        archive,
        [
            "Game.sh",
            "Game/Binaries/Linux/Game",
            "Engine/Binaries/Linux/CrashReportClient",
            "Game/Content/Paks/Game.pak",
        ],
    )
    dest = run_loader(tmp_path, archive)

    def mode(name: str) -> int:
        return stat.S_IMODE((dest / name).stat().st_mode)

    for runnable in (
        "Game.sh",
        "Game/Binaries/Linux/Game",
        "Engine/Binaries/Linux/CrashReportClient",
    ):
        assert mode(runnable) & 0o111 == 0o111, runnable
    pak = mode("Game/Content/Paks/Game.pak")
    assert pak & 0o444 == 0o444 and pak & 0o111 == 0  # readable by the game's user, not executable
    assert (dest / READY_MARKER).read_text() == "https://example.com/builds/game.zip"


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a volume root owned by another user")
def test_loader_unpacks_into_a_volume_whose_root_it_does_not_own(tmp_path: Path) -> None:
    """As on real storage: the volume's root belongs to root (world-writable here), the
    loader runs as the game's user and may change only what it unpacked (seen on the real
    node: `chmod -R` of the root failed the Job)."""
    shared = Path(tempfile.mkdtemp(prefix="uerl-loader-"))  # reachable by another uid
    try:
        shared.chmod(0o755)
        archive = shared / "game.zip"
        windows_zip(archive, ["Game.sh", "Game/Binaries/Linux/Game"])
        (shared / "ue").mkdir(mode=0o777)
        (shared / "ue").chmod(0o777)
        dest = run_loader(shared, archive, user=UNREAL_UID)
        assert (dest / "Game.sh").stat().st_uid == UNREAL_UID
        assert os.access(dest / "Game/Binaries/Linux/Game", os.X_OK)
        assert (dest / READY_MARKER).is_file()
    finally:
        shutil.rmtree(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes root-owned files for another user")
def test_loader_leaves_alone_what_it_does_not_own_such_as_lost_and_found(tmp_path: Path) -> None:
    """An ext4 volume (an NFS export often) has a root-owned lost+found the loader, running
    as the game's user, can neither chmod nor enter: before, `find` exited 1 under
    `set -eu` and the Job (and `pulumi up`) failed."""
    shared = Path(tempfile.mkdtemp(prefix="uerl-loader-"))  # reachable by another uid
    try:
        shared.chmod(0o755)
        archive = shared / "game.zip"
        windows_zip(archive, ["Game.sh", "Game/Binaries/Linux/Game"])
        (shared / "ue").mkdir()
        (shared / "ue").chmod(0o777)
        lost = shared / "ue" / "lost+found"
        lost.mkdir(mode=0o700)
        (lost / "#1234").write_text("a fragment fsck found")
        (shared / "ue" / "notes.txt").write_text("copied in by hand, as root")
        (shared / "ue" / "notes.txt").chmod(0o600)
        dest = run_loader(shared, archive, user=UNREAL_UID)  # asserts exit status 0
        assert os.access(dest / "Game/Binaries/Linux/Game", os.X_OK)
        assert stat.S_IMODE(lost.stat().st_mode) == 0o700
        assert stat.S_IMODE((dest / "notes.txt").stat().st_mode) == 0o600
        assert (dest / READY_MARKER).is_file()
    finally:
        shutil.rmtree(shared)


# -- forwarder: a loopback-bound game served on another port ---------------------------------


class Upstream:
    """A tiny game stand-in on 127.0.0.1: echoes each message back upper-cased."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data.upper())


def test_forwarder_relays_bytes_both_ways_to_the_loopback_game() -> None:
    game = Upstream()
    port, loop, task = start_forwarder(game.port)
    try:
        payload = os.urandom(200_000).hex().encode()  # several chunks each way
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := client.recv(65536):
                received += chunk
        assert received == payload.upper()
    finally:
        loop.call_soon_threadsafe(task.cancel)
        game.sock.close()


def test_forwarder_refuses_connections_while_the_game_is_not_listening() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    port, loop, task = start_forwarder(dead_port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            # Closed at once, as the game itself would refuse: EOF, or a reset
            # when the close finds unread bytes.
            try:
                client.sendall(b"hello")
                closed = client.recv(10) == b""
            except ConnectionResetError:
                closed = True
            assert closed
    finally:
        loop.call_soon_threadsafe(task.cancel)


def test_forwarder_runs_as_python_c_with_port_arguments_like_the_pod() -> None:
    game = Upstream()
    probe = socket.create_server(("127.0.0.1", 0))
    listen_port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            Path(forwarder.__file__).read_text(),
            str(listen_port),
            "127.0.0.1",
            str(game.port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(f"forwarding :{listen_port}")
        with socket.create_connection(("127.0.0.1", listen_port), timeout=10) as client:
            client.sendall(b"ping")
            assert client.recv(4) == b"PING"
        proc.terminate()  # SIGTERM, as on pod deletion
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        game.sock.close()


def test_forwarder_survives_a_failed_accept_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: an OSError from accept (EMFILE: out of file descriptors) ended the forwarder.
    import asyncio.selector_events as selector_events

    real_accept = selector_events.BaseSelectorEventLoop.sock_accept
    failures = [OSError(errno.EMFILE, "Too many open files")] * 3

    async def sock_accept(self: Any, sock: socket.socket) -> Any:
        if failures:
            raise failures.pop()
        return await real_accept(self, sock)

    monkeypatch.setattr(selector_events.BaseSelectorEventLoop, "sock_accept", sock_accept)
    monkeypatch.setattr(forwarder, "ACCEPT_RETRY_S", 0.05)
    game = Upstream()
    port, loop, task = start_forwarder(game.port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"ping")
            assert client.recv(4) == b"PING"
        err = capsys.readouterr().err
        assert "forwarder: accepting a connection failed ([Errno 24] Too many open files)" in err
        assert "forwarder: accepting connections again" in err
        assert err.count("accepting a connection failed") == 1  # one line per streak
    finally:
        loop.call_soon_threadsafe(task.cancel)
        game.sock.close()
