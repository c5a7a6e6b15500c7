#!/usr/bin/env python3
"""Builds uerl's images from docker/*.Dockerfile without a Docker engine or a registry.

    python tests/k8s/images/build.py [--only NAME ...] [--force NAME ...] [--no-prune]
    python tests/k8s/images/build.py --engine docker [--dry-run]   # a machine with Docker

Images: ray (CPU: torch's CUDA libraries stubbed, cuda_stubs.py), ray-cuda (PyPI's CUDA
torch, for GPU learners; built only when named), mock-ue (tagged as infra/topology/
says), unreal-game (docker/unreal-game.Dockerfile around fake_build.py's fake packaged
build, on the mock-ue image: the tier runs it as a game pod) and kuberay-operator (the
chart's repository, tagged with the binary's own version: a stack sets
`operator.values.image.tag`).
Needs root, buildah and debootstrap (tests/k8s/build/install-node-packages.sh), the
project's .venv (`make setup`: torch with its CUDA wheels, for the stubs), cargo, and for
the operator the binary tests/k8s/build/build.sh builds.

Into ${UERL_IMAGE_CACHE:-~/.cache/uerl-images} (outside the work tree):
  base/<hash>/base.tar     a Debian bookworm rootfs (debootstrap --variant=minbase with
                           python3, python3-venv, ...) packed as a one-layer docker-archive:
                           the Dockerfiles' BASE_IMAGE (no public base image can be pulled)
  native/<hash>/*.whl      the compiled game client (native/), by the host's cargo and
                           maturin (from PyPI): the Ray image COPYs it
  cuda-stubs/<hash>/       stand-ins for torch's CUDA libraries (cuda_stubs.py)
  contexts/<name>/         each image's build context: only what its Dockerfile COPYs
  archives/<name>.tar      docker-archive tarballs, for `ctr -n k8s.io images import`
  index.json               image ref -> {"archive", "inputs"}
  storage/                 buildah's storage: the layers of the images last built (the next
                           build reuses those before the first changed step)
  logs/<name>.log          each build's output

An image is rebuilt only when its inputs hash changes: its Dockerfile, every file of its
context (path, mode, content), its build args and the base's hash. buildah runs as root
with `--isolation chroot` (no runc needed) and overlay storage of its own, in a
clean environment: the host's PIP_*/REQUESTS_CA_BUNDLE never reach the build; pip trusts
a copy of the host's CA bundle through a read-only build-time mount (PIP_CERT), so the
image keeps Debian's own CA bundle and no host configuration.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import fake_build  # beside this file

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("UERL_IMAGE_CACHE", "~/.cache/uerl-images")).expanduser()
K8S_CACHE = Path(os.environ.get("UERL_K8S_CACHE", "~/.cache/uerl-k8s")).expanduser()
# The KubeRay operator chart the repository carries (third_party/README.md): its
# values.yaml names the operator image's repository.
CHART = ROOT / "third_party" / "kuberay-operator-1.7.0"
VERSIONS_ENV = ROOT / "tests" / "k8s" / "build" / "versions.env"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Where the CA copy is mounted during RUN steps (PIP_CERT points at it).
BUILD_CA = "/run/uerl-build-ca.crt"
# Version of this script's packing logic: bumping it rebuilds everything.
BUILDER_VERSION = "2"

# The base: what `ray start`, KubeRay's start command (`bash -lc`, `ulimit`) and its
# probes need, plus python3 with venv and json (python3-minimal lacks json).
BASE_SUITE = "bookworm"
BASE_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps", "wget")
BASE_REF = "localhost/uerl-base:bookworm"
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def log(message: str) -> None:
    print(f"[images] {message}", flush=True)


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: nothing of the host's pip/TLS configuration."""
    env = {"PATH": CLEAN_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    log_to: Path | None = None,
    cwd: Path | None = None,
) -> None:
    """Runs one step at low priority (2 shared cores; UERL_BUILD_NICE, default 19: CI's
    build is its critical path and sets 0); its output goes to a log file, whose tail is
    shown on failure."""
    argv = ["nice", "-n", os.environ.get("UERL_BUILD_NICE", "19"), *argv]
    if log_to is None:
        subprocess.run(argv, env=env, cwd=cwd, check=True)
        return
    log_to.parent.mkdir(parents=True, exist_ok=True)
    with log_to.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.run(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        tail = log_to.read_text(errors="replace").splitlines()[-40:]
        raise SystemExit(
            f"failed ({proc.returncode}): {' '.join(argv)}\n"
            + "\n".join(tail)
            + f"\n(log: {log_to})"
        )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_hash(root: Path) -> str:
    """Paths, exec bits, symlink targets and contents of every file under root."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if not p.is_dir() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        else:
            executable = os.access(path, os.X_OK)
            digest.update(f"F {rel} {int(executable)} {sha256_file(path)}\n".encode())
    return digest.hexdigest()


def text_hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def tool_version(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, env=clean_env())
    return (out.stdout or out.stderr).strip().splitlines()[0] if out.returncode == 0 else "?"


# --- the base -------------------------------------------------------------------------


def write_docker_archive(layer: Path, dest: Path, ref: str, config: dict) -> str:
    """A docker-archive (`docker save` format) of one uncompressed layer: manifest.json,
    the image config and the layer. Returns the layer's digest (its diff_id)."""
    diff_id = sha256_file(layer)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": f"debootstrap --variant=minbase {BASE_SUITE} (uerl build.py)"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    staging = dest.with_suffix(".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / config_name).write_bytes(config_bytes)
    os.link(layer, staging / f"{diff_id}.tar")
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [f"{diff_id}.tar"]}]
    (staging / "manifest.json").write_text(json.dumps(manifest))
    tmp = dest.with_suffix(".tmp")
    subprocess.run(
        [
            "tar",
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
            str(staging),
            "-cf",
            str(tmp),
            ".",
        ],
        check=True,
    )
    shutil.rmtree(staging)
    tmp.replace(dest)
    return diff_id


