"""The images tests/k8s/images/build.py builds from docker/*.Dockerfile, checked without
a node: each docker-archive's config, and each image's filesystem run chrooted (its
own mount and PID namespaces) as the image's user. Needs root and the archives
(`make images-local`); missing archives fail the tests, naming the command."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_speed import guard

sys.path.insert(0, str(Path(__file__).parent / "images"))
import build
from rootfs import Archive, chroot_argv, read_archive, unpack

# The first run unpacks the 2.4 GiB Ray image inside a test, then imports torch and Ray
# from a cold page cache: room above pyproject's 600 s for that on a slow host. Scaled
# here: tests/conftest.py scales the limits of tests/*.py only.
pytestmark = [pytest.mark.k8s, pytest.mark.pods, pytest.mark.timeout(guard(1200))]

RAY_USER = "1000:100"  # ray:users, as KubeRay runs it
MOCK_USER = "10001:10001"


@pytest.fixture(scope="module")
def index() -> dict[str, dict[str, str]]:
    path = build.CACHE / "index.json"
    if not path.exists():
        pytest.fail(f"no {path}: run `make images-local` first", pytrace=False)
    return json.loads(path.read_text())


def _archive(index: dict[str, dict[str, str]], name: str) -> Archive:
    entries = [e for e in index.values() if e.get("name") == name]
    if not entries or not Path(entries[0]["archive"]).exists():
        pytest.fail(f"no {name} image in {build.CACHE}: run `make images-local`", pytrace=False)
    return read_archive(Path(entries[0]["archive"]))


@pytest.fixture(scope="module")
def ray(index: dict[str, dict[str, str]]) -> Archive:
    return _archive(index, "ray")


@pytest.fixture(scope="module")
def mock(index: dict[str, dict[str, str]]) -> Archive:
    return _archive(index, "mock-ue")


@pytest.fixture(scope="module")
def operator(index: dict[str, dict[str, str]]) -> Archive:
    return _archive(index, "kuberay-operator")


def _rootfs(archive: Archive) -> Path:
    # Unpacked once per archive (kept for the next run: the Ray image takes a while).
    return unpack(archive, build.CACHE / "rootfs" / archive.path.stem)


def _run(
    archive: Archive, argv: list[str], user: str, timeout: float = guard(300), **env: str
) -> subprocess.CompletedProcess[str]:
    argv = chroot_argv(_rootfs(archive), argv, user=user, env={**archive.env(), **env})
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv[-1]}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def test_index_names_the_topology_tags_and_the_operators_own_version(
    index: dict[str, dict[str, str]],
) -> None:
    ray_ref, mock_ref = build.topology_refs()
    assert {
        build.qualified(ray_ref),
        build.qualified(mock_ref),
        build.qualified(build.operator_image_ref()),
    } <= set(index)
    # The chart's repository, tagged with the version the binary really is.
    assert build.operator_image_ref() == "quay.io/kuberay/operator:v1.6.2"


@pytest.mark.parametrize("name", ["ray", "mock-ue", "kuberay-operator"])
def test_archive_is_a_docker_archive(index: dict[str, dict[str, str]], name: str) -> None:
    """What `ctr images import` and `docker load` read: one manifest entry tagged with the
    index's ref, a config whose diff_ids are the sha256 of the layer tars, in order."""
    archive = _archive(index, name)
    ref = next(ref for ref, e in index.items() if e.get("name") == name)
    assert archive.repo_tags == [ref]
    assert archive.config["os"] == "linux" and archive.config["architecture"] == "amd64"
    diff_ids = archive.config["rootfs"]["diff_ids"]
    assert len(diff_ids) == len(archive.layers) >= 1
    with tarfile.open(archive.path) as tar:
        for layer, diff_id in zip(archive.layers, diff_ids, strict=True):
            handle = tar.extractfile(layer)
            assert handle is not None
            digest = hashlib.sha256()
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
            assert f"sha256:{digest.hexdigest()}" == diff_id, layer


def test_ray_image_config(ray: Archive) -> None:
    config = ray.image_config
    assert config["User"] == "ray"
    assert config["WorkingDir"] == "/home/ray"
    assert config["Cmd"] == ["bash"]
    env = ray.env()
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["PATH"].startswith("/opt/venv/bin:")
    # Nothing of the build machine: no CA override, no pip configuration.
    leaked = [
        k
        for k in env
        if k.startswith("PIP_CERT")
        or k in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "PIP_FIND_LINKS", "PIP_INDEX_URL")
    ]
    assert leaked == []


def test_mock_image_config(mock: Archive) -> None:
    config = mock.image_config
    assert config["User"] == "10001"
    assert config["Cmd"] == ["uerl", "mock-ue", "--host", "0.0.0.0", "--port", "50051"]
    assert "50051/tcp" in config["ExposedPorts"]
    # No Healthcheck: buildah builds OCI images (build.py says why); Kubernetes probes
    # the game's gRPC health service itself.
    assert "REQUESTS_CA_BUNDLE" not in mock.env() and "PIP_CERT" not in mock.env()


