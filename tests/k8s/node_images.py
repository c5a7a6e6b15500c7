"""Minimal container images for the real node (tests/k8s/node.py), with no registry and
no Docker engine: docker-archive tarballs (what `docker save` writes and
`ctr images import` reads) of one static binary each.

- the pause image (the pods' sandbox): `build/pause/linux/pause.c` of the
  k8s.io/kubernetes module in the Go module cache, compiled with `gcc -static`;
- a test image: Debian's busybox-static (`/bin/busybox` and one symlink per applet:
  sh, sleep, httpd, wget, nslookup, nc, ...).

Both are written deterministically (fixed mtimes and owners) into the k8s cache
(`<cache>/node-images/`), and rewritten only when missing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane import BUILD_DIR, cache_dir, find_binaries, pinned_versions

PAUSE_VERSION = "3.10.2"  # build/pause/Makefile's TAG at the pinned Kubernetes version
PAUSE_REF = f"uerl.local/pause:{PAUSE_VERSION}"
BUSYBOX_STATIC = Path("/bin/busybox")  # the busybox-static package (debian-packages.txt)


@dataclass(frozen=True)
class Image:
    ref: str  # what pods name, with imagePullPolicy: Never
    archive: Path  # the docker-archive to import


@dataclass(frozen=True)
class Symlink:
    target: str


def images_dir() -> Path:
    return cache_dir() / "node-images"


def write_docker_archive(
    path: Path,
    ref: str,
    files: Mapping[str, bytes | Symlink],
    config: Mapping[str, Any],
    modes: Mapping[str, int] | None = None,
) -> Path:
    """A one-layer docker-archive at `path` tagged `ref`. `files`: path in the image ->
    content (mode 0755 unless `modes` says otherwise) or a Symlink."""
    layer = _layer_tar(files, modes or {})
    layer_hex = hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_hex}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/k8s/node_images.py"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_hex = hashlib.sha256(config_bytes).hexdigest()
    manifest = [
        {
            "Config": f"{config_hex}.json",
            "RepoTags": [ref],
            "Layers": [f"{layer_hex}/layer.tar"],
        }
    ]
    repo, _, tag = ref.rpartition(":")
    members = {
        f"{layer_hex}/layer.tar": layer,
        f"{config_hex}.json": config_bytes,
        "manifest.json": json.dumps(manifest).encode(),
        "repositories": json.dumps({repo: {tag: layer_hex}}).encode(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            tar.addfile(_member(name, len(data)), io.BytesIO(data))
    tmp.replace(path)
    return path


def pause_image() -> Image:
    """The sandbox image, from the pinned k8s.io/kubernetes module's pause.c."""
    path = images_dir() / f"pause-{PAUSE_VERSION}.tar"
    if not path.is_file():
        binary = _compile_pause(path.parent)
        write_docker_archive(
            path,
            PAUSE_REF,
            {"pause": binary},
            # As upstream's image: nobody's ids, the binary as entrypoint.
            {"User": "65535:65535", "Entrypoint": ["/pause"]},
        )
    return Image(PAUSE_REF, path)


def busybox_image() -> Image:
    """The node tests' image: static busybox, every applet linked under /bin."""
    version = _busybox_version()
    ref = f"uerl.local/busybox:{version}"
    path = images_dir() / f"busybox-{version}.tar"
    if not path.is_file():
        write_docker_archive(
            path,
            ref,
            _busybox_files(),
            {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
            modes=_BUSYBOX_MODES,
        )
    return Image(ref, path)


def kubectl_image() -> Image:
    """The busybox image plus the tier's kubectl: a pod that talks to the API server
    with its own service account (and verifies its certificate, which busybox's wget
    cannot: its TLS has no cipher in common with the API server's ECDSA key)."""
    kubectl = find_binaries(["kubernetes"])["kubectl"]
    version = pinned_versions()["kubernetes"]
    ref = f"uerl.local/kubectl:{version}"
    path = images_dir() / f"kubectl-{version}.tar"
    if not path.is_file():
        files = _busybox_files()
        files["bin/kubectl"] = kubectl.read_bytes()
        write_docker_archive(
            path, ref, files, {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}, modes=_BUSYBOX_MODES
        )
    return Image(ref, path)


_BUSYBOX_MODES = {"tmp/": 0o1777, "etc/passwd": 0o644}


def _busybox_files() -> dict[str, bytes | Symlink]:
    if not BUSYBOX_STATIC.is_file():
        raise FileNotFoundError(
            f"{BUSYBOX_STATIC} is missing: run tests/k8s/build/install-node-packages.sh"
        )
    listing = subprocess.run(
        [str(BUSYBOX_STATIC), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    files: dict[str, bytes | Symlink] = {"bin/busybox": BUSYBOX_STATIC.read_bytes()}
    files.update({f"bin/{a}": Symlink("busybox") for a in listing if a != "busybox"})
    files.update({"tmp/": b"", "etc/passwd": b"root:x:0:0:root:/:/bin/sh\n"})
    return files


def _busybox_version() -> str:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "busybox-static"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    # "1:1.35.0-4+deb12u1+b1" -> "1.35.0-4-deb12u1-b1": a valid image tag
    return (out.split(":", 1)[-1] or "unknown").replace("+", "-").replace("~", "-")


def _compile_pause(workdir: Path) -> bytes:
    source = _kubernetes_module_dir() / "build" / "pause" / "linux" / "pause.c"
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"pause-{os.getpid()}.bin"
    result = subprocess.run(
        ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_VERSION}-uerl",
         "-o", str(out), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"gcc -static {source} failed:\n{result.stderr}")
    subprocess.run(["strip", str(out)], check=False)
    data = out.read_bytes()
    out.unlink()
    return data


def _kubernetes_module_dir() -> Path:
    """k8s.io/kubernetes at the pinned version in the Go module cache (downloaded by
    `go mod download` through the module proxy if absent)."""
    version = pinned_versions()["kubernetes"]
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
        cwd=BUILD_DIR / "kubernetes-node",
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOTOOLCHAIN": "local"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"go mod download k8s.io/kubernetes@{version}: {result.stderr}")
    return Path(json.loads(result.stdout)["Dir"])


def _member(name: str, size: int, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, 0
    return info


def _layer_tar(files: Mapping[str, bytes | Symlink], modes: Mapping[str, int]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            content = files[name]
            info = _member(name.rstrip("/"), 0, modes.get(name, 0o755))
            if isinstance(content, Symlink):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, content.target, 0o777
                tar.addfile(info)
            elif name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()