def build_base(force: bool) -> tuple[Path, str]:
    """The Debian base: debootstrap once per set of inputs; returns (archive, hash)."""
    debootstrap = tool_version(["dpkg-query", "-W", "-f", "${Version}", "debootstrap"])
    inputs = text_hash(BUILDER_VERSION, BASE_SUITE, BASE_MIRROR, *BASE_PACKAGES, debootstrap)
    out_dir = CACHE / "base" / inputs[:16]
    archive = out_dir / "base.tar"
    stamp = out_dir / "layer.sha256"
    if archive.exists() and stamp.exists() and not force:
        log(f"base: cached ({archive})")
        return archive, stamp.read_text().strip()
    start = time.monotonic()
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    rootfs = out_dir / "rootfs"
    log(f"base: debootstrap {BASE_SUITE} with {', '.join(BASE_PACKAGES)} (a few minutes)")
    run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            BASE_SUITE,
            str(rootfs),
            BASE_MIRROR,
        ],
        env=clean_env(),
        log_to=out_dir / "build.log",
    )
    # Nothing of this machine, nothing apt only needed for the install.
    for rel in ("var/cache/apt", "var/lib/apt/lists", "var/log", "tmp", "run", "dev"):
        target = rootfs / rel
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(mode=0o1777 if rel == "tmp" else 0o755)
    for rel in ("etc/resolv.conf", "etc/hostname", "etc/machine-id"):
        (rootfs / rel).unlink(missing_ok=True)
    (rootfs / "etc/machine-id").touch()
    layer = out_dir / "layer.tar"
    subprocess.run(
        [
            "tar",
            "--sort=name",
            "--numeric-owner",
            "--xattrs",
            "-C",
            str(rootfs),
            "-cf",
            str(layer),
            ".",
        ],
        check=True,
    )
    config = {"Env": [f"PATH={CLEAN_PATH}", "LANG=C.UTF-8"], "Cmd": ["bash"]}
    diff_id = write_docker_archive(layer, archive, BASE_REF, config)
    layer.unlink()
    shutil.rmtree(rootfs)
    stamp.write_text(diff_id + "\n")
    for old in out_dir.parent.iterdir():  # earlier bases: nothing refers to them any more
        if old != out_dir:
            shutil.rmtree(old, ignore_errors=True)
    log(f"base: built in {time.monotonic() - start:.1f}s ({archive.stat().st_size >> 20} MiB)")
    return archive, diff_id


