"""Reads and runs the docker-archives build.py writes, without a container runtime:
the layers unpacked into a directory (whiteouts applied), a command run chrooted in it
inside its own mount and PID namespaces (proc, /dev and a private /tmp mounted; the
network is the host's, so a server in it answers on loopback)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class Archive:
    path: Path
    repo_tags: list[str]
    config: dict
    layers: list[str]  # member names inside the archive, base first

    @property
    def image_config(self) -> dict:
        return self.config.get("config") or {}

    def env(self) -> dict[str, str]:
        pairs = (item.split("=", 1) for item in self.image_config.get("Env") or [])
        return {key: value for key, value in pairs}


def read_archive(path: Path) -> Archive:
    """manifest.json and the image config of a one-image docker-archive."""
    with tarfile.open(path) as tar:
        manifest = json.load(_member(tar, "manifest.json"))
        assert len(manifest) == 1, f"{path}: {len(manifest)} images in manifest.json"
        config = json.load(_member(tar, manifest[0]["Config"]))
    return Archive(path, manifest[0].get("RepoTags") or [], config, manifest[0]["Layers"])


def _member(tar: tarfile.TarFile, name: str):
    handle = tar.extractfile(name.removeprefix("./")) if name else None
    if handle is None:
        handle = tar.extractfile(f"./{name}")
    assert handle is not None, f"{tar.name}: no {name}"
    return handle


def unpack(archive: Archive, dest: Path) -> Path:
    """The image's filesystem in dest (rebuilt unless dest/.complete names the same
    archive). GNU tar extracts each layer; whiteouts remove what lower layers put there."""
    marker = dest / ".complete"
    stamp = f"{archive.path} {archive.path.stat().st_mtime_ns}"
    if marker.exists() and marker.read_text() == stamp:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    staging = dest.with_name(dest.name + ".layers")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        subprocess.run(
            ["tar", "-C", str(staging), "-xf", str(archive.path), *archive.layers], check=True
        )
        for layer in archive.layers:
            layer_tar = staging / layer
            names = subprocess.run(
                ["tar", "-tf", str(layer_tar)], check=True, capture_output=True, text=True
            ).stdout.splitlines()
            for name in names:
                path = PurePosixPath(name)
                if path.name == ".wh..wh..opq":  # opaque: the lower layers' directory is hidden
                    target = dest / path.parent
                    if target.is_dir():
                        for child in target.iterdir():
                            _remove(child)
                elif path.name.startswith(".wh."):
                    _remove(dest / path.parent / path.name.removeprefix(".wh."))
            subprocess.run(
                [
                    "tar",
                    "-C",
                    str(dest),
                    "--numeric-owner",
                    "--same-permissions",
                    "--exclude=.wh.*",
                    "-xf",
                    str(layer_tar),
                ],
                check=True,
            )
            layer_tar.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    marker.write_text(stamp)
    return dest


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def chroot_argv(rootfs: Path, argv: Sequence[str], *, user: str, env: dict[str, str]) -> list[str]:
    """A command line running argv as user (numeric `uid:gid`) in rootfs, in new mount and
    PID namespaces (root needed), from `/`. The mounts vanish with the namespace, and
    killing the returned process (SIGKILL: unshare ignores SIGTERM) kills all it started.
    No shell is needed in the image (the operator's has none)."""
    root = shlex.quote(str(rootfs))
    mounts = [f"mount -t proc proc {root}/proc"] if (rootfs / "proc").is_dir() else []
    if (rootfs / "dev").is_dir():
        mounts.append(f"mount --rbind /dev {root}/dev")
    if (rootfs / "tmp").is_dir():
        mounts.append(f"mount -t tmpfs -o mode=1777 tmpfs {root}/tmp")
    words = [
        "/usr/bin/env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        "/usr/sbin/chroot",
        f"--userspec={user}",
        str(rootfs),
        *argv,
    ]
    command = " ".join(shlex.quote(w) for w in words)
    # Not `exec`: sh stays the namespace's init, root, with --kill-child's parent-death
    # signal (chroot --userspec's setuid would clear it). When unshare dies, sh dies, and
    # the kernel kills everything else in the PID namespace.
    script = " && ".join([*mounts, command])
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "sh",
        "-c",
        script,
    ]