def test_operator_image_runs_the_chart_command(operator: Archive) -> None:
    """The chart's Deployment runs `operatorCommand` (/manager) with runAsNonRoot: the
    image's user must be numeric and not 0."""
    values = (build.CHART / "values.yaml").read_text()
    assert "operatorCommand: /manager" in values
    config = operator.image_config
    assert config["Entrypoint"] == ["/manager"]
    uid = config["User"].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    proc = subprocess.run(
        chroot_argv(_rootfs(operator), ["/manager", "--help"], user="65532:65532", env={}),
        capture_output=True,
        text=True,
        timeout=guard(120),
    )
    assert "metrics-addr" in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_images_keep_debians_ca_bundle(ray: Archive, mock: Archive) -> None:
    """pip trusted the build machine's CA through a build-time mount: it is in no image."""
    host = Path("/etc/ssl/certs/ca-certificates.crt").read_text()
    for archive in (ray, mock):
        bundle = (_rootfs(archive) / "etc/ssl/certs/ca-certificates.crt").read_text()
        if bundle != host:
            continue
        pytest.fail(f"{archive.path.name} holds this machine's CA bundle")
    for archive in (ray, mock):
        root = _rootfs(archive)
        assert not (root / "etc/pip.conf").exists()
        # buildah leaves the mount point of the build-time CA mount: an empty file.
        mount_point = root / "run/uerl-build-ca.crt"
        assert not mount_point.exists() or mount_point.stat().st_size == 0


def test_ray_image_imports_and_trains_a_step(ray: Archive) -> None:
    script = (
        "import importlib.metadata as m, ray, torch, uerl_native, training.cli;"
        "net = torch.nn.Linear(4, 2); loss = net(torch.randn(8, 4)).pow(2).mean();"
        "loss.backward(); assert net.weight.grad is not None;"
        "print(ray.__version__, torch.__version__.split('+')[0], m.version('uerl'),"
        " torch.cuda.is_available())"
    )
    out = _run(ray, ["python", "-c", script], RAY_USER, HOME="/home/ray").stdout.split()
    assert out == ["2.60.0", "2.13.0", "0.1.0", "False"]


def test_ray_image_runs_uerl_and_kuberays_login_shell(ray: Archive) -> None:
    assert "mock-ue" in _run(ray, ["uerl", "--help"], RAY_USER, HOME="/home/ray").stdout
    # KubeRay's command: `bash -lc -- "ulimit -n 65536; ray start ..."`; Debian's
    # /etc/profile resets PATH, profile.d must put the venv's `ray` back.
    shell = _run(
        ray,
        ["bash", "-lc", "--", "ulimit -n 65536 2>/dev/null; command -v ray; id -un"],
        RAY_USER,
        HOME="/home/ray",
    )
    assert shell.stdout.split() == ["/opt/venv/bin/ray", "ray"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mock_server(mock: Archive) -> Iterator[int]:
    """`uerl mock-ue` from the image, as uid 10001, on a free loopback port."""
    port = _free_port()
    argv = chroot_argv(
        _rootfs(mock),
        ["uerl", "mock-ue", "--host", "127.0.0.1", "--port", str(port)],
        user=MOCK_USER,
        env=mock.env(),
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield port
    finally:
        # unshare ignores SIGTERM while it waits; killed, it takes the server with it
        # (--kill-child), and the PID namespace any process the server started.
        proc.kill()
        proc.wait(timeout=15)
        if proc.stdout:
            proc.stdout.close()


def test_mock_image_answers_grpc_health(mock_server: int) -> None:
    grpc = pytest.importorskip("grpc")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{mock_server}")
    # A hang guard: the server imports gRPC and uerl in its chroot first.
    deadline = time.monotonic() + guard(180)
    status = None
    while time.monotonic() < deadline:
        try:
            status = (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(), timeout=2)
                .status
            )
            break
        except grpc.RpcError:
            time.sleep(0.5)
    channel.close()
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_inputs_hash_follows_dockerfile_and_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What decides a rebuild: the Dockerfile, the context's files, build args, base."""
    monkeypatch.setattr(build, "CACHE", tmp_path / "cache")
    dockerfile = tmp_path / "mock-ue.Dockerfile"
    shutil.copy2(build.ROOT / "docker" / "mock-ue.Dockerfile", dockerfile)
    image = build.Image("mock-ue", "docker.io/uerl/mock-ue:test", dockerfile)
    context = build.stage_context(image)
    assert (context / "training" / "cli.py").exists()
    assert not list(context.rglob("__pycache__"))
    first = build.inputs_hash(image, context, "base-1")
    assert build.inputs_hash(image, context, "base-1") == first
    assert build.inputs_hash(image, context, "base-2") != first
    dockerfile.write_text(dockerfile.read_text() + "\n# a comment changes the inputs too\n")
    second = build.inputs_hash(image, context, "base-1")
    assert second != first
    (context / "training" / "cli.py").write_text("# changed\n")
    assert build.inputs_hash(image, context, "base-1") != second
    image.build_args["X"] = "1"
    assert build.inputs_hash(image, context, "base-1") not in (first, second)
    os.chmod(context / "README.md", 0o755)
    assert build.inputs_hash(image, context, "base-1") not in (first, second)