# --- the compiled game client ---------------------------------------------------------

NATIVE_SOURCES = (
    "native/Cargo.toml",
    "native/Cargo.lock",
    "native/build.rs",
    "native/pyproject.toml",
    "protos/schola/schola_gym.proto",
)


def build_native_wheel(python: str, force: bool) -> Path:
    """The uerl_native wheel for CPython 3.11 on bookworm's glibc, built on this host."""
    rust = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("native/src/*.rs"))
    files = [*NATIVE_SOURCES, *rust]
    digest = hashlib.sha256(BUILDER_VERSION.encode())
    for rel in files:
        digest.update(f"{rel} {sha256_file(ROOT / rel)}\n".encode())
    cargo_home = Path(os.environ.get("CARGO_HOME", "~/.cargo")).expanduser()
    cargo = shutil.which("cargo") or str(cargo_home / "bin" / "cargo")
    digest.update(tool_version([cargo, "--version"]).encode())
    out_dir = CACHE / "native" / digest.hexdigest()[:16]
    wheels = sorted(out_dir.glob("*.whl"))
    if wheels and not force:
        log(f"native wheel: cached ({wheels[0].name})")
        return out_dir
    start = time.monotonic()
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    env = {
        **os.environ,
        # The same cargo cache as `make setup`: a warm rebuild takes seconds.
        "CARGO_TARGET_DIR": os.environ.get(
            "CARGO_TARGET_DIR", str(Path("~/.cache/uerl-native/target").expanduser())
        ),
        "PATH": f"{Path(cargo).parent}:{os.environ['PATH']}",
    }
    log("native wheel: pip wheel ./native (maturin from PyPI, the host's cargo)")
    run(
        [python, "-m", "pip", "wheel", "--no-deps", "-w", str(out_dir), str(ROOT / "native")],
        env=env,
        log_to=out_dir / "build.log",
    )
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel in {out_dir}, found {wheels}")
    log(f"native wheel: {wheels[0].name} in {time.monotonic() - start:.1f}s")
    return out_dir


