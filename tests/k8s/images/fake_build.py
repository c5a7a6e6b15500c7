"""A fake packaged Linux UE build, for the tier: a launcher that runs a "shipping binary",
which runs the mock game (`uerl mock-ue`, from the mock game's image) on Schola's port.

The real-pods tier serves it as a zip made on Windows (no execute bits) for the loader
Job to unpack into the shared volume (tests/k8s/pods_stack.py), and build.py bakes it
into the game image (docker/unreal-game.Dockerfile, the mock game's image as its base)."""

from __future__ import annotations

from pathlib import Path

LAUNCHER = """#!/bin/bash
# A packaged Linux UE build's launcher (what Game.sh does: run the shipping binary
# beside it with the project name and the command line it got).
UE_PROJECT_ROOT=$(dirname "$(readlink -f "$0")")
exec "$UE_PROJECT_ROOT/FakeGame/Binaries/Linux/FakeGame-Linux-Shipping" FakeGame "$@"
"""
# The "shipping binary": reads Schola's -ScholaPort=N like a build does and serves the
# mock game on 127.0.0.1 (a stock Schola build binds loopback). It writes where it ran
# from and as whom, so a test can see which build ran.
BINARY = """#!/bin/sh
port=50051
for arg in "$@"; do
  case "$arg" in -ScholaPort=*) port=${arg#-ScholaPort=} ;; esac
done
echo "FakeGame from $0 as uid $(id -u), Schola on 127.0.0.1:$port"
exec uerl mock-ue --host 127.0.0.1 --port "$port"
"""
# Relative path -> content: the launcher at the root, as a packaged build has it.
FILES = {
    "Game.sh": LAUNCHER,
    "FakeGame/Binaries/Linux/FakeGame-Linux-Shipping": BINARY,
    "FakeGame/Content/Paks/FakeGame-LinuxNoEditor.pak": "not a real pak\n",
}


def write(directory: Path) -> Path:
    """The build's files under `directory` (modes as a Windows zip leaves them: none
    executable; whoever installs the build gives the bits back)."""
    for rel, text in FILES.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
    return directory
