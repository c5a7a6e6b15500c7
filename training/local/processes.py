"""Process-tree bookkeeping for the things `uerl local` starts.

Every subprocess is started in its own session (so a terminal Ctrl-C reaches
only our CLI, which then stops things in order) with a parent-death signal (so
they die with us even if we are SIGKILLed). Stopping is always by pid:
SIGTERM to the leader, a bounded wait, then SIGKILL to every process of the
tree we saw, never a match on process names.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

from training.run.stop import release_signals, signals_held

_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    # Runs in the child between fork and exec: the signals spawn held, released; and a
    # parent-death signal, which fires when the thread that forked exits.
    release_signals()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(
    argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session, stdout+stderr to `log_path`. The signals are held
    while it forks (training.run.stop.signals_held); hold them around the call too, until
    the child is recorded where a stop finds it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log, signals_held():
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_child_setup,
        )


def tree(pid: int) -> set[int]:
    """`pid` and all its live descendants (empty if it is gone)."""
    try:
        proc = psutil.Process(pid)
        return {pid, *(child.pid for child in proc.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def session_members(sid: int) -> set[int]:
    """Live processes whose session id is `sid` (our children were each given one).

    Catches grandchildren that were re-parented to init after their parent died.
    """
    members = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == sid:
                members.add(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def title_contains(pid: int, text: str) -> bool:
    """Whether process `pid`'s command line (its title, if it set one) contains `text`."""
    try:
        return text in " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def alive(pids: Iterable[int]) -> set[int]:
    """The subset of `pids` still running (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


def terminate(procs: Sequence[subprocess.Popen[bytes]], *, grace_s: float) -> set[int]:
    """Stop each process and its whole tree; return pids that survived SIGKILL.

    SIGTERM goes to the leaders only (a `ray start --block` leader stops its
    own children in order); after `grace_s` everything left is SIGKILLed.
    """
    seen: set[int] = set()
    for proc in procs:
        seen |= tree(proc.pid) | session_members(proc.pid)
    _signal_all((p.pid for p in procs if p.poll() is None), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for proc in procs:
            # Keep learning about descendants that appeared during shutdown.
            seen |= tree(proc.pid)
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.1)
    for proc in procs:
        seen |= tree(proc.pid) | session_members(proc.pid)
    # Children of a leader that exited get a short grace of their own, then KILL.
    deadline = time.monotonic() + min(grace_s, 5.0)
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_all(alive(seen), signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    deadline = time.monotonic() + 5.0
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(seen)


# Ports `free_port` has given out: it never gives one twice.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free on every address now, outside the kernel's ephemeral range, and
    never the same twice in this process. Outside the range because the server binds
    it later: Ray's client server binds its port on 127.0.0.1 as well as the node IP
    seconds after `ray start`, and an outgoing loopback connection once took it first
    (the head then stopped)."""
    low, high = game_port_range(1)
    for _ in range(200):
        port = free_port_block(1, low=low, high=high)
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free TCP port left in {low}..{high - 1}")


def port_is_free(port: int, host: str = "") -> bool:
    """Whether a server could listen on `port` now. Servers (gRPC's, uerl's compiled one,
    Ray's) bind with SO_REUSEADDR, so a port whose only sockets are closing connections
    (TIME_WAIT, for a minute after a stopped game closed them) is free to them."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# The kernel gives outgoing connections (and `bind(port 0)`) local ports from this range.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
# Ports uerl picks for its servers (games, and the local cluster's GCS, client,
# dashboard and agent ports) start here: below are the usual ports of well-known
# services, Ray's default worker ports (10002-19999) and the ports Ray Client's proxy
# gives each driver's server (23000-23999).
GAME_PORT_LOW = 24000


def ephemeral_port_range(path: Path | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive); Linux's default if unreadable."""
    try:
        low, high = (int(v) for v in (path or EPHEMERAL_RANGE_FILE).read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL_RANGE
    return low, high


def game_port_range(count: int) -> tuple[int, int]:
    """Where `count` consecutive game ports may lie, [low, high): outside the ephemeral
    range, so that no outgoing connection takes a game's port while the game restarts.
    Below the range if `count` ports fit there, else above it."""
    eph_low, eph_high = ephemeral_port_range()
    for low, high in ((GAME_PORT_LOW, eph_low), (eph_high + 1, 65536)):
        if high - low >= count:
            return low, high
    raise RuntimeError(
        f"no room for {count} game port(s) outside the ephemeral port range "
        f"{eph_low}-{eph_high} ({EPHEMERAL_RANGE_FILE}) and above {GAME_PORT_LOW}"
    )


def free_port_block(count: int, *, low: int | None = None, high: int | None = None) -> int:
    """A base port `p` such that p .. p+count-1 are all free right now, within [low, high)
    (default: `game_port_range`, outside the kernel's ephemeral ports)."""
    if low is None or high is None:
        default_low, default_high = game_port_range(count)
        low = default_low if low is None else low
        high = default_high if high is None else high
    rng = int.from_bytes(os.urandom(4), "little")
    span = high - low - count + 1
    if span <= 0:
        raise RuntimeError(f"no block of {count} TCP ports fits in {low}..{high - 1}")
    for attempt in range(200):
        base = low + (rng + attempt * 7919) % span
        if all(port_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no block of {count} free TCP ports found in {low}..{high - 1}")


def log_end(path: Path) -> int:
    """Where the next line appended to `path` begins (0: no file yet)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_from(path: Path, offset: int) -> str:
    """`path`'s text from byte `offset` on: one start's lines in a log that a kept run dir
    (`--resume`) carries over from earlier starts ("" if it cannot be read)."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class StartedGroup(ABC):
    """A set of processes used as a context manager: a failed start stops what it began."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