def dockerfile_arg(dockerfile: Path, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    assert match, f"{dockerfile} has no default for ARG {name}"
    return match.group(1)


def build_cuda_stubs(python: str, mode: str) -> Path:
    """torch-cuda-stubs/ for the Ray image: empty for TORCH_CUDA=pypi; for `stub`, the
    stub CUDA libraries (cuda_stubs.py), from the symbols of `python`'s torch and its
    nvidia-* wheels, which must be the torch version the Dockerfile installs."""
    if mode != "stub":
        empty = CACHE / "cuda-stubs" / "none"
        shutil.rmtree(empty, ignore_errors=True)
        empty.mkdir(parents=True)
        return empty
    probe = subprocess.run(
        [
            python,
            "-c",
            "import sysconfig, importlib.metadata as m; "
            "print(sysconfig.get_paths()['purelib']); print(m.version('torch'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    site, version = Path(probe[0]), probe[1].split("+")[0]
    wanted = dockerfile_arg(ROOT / "docker" / "ray.Dockerfile", "TORCH_VERSION")
    if version != wanted:
        raise SystemExit(
            f"{python} has torch {version}, the Ray image installs {wanted}: "
            "the stubs must come from the same torch (make setup)"
        )
    generator = Path(__file__).with_name("cuda_stubs.py")
    key = text_hash(
        BUILDER_VERSION,
        version,
        sha256_file(generator),
        sha256_file(site / "torch" / "lib" / "libtorch_cuda.so"),
    )[:16]
    out = CACHE / "cuda-stubs" / key
    if out.is_dir() and any(out.glob("lib*.so*")):
        log(f"cuda stubs: cached ({out})")
        return out
    start = time.monotonic()
    shutil.rmtree(out, ignore_errors=True)
    run([python, str(generator), str(site), str(out)], log_to=CACHE / "logs" / "cuda-stubs.log")
    count = len(list(out.glob("lib*.so*")))
    log(f"cuda stubs: {count} libraries in {time.monotonic() - start:.1f}s")
    return out


# --- images ---------------------------------------------------------------------------


@dataclass
class Image:
    name: str
    # As written (topology, chart): what `docker build -t` gets.
    tag: str
    dockerfile: Path
    build_args: dict[str, str] = field(default_factory=dict)
    # Extra context entries: context-relative name -> a host path (file or directory).
    extra: dict[str, Path] = field(default_factory=dict)
    uses_base: bool = True
    # Another image of this run whose archive is BASE_IMAGE instead of the debootstrap
    # base (built before this one).
    base_from: str | None = None

    @property
    def ref(self) -> str:
        """Fully qualified: the name containerd and the kubelet look the image up by."""
        return qualified(self.tag)


def copy_sources(dockerfile: Path) -> list[str]:
    """The context paths the Dockerfile COPYs or ADDs (not `--from` a stage)."""
    sources: list[str] = []
    for line in re.sub(r"\\\n", " ", dockerfile.read_text()).splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]) or len(args) < 2:
            continue
        sources.extend(a.rstrip("/") for a in args[:-1])
    return sources


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def ignored(rel: str, patterns: Iterable[str]) -> bool:
    """.dockerignore's meaning: a pattern matches from the context's root (`build` is
    ./build and what is under it); `**/` matches at any depth."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, pattern[3:]) for part in parts):
                return True
        else:
            # As Go's filepath.Match: `*` never crosses a `/`.
            pattern = pattern.strip("/")
            depth = pattern.count("/")
            if depth < len(prefixes) and fnmatch.fnmatch(prefixes[depth], pattern):
                return True
    return False


def stage_context(image: Image) -> Path:
    """The image's build context: what its Dockerfile copies from the repository (minus
    .dockerignore) plus its extra entries; rewritten from scratch each run."""
    context = CACHE / "contexts" / image.name
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    patterns = dockerignore()
    for rel in copy_sources(image.dockerfile):
        if rel in image.extra:
            continue
        src = ROOT / rel
        if not src.exists():
            raise SystemExit(f"{image.dockerfile.name} copies {rel}, which is not in {ROOT}")
        if src.is_file():
            shutil.copy2(src, context / rel)
            continue
        for path in sorted(src.rglob("*")):
            sub = path.relative_to(ROOT).as_posix()
            if path.is_dir() or ignored(sub, patterns):
                continue
            (context / sub).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, context / sub)
    for rel, src in image.extra.items():
        if src.is_dir():
            shutil.copytree(src, context / rel, ignore=shutil.ignore_patterns("*.log"))
        else:
            shutil.copy2(src, context / rel)
    return context


def inputs_hash(image: Image, context: Path, base_hash: str) -> str:
    args = sorted(f"{k}={v}" for k, v in image.build_args.items())
    return text_hash(
        BUILDER_VERSION,
        image.ref,
        sha256_file(image.dockerfile),
        *args,
        tree_hash(context),
        base_hash if image.uses_base else "",
    )


def buildah(storage: Path) -> list[str]:
    # Its own storage under the cache: nothing shared with containerd or other tools.
    return [
        "buildah",
        "--root",
        str(storage / "root"),
        "--runroot",
        "/run/uerl-images-buildah",
        "--storage-driver",
        "overlay",
    ]


def build_image(image: Image, context: Path, base: Path | None, inputs: str) -> Path:
    storage = CACHE / "storage"
    tmp = CACHE / "tmp"  # buildah's cache mounts (the pip cache) live under TMPDIR
    tmp.mkdir(parents=True, exist_ok=True)
    ca = CACHE / "host-ca.crt"
    shutil.copy2(HOST_CA, ca)
    # OCI format: buildah 1.28's layer cache never hits with `--format docker` (each
    # build redid every step); the docker-archive gets a docker config anyway. Lost:
    # HEALTHCHECK, which Kubernetes ignores (its probes are in the manifests).
    argv = [
        *buildah(storage),
        "build",
        "--isolation",
        "chroot",
        "--format",
        "oci",
        "--layers",
        "--pull-never" if base is None else "--pull",
        "-f",
        str(image.dockerfile),
        "-t",
        image.ref,
        "-v",
        f"{ca}:{BUILD_CA}:ro",
        "--build-arg",
        f"PIP_CERT={BUILD_CA}",
    ]
    if base is not None:
        argv += ["--build-arg", f"BASE_IMAGE=docker-archive:{base}"]
    for key, value in image.build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    argv.append(str(context))
    log_file = CACHE / "logs" / f"{image.name}.log"
    log_file.unlink(missing_ok=True)
    run(argv, env=clean_env(TMPDIR=str(tmp)), log_to=log_file)
    archives = CACHE / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    archive = archives / f"{image.name}.tar"
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    run(
        [*buildah(storage), "push", image.ref, f"docker-archive:{partial}:{image.ref}"],
        env=clean_env(TMPDIR=str(tmp)),
        log_to=log_file,
    )
    partial.replace(archive)
    return archive


def chart_image_repository() -> str:
    """The repository of the chart's default operator image (its values.yaml)."""
    if not (CHART / "values.yaml").is_file():
        raise SystemExit(
            f"{CHART / 'values.yaml'} is missing: the KubeRay chart this "
            "repository carries (third_party/README.md)"
        )
    values = (CHART / "values.yaml").read_text()
    block = re.search(r"^image:\n((?:[ #].*\n|\n)+)", values, re.MULTILINE)
    assert block, f"no image: block in {CHART / 'values.yaml'}"
    repo = re.search(r"^\s+repository:\s*(\S+)", block.group(1), re.MULTILINE)
    assert repo, "values.yaml image: has no repository"
    return repo.group(1)


def kuberay_version() -> str:
    versions = dict(re.findall(r"^(\w+)=(\S+)$", VERSIONS_ENV.read_text(), re.MULTILINE))
    return versions["KUBERAY_VERSION"]


def operator_image_ref() -> str:
    """The chart's repository at the binary's own version (the proxy serves no v1.7.0
    module): a stack running the chart sets `operator.values.image.tag` to it."""
    return f"{chart_image_repository()}:{kuberay_version()}"


def kuberay_binary() -> Path:
    return K8S_CACHE / f"kuberay-{kuberay_version()}" / "bin" / "kuberay-operator"


def qualified(ref: str) -> str:
    """docker.io/... as containerd and the kubelet name an unqualified image."""
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


# The tier's game image: docker/unreal-game.Dockerfile baked around fake_build.py.
FAKE_GAME_REF = "uerl/fake-unreal-game:0.1.0"


def cuda_ref() -> str:
    """The CUDA Ray image's tag, from infra/topology/."""
    sys.path.insert(0, str(ROOT))
    from infra.topology import RaySpec

    return RaySpec().built_image("cuda")


def topology_refs() -> tuple[str, str]:
    """The Ray and mock game tags, from infra/topology/ (the one place they are written)."""
    sys.path.insert(0, str(ROOT))
    from infra.topology import SIMULATOR_DEFAULTS, Topology

    return Topology().ray.image_ref, SIMULATOR_DEFAULTS["mock"]["image"]


def images(wanted: Iterable[str], native_dir: Path | None, python: str | None) -> list[Image]:
    """The wanted images, in build order. The operator's tag is read (from the chart and
    versions.env) only when it is wanted: `make images` builds Ray and the mock game only.
    `python` (None: a dry run) gives the CUDA stubs of the CPU Ray image."""
    wanted = set(wanted)
    ray_ref, mock_ref = topology_refs()
    out: list[Image] = []
    # The CPU image (head, workers, CPU learners) with torch's CUDA libraries stubbed;
    # the CUDA one (GPU learners) with PyPI's.
    for name, ref, torch_cuda in (("ray", ray_ref, "stub"), ("ray-cuda", cuda_ref(), "pypi")):
        if name not in wanted:
            continue
        extra = {"native-wheels": native_dir} if native_dir else {}
        if python is not None:
            extra["torch-cuda-stubs"] = build_cuda_stubs(python, torch_cuda)
        out.append(
            Image(name, ref, ROOT / "docker" / "ray.Dockerfile", extra=extra,
                  build_args={"TORCH_CUDA": torch_cuda})
        )  # fmt: skip
    out.append(Image("mock-ue", mock_ref, ROOT / "docker" / "mock-ue.Dockerfile"))
    if "unreal-game" in wanted:
        # docker/unreal-game.Dockerfile around the fake packaged build, on the mock game's
        # image (the fake build's binary runs `uerl mock-ue`).
        game = CACHE / "fake-game"
        shutil.rmtree(game, ignore_errors=True)
        fake_build.write(game)
        out.append(
            Image("unreal-game", FAKE_GAME_REF, ROOT / "docker" / "unreal-game.Dockerfile",
                  extra={"game": game, "schola_probe.py": ROOT / "docker" / "schola_probe.py"},
                  base_from="mock-ue")
        )  # fmt: skip
    if "kuberay-operator" in wanted:
        out.append(
            Image(
                "kuberay-operator",
                operator_image_ref(),
                ROOT / "docker" / "kuberay-operator.Dockerfile",
                extra={"kuberay-operator": kuberay_binary()},
                uses_base=False,
            )
        )
    return [image for image in out if image.name in wanted]


def load_index() -> dict[str, dict[str, str]]:
    path = CACHE / "index.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = ["base", "native", "ray", "ray-cuda", "mock-ue", "unreal-game", "kuberay-operator"]
    parser.add_argument(
        "--only",
        nargs="+",
        choices=names[2:],
        help="build only these images (default: all but ray-cuda, which no node here runs)",
    )
    parser.add_argument("--force", nargs="+", default=[], choices=names, help="rebuild these")
    parser.add_argument(
        "--no-prune",
        action="store_true",
        help="keep buildah's layers of earlier builds (pruned after a rebuild)",
    )
    parser.add_argument("--engine", choices=["buildah", "docker"], default="buildah")
    parser.add_argument("--docker", default="docker", help="the docker CLI (--engine docker)")
    parser.add_argument("--dry-run", action="store_true", help="--engine docker: print only")
    parser.add_argument(
        "--python",
        default=str(ROOT / ".venv" / "bin" / "python"),
        help="a CPython 3.11 with pip: builds the native wheel",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    # One build at a time: contexts, storage and index.json are shared. A dry run reads
    # none of them, so it never waits for a build that holds the lock (CI's background
    # image build runs beside `make test`, which dry-runs `make images`).
    if not args.dry_run:
        lock = (CACHE / ".lock").open("w")
        fcntl.flock(lock, fcntl.LOCK_EX)
    wanted = args.only or [name for name in names[2:] if name != "ray-cuda"]

    # A dry run only prints the docker commands: no wheel needed.
    needs_native = bool({"ray", "ray-cuda"} & set(wanted)) and not args.dry_run
    native_dir = build_native_wheel(args.python, "native" in args.force) if needs_native else None
    selected = images(wanted, native_dir, args.python if needs_native else None)

    if args.engine == "docker":
        # A normal Docker engine: the same Dockerfiles and contexts, its default base.
        for image in selected:
            context = stage_context(image) if not args.dry_run else CACHE / "contexts" / image.name
            cmd = [
                args.docker,
                "build",
                "-f",
                str(image.dockerfile.relative_to(ROOT)),
                "-t",
                image.tag,
            ]
            for key, value in image.build_args.items():
                cmd += ["--build-arg", f"{key}={value}"]
            if image.base_from is not None:
                below = next(i for i in selected if i.name == image.base_from)
                cmd += ["--build-arg", f"BASE_IMAGE={below.tag}"]
            cmd.append(str(context))
            print(" ".join(cmd), flush=True)
            if not args.dry_run:
                subprocess.run(cmd, check=True, cwd=ROOT)
        return 0

    missing = [t for t in ("buildah", "debootstrap") if shutil.which(t, path=CLEAN_PATH) is None]
    if missing:
        raise SystemExit(
            f"missing {', '.join(missing)}: run tests/k8s/build/install-node-packages.sh"
        )
    base_archive, base_hash = build_base("base" in args.force)
    index = load_index()
    timings: list[str] = []
    for image in selected:
        start = time.monotonic()
        if not image.uses_base:
            for src in image.extra.values():
                if not src.exists():
                    raise SystemExit(
                        f"{image.name}: {src} is missing: run tests/k8s/build/build.sh"
                    )
        context = stage_context(image)
        image_base, image_base_hash = base_archive, base_hash
        if image.base_from is not None:  # built above (or cached): its archive and inputs
            below = next(index[i.ref] for i in selected if i.name == image.base_from)
            image_base, image_base_hash = Path(below["archive"]), below["inputs"]
        inputs = inputs_hash(image, context, image_base_hash)
        entry = index.get(image.ref, {})
        archive = Path(entry.get("archive", "/nonexistent"))
        if entry.get("inputs") == inputs and archive.exists() and image.name not in args.force:
            log(f"{image.name}: cached {image.ref} ({archive.stat().st_size >> 20} MiB)")
            timings.append(f"{image.name}: cached")
            continue
        log(f"{image.name}: building {image.ref} (log: {CACHE / 'logs' / (image.name + '.log')})")
        archive = build_image(image, context, image_base if image.uses_base else None, inputs)
        seconds = time.monotonic() - start
        size = archive.stat().st_size >> 20
        index[image.ref] = {
            "name": image.name,
            "archive": str(archive),
            "inputs": inputs,
            "base": image_base_hash if image.uses_base else "",
            "size_mib": str(size),
            "build_seconds": f"{seconds:.1f}",
        }
        # Written after each image: an interrupted run keeps what it finished.
        with tempfile.NamedTemporaryFile("w", dir=CACHE, delete=False) as f:
            json.dump(index, f, indent=2, sort_keys=True)
        Path(f.name).replace(CACHE / "index.json")
        log(f"{image.name}: built in {seconds:.1f}s -> {archive} ({size} MiB)")
        timings.append(f"{image.name}: {seconds:.1f}s")
    rebuilt = any(not t.endswith("cached") for t in timings)
    if rebuilt and not args.no_prune:
        # Earlier builds' layers (GBs each for the Ray image); the layers of the images
        # just built stay: they are the cache of the next build.
        start = time.monotonic()
        try:
            # A build cut short (its run killed) leaves its working container, which
            # holds its image: this storage is this script's alone, so none is in use.
            run(
                [*buildah(CACHE / "storage"), "rm", "--all"],
                env=clean_env(),
                log_to=CACHE / "logs" / "prune.log",
            )
            run(
                [*buildah(CACHE / "storage"), "rmi", "--prune"],
                env=clean_env(),
                log_to=CACHE / "logs" / "prune.log",
            )
            log(f"pruned earlier layers in {time.monotonic() - start:.1f}s")
        except SystemExit as exc:  # housekeeping: the images are built, said and kept
            log(f"earlier layers not pruned ({str(exc).splitlines()[0]}); the images stand")
    total = time.monotonic() - started
    log(f"done in {total:.1f}s ({'; '.join(timings)}); index: {CACHE / 'index.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
