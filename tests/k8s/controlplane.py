"""A real Kubernetes control plane on 127.0.0.1 for tests, with simulated nodes.

`ControlPlane` starts, in a temporary directory and on free loopback ports:
kine (the etcd API over SQLite), kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK (which makes fake Nodes Ready and scheduled Pods Running)
and, optionally, the KubeRay operator as a plain process. It creates fake Nodes
big enough for a dev stack, a ReadWriteMany PersistentVolume (the game build's claim)
and a pool of ReadWriteOnce ones (the stacks' runs claims), and writes an admin
kubeconfig (`.kubeconfig`).

Binaries come from tests/k8s/build/build.sh's cache; nothing is downloaded here.
Nodes and Pods are simulated: Pod and Service IPs are fake and never contacted;
every connection made here goes to 127.0.0.1.

    with ControlPlane() as cp:
        cp.kubectl("get", "nodes")
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# tests/ (host_speed, proc_tree): on the path under pytest (tests/conftest.py), not when a
# bench script runs from tests/k8s.
sys.path.append(str(Path(__file__).resolve().parents[1]))
from host_speed import guard
from lifecycle import StartStop

HERE = Path(__file__).resolve().parent
BUILD_DIR = HERE / "build"
BUILD_SCRIPT = BUILD_DIR / "build.sh"
REPO = HERE.parents[1]
# Upstream data the repository carries, unmodified (third_party/README.md).
THIRD_PARTY = REPO / "third_party"
KWOK_STAGES_DIR = THIRD_PARTY / "kwok-stages-v0.8.0"
KUBERAY_CHART_DIR = THIRD_PARTY / "kuberay-operator-1.7.0"
KUBERAY_CRDS_DIR = KUBERAY_CHART_DIR / "crds"

KUBERAY_CRD_NAMES = frozenset(
    f"{plural}.ray.io" for plural in ("rayclusters", "rayjobs", "rayservices")
)

LOOPBACK = "127.0.0.1"
# Hang guards (host_speed.guard), not speed goals. A start-up step: the whole start took
# 17-39 s warm on the loaded 2-core VM (apiserver ready 4.5 s idle).
READY_TIMEOUT_S = guard(180)
# Any one kubectl command (a `kubectl wait --timeout=` inside it stays below this).
KUBECTL_TIMEOUT_S = guard(300)
# ReadWriteOnce volumes for the stacks' runs claims: more than the stacks one control plane
# holds in a run (a claim a destroyed stack released is not bound again: Retain).
RWO_VOLUMES = 32
SERVICE_CIDR = "10.96.0.0/16"  # ClusterIPs: fake with KWOK, real with a node (node.py)
POD_CIDR = "10.244.0.0/16"  # KWOK's fake Pod IPs, never contacted; a real node's are inside
# The API server's address when pods must reach it (ControlPlane(api_address=...)):
# an extra /32 on `lo` (this kernel has no dummy links), so it stays on this machine.
NODE_API_ADDRESS = "10.250.0.1"
# Addresses _http_ok may contact: loopback and the /32s our control planes put on lo.
_LOCAL_ADDRESSES = {LOOPBACK}
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

# tests/k8s/build/build.sh's pieces and the binaries each one puts in its bin/.
PIECES: dict[str, tuple[str, ...]] = {
    "kubernetes": ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
    "kine": ("kine",),
    "kwok": ("kwok",),
    "kuberay": ("kuberay-operator",),
    "pulumi": ("pulumi",),
    "pulumi-language-python": (
        "pulumi-language-python",
        "pulumi-language-python-exec",
        "pulumi-resource-pulumi-python",  # serves dynamic resources (infra's KubeRayCRDs)
    ),
    "pulumi-kubernetes": ("pulumi-resource-kubernetes",),
    # Pulumi YAML's language host (test_component_package.py's YAML program).
    "pulumi-yaml": ("pulumi-language-yaml",),
    # The real node (node.py).
    "kubernetes-node": ("kubelet", "kube-proxy"),
    "containerd": ("containerd", "containerd-shim-runc-v2", "ctr"),
    "cni-plugins": ("bridge", "host-local", "loopback", "portmap"),
    "coredns": ("coredns",),
    "kube-router": ("kube-router",),
    # The S3-compatible object store of the run storage tests.
    "seaweedfs": ("weed",),
}
# versions.env names a piece's version <PIECE>_VERSION, except these.
_VERSION_KEYS = {"pulumi-language-python": "pulumi", "kubernetes-node": "kubernetes"}


class BinariesMissing(RuntimeError):
    """A binary the control plane needs has not been built."""


class ControlPlaneError(RuntimeError):
    """A component did not start or become ready."""


class ProcessExited(ControlPlaneError):
    """One of the control plane's processes exited."""


def pinned_versions() -> dict[str, str]:
    """The NAME_VERSION=value pins of tests/k8s/build/versions.env, keyed by piece."""
    pins = {}
    for line in (BUILD_DIR / "versions.env").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.endswith("_VERSION") and not name.startswith("#"):
            pins[name.removesuffix("_VERSION").lower().replace("_", "-")] = value.strip()
    return {piece: pins[_VERSION_KEYS.get(piece, piece)] for piece in PIECES}


def cache_dir() -> Path:
    return Path(os.environ.get("UERL_K8S_CACHE", Path.home() / ".cache" / "uerl-k8s"))


def piece_bin_dir(piece: str) -> Path:
    return cache_dir() / f"{piece}-{pinned_versions()[piece]}" / "bin"


def piece_recipe(piece: str) -> str:
    """What build.sh records as the piece's recipe: its wrapper module's go.mod and go.sum
    (a piece built from other ones is stale though its version matches)."""
    wrapper = Path(__file__).parent / "build" / piece
    if not (wrapper / "go.mod").is_file():
        return ""
    files = [wrapper / "go.mod", wrapper / "go.sum"]
    data = b"".join(f.read_bytes() for f in files if f.is_file())
    return hashlib.sha256(data).hexdigest()[:16]


def piece_built(piece: str) -> bool:
    """Built by build.sh, from the wrapper module in this checkout."""
    marker = piece_bin_dir(piece).parent / ".complete"
    try:
        lines = marker.read_text().splitlines()
    except OSError:
        return False
    recorded = next((ln.removeprefix("recipe=") for ln in lines if ln.startswith("recipe=")), "")
    return recorded == piece_recipe(piece)


def find_binaries(pieces: Sequence[str]) -> dict[str, Path]:
    """Paths of the pieces' binaries, or BinariesMissing saying how to build them."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for piece in pieces:
        bin_dir = piece_bin_dir(piece)
        complete = piece_built(piece)
        for name in PIECES[piece]:
            path = bin_dir / name
            if complete and os.access(path, os.X_OK):
                found[name] = path
            else:
                missing.append(str(path))
    if missing:
        raise BinariesMissing(
            "the Kubernetes test binaries are not built; run tests/k8s/build/build.sh "
            f"(cache {cache_dir()}, override with UERL_K8S_CACHE). Missing: {', '.join(missing)}"
        )
    return found


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (all held open until all are chosen)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _die_with_parent() -> None:
    # Between fork and exec: SIGTERM the child if the (forking) thread exits,
    # so nothing outlives a test process that is SIGKILLed.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise ProcessExited(
                f"{self.name} exited with status {code}; last lines of {self.log}:\n"
                f"{tail(self.log)}"
            )

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM this process (by its own pid), then SIGKILL after `timeout_s`."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(timeout=timeout_s)


@dataclass(frozen=True)
class FakeNode:
    name: str
    cpu: str = "32"
    memory: str = "64Gi"
    pods: str = "110"
    # Ray pods request ephemeral storage (topology `ephemeral_storage`): a node that
    # advertises none fits no such pod.
    ephemeral_storage: str = "1Ti"


class ControlPlane(StartStop):
    """Context manager: a control plane with KWOK nodes (and the KubeRay operator).

    `kubeconfig` is the admin kubeconfig; `kubectl(...)` runs the built kubectl
    with it. `start_seconds` is how long start-up took. The work directory (logs
    of every process under `logs/`) is removed on a clean exit and kept, with
    its path printed, when start-up or the body failed, or if keep=True /
    UERL_K8S_KEEP=1.
    """

    def __init__(
        self,
        *,
        nodes: Sequence[FakeNode] = (FakeNode("kwok-node-0"),),
        kuberay_operator: bool = True,
        kuberay_crds: bool = True,
        rwx_volume: bool = True,
        ready_timeout_s: float = READY_TIMEOUT_S,
        keep: bool | None = None,
        api_address: str | None = None,
    ) -> None:
        """api_address: serve the API on this address instead of 127.0.0.1, added to
        `lo` as a /32 for the control plane's lifetime (it must not be on the machine
        already). A real node (node.py) needs it: pods reach the API server through
        the `kubernetes` Service, whose endpoint cannot be a loopback address, and
        the API server reaches the kubelet there."""
        pieces = ["kubernetes", "kine", "kwok"] + (["kuberay"] if kuberay_operator else [])
        self.bin = find_binaries(pieces)
        self.nodes = tuple(nodes)
        self.kuberay_operator = kuberay_operator
        # False: no CRDs at start; whoever installs them (the chart, through
        # `pulumi up`) calls start_kuberay_operator_once_crds() meanwhile.
        self.kuberay_crds = kuberay_crds
        self._operator: Process | None = None
        self._operator_ports: tuple[int, int] = (0, 0)
        self.rwx_volume = rwx_volume
        self.ready_timeout_s = ready_timeout_s
        self.api_address = api_address or LOOPBACK
        self._added_lo_address = False
        self.keep = keep if keep is not None else os.environ.get("UERL_K8S_KEEP") == "1"
        self.workdir = Path()
        self.kubeconfig = Path()
        self.server = ""
        self.start_seconds = 0.0
        self.timings: dict[str, float] = {}  # what became ready -> seconds since start
        self.processes: list[Process] = []
        self._env: dict[str, str] = {}
        self._t0 = 0.0
        self._failed = False

    # ---- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.workdir = Path(tempfile.mkdtemp(prefix="uerl-k8s-"))
        (self.workdir / "logs").mkdir()
        (self.workdir / "home").mkdir()
        self._env = {**os.environ, "HOME": str(self.workdir / "home")}
        (
            kine_port,
            kine_metrics,
            api_port,
            kcm_port,
            sched_port,
            kwok_port,
            op_metrics,
            op_probe,
        ) = free_ports(8)
        self._operator_ports = (op_metrics, op_probe)
        if self.api_address != LOOPBACK:
            self._add_lo_address()
        pki = self._make_pki()
        self.server = f"https://{self.api_address}:{api_port}"
        self.kubeconfig = self._write_kubeconfig(pki)
        self._env["KUBECONFIG"] = str(self.kubeconfig)

        kine = self._spawn(
            "kine",
            [
                str(self.bin["kine"]),
                f"--listen-address={LOOPBACK}:{kine_port}",
                f"--metrics-bind-address={LOOPBACK}:{kine_metrics}",
            ],
            cwd=self.workdir / "kine",
        )
        self._wait(kine, lambda: _tcp_open(kine_port), "accepting connections")

        # The "kubernetes" Service's endpoint would be 127.0.0.1, which Endpoints
        # validation rejects: the API server keeps none. On api_address the one
        # endpoint pods need is written once below, with nothing to reconcile.
        node_flags = ["--endpoint-reconciler-type=none"]
        if self.api_address != LOOPBACK:
            node_flags += [
                # Logs, exec and port-forward: the API server authenticates to the
                # kubelet as the admin (the kubelet asks the API server to authorize).
                f"--kubelet-client-certificate={pki['admin.crt']}",
                f"--kubelet-client-key={pki['admin.key']}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin["kube-apiserver"]),
                f"--etcd-servers=http://{LOOPBACK}:{kine_port}",
                f"--bind-address={self.api_address}",
                f"--advertise-address={self.api_address}",
                f"--secure-port={api_port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki['serving.crt']}",
                f"--tls-private-key-file={pki['serving.key']}",
                f"--client-ca-file={pki['ca.crt']}",
                f"--service-account-key-file={pki['sa.pub']}",
                f"--service-account-signing-key-file={pki['sa.key']}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                *node_flags,
                "--profiling=false",
            ],
        )
        ctx = ssl.create_default_context(cafile=str(pki["ca.crt"]))
        ctx.load_cert_chain(str(pki["admin.crt"]), str(pki["admin.key"]))
        self._wait(apiserver, lambda: _http_ok(f"{self.server}/readyz", ctx), "/readyz")
        if self.api_address != LOOPBACK:
            slice_ = _as_list([_api_endpoint_slice(self.api_address, api_port)])
            self._wait(
                apiserver,
                lambda: self.kubectl("apply", "-f", "-", input=slice_, check=False).returncode == 0,
                "the kubernetes Service's EndpointSlice written",  # once "default" exists
            )

        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their own self-signed serving certs
        common = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}",
        ]
        kcm = self._spawn(
            "kube-controller-manager",
            [
                str(self.bin["kube-controller-manager"]),
                *common,
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                f"--service-account-private-key-file={pki['sa.key']}",
                f"--root-ca-file={pki['ca.crt']}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--use-service-account-credentials=false",
                # KWOK renews the fake nodes' leases; on a loaded 2-core machine a renewal
                # can lag past the default 50 s grace, and the node controller then marks
                # every pod NotReady for good (KWOK does not set Ready again).
                "--node-monitor-grace-period=10m",
            ],
        )
        scheduler = self._spawn(
            "kube-scheduler",
            [
                str(self.bin["kube-scheduler"]),
                *common,
                f"--secure-port={sched_port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
            ],
        )
        stages = self._write_kwok_config()
        kwok = self._spawn(
            "kwok",
            [
                str(self.bin["kwok"]),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=" + "=".join(KWOK_NODE_ANNOTATION),
                f"--server-address={LOOPBACK}:{kwok_port}",
                # The fake nodes' kubelet endpoint: KWOK's own server, on loopback.
                f"--node-ip={LOOPBACK}",
                f"--node-port={kwok_port}",
                f"--cidr={POD_CIDR}",
            ],
        )
        for proc, port in ((kcm, kcm_port), (scheduler, sched_port)):
            url = f"https://{LOOPBACK}:{port}/healthz"
            self._wait(proc, lambda url=url: _http_ok(url, insecure), "/healthz")
        self._wait(kwok, lambda: _http_ok(f"http://{LOOPBACK}:{kwok_port}/healthz"), "/healthz")

        # Created (not applied) so that the Nodes' status (capacity) is kept.
        objects = [_node_manifest(node) for node in self.nodes]
        if self.rwx_volume:
            objects.append(self._rwx_volume_manifest())
            objects += self._rwo_volume_manifests()
        self.kubectl("create", "-f", "-", input=_as_list(objects))
        names = [node.name for node in self.nodes]
        self._wait(kwok, self._nodes_ready, f"nodes {names} Ready", step="nodes Ready")

        if self.kuberay_operator and self.kuberay_crds:
            self.kubectl("apply", "--server-side", "-f", str(KUBERAY_CRDS_DIR))
            self.kubectl(
                "wait", "--for=condition=Established", f"--timeout={guard(120):.0f}s", "crd",
                "--all",
            )  # fmt: skip
            self.start_kuberay_operator()

        self.start_seconds = time.monotonic() - self._t0
        steps = ", ".join(f"{what} {t:.1f}s" for what, t in self.timings.items())
        (self.workdir / "start-seconds.txt").write_text(f"{self.start_seconds:.2f}\n{steps}\n")
        print(f"control plane up in {self.start_seconds:.1f}s at {self.server} ({steps})")
        print(f"control plane kubeconfig {self.kubeconfig}, logs in {self.workdir / 'logs'}")

    def stop(self) -> None:
        """Stop every started process, newest first, each by its own pid."""
        errors = []
        while self.processes:
            proc = self.processes.pop()
            try:
                proc.stop()
            except BaseException as exc:  # keep stopping the others
                errors.append(f"{proc.name} (pid {proc.popen.pid}): {exc!r}")
        if self._added_lo_address:
            try:
                self._ip("addr", "del", f"{self.api_address}/32", "dev", "lo")
                _LOCAL_ADDRESSES.discard(self.api_address)
                self._added_lo_address = False
            except ControlPlaneError as exc:
                errors.append(str(exc))
        if self.workdir != Path() and self.workdir.exists():
            if self._failed or self.keep:
                print(f"control plane work directory kept: {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise ControlPlaneError("could not stop: " + "; ".join(errors))

    # ---- the KubeRay operator --------------------------------------------------

    def start_kuberay_operator(self) -> None:
        """The real operator as a process (a chart's operator pod is simulated, so
        it reconciles nothing). Its CRDs must be established first."""
        if self._operator is not None and self._operator.popen.poll() is None:
            return
        op_metrics, op_probe = self._operator_ports
        self._operator = self._spawn(
            "kuberay-operator",
            [
                str(self.bin["kuberay-operator"]),
                "--enable-leader-election=false",
                f"--metrics-addr={LOOPBACK}:{op_metrics}",
                f"--health-probe-bind-address={LOOPBACK}:{op_probe}",
                "--log-stdout-encoder=console",
            ],
        )
        self._wait(
            self._operator, lambda: _http_ok(f"http://{LOOPBACK}:{op_probe}/readyz"), "/readyz"
        )

    def start_kuberay_operator_once_crds(self) -> bool:
        """Start the operator if it is not running and its CRDs are established
        (non-blocking otherwise). Returns whether it is running."""
        if self._operator is not None and self._operator.popen.poll() is None:
            return True
        if not self.crds_established():
            return False
        self.start_kuberay_operator()
        return True

    def stop_kuberay_operator(self) -> None:
        """Before its CRDs go away (a destroy): controller-runtime exits on a lost kind."""
        if self._operator is not None:
            self._operator.stop()
            self.processes.remove(self._operator)
            self._operator = None

    def crds_established(self) -> bool:
        result = self.kubectl("get", "crd", "-o", "json", check=False)
        if result.returncode != 0:
            return False
        established = {
            crd["metadata"]["name"]
            for crd in json.loads(result.stdout)["items"]
            if _condition_true(crd, "Established")
        }
        return established >= KUBERAY_CRD_NAMES

    # ---- helpers for tests -----------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = KUBECTL_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this control plane."""
        argv = [str(self.bin["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=self._env,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stderr}{result.stdout}"
            )
        return result

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, objects: Sequence[dict[str, Any]], *args: str) -> str:
        """kubectl apply (server-side) of `objects`."""
        return self.kubectl(
            "apply", "--server-side", "--field-manager=uerl-tests", *args, "-f", "-",
            input=_as_list(objects),
        ).stdout  # fmt: skip

    def wait_until(
        self, check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.5
    ) -> None:
        """Poll `check` until true; on timeout raise ControlPlaneError naming `what`.

        Any of our processes dying meanwhile raises at once with its log's tail.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            for proc in self.processes:
                proc.check_alive()
            if check():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(interval_s)

    def log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    # ---- internals -------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], cwd: Path | None = None) -> Process:
        cwd = cwd or self.workdir
        cwd.mkdir(parents=True, exist_ok=True)
        log = self.log(name)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=self._env,
                start_new_session=True,  # a terminal Ctrl-C reaches only us; we stop them
                preexec_fn=_die_with_parent,
            )
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def _wait(
        self, proc: Process, check: Callable[[], bool], what: str, step: str | None = None
    ) -> None:
        try:
            self.wait_until(check, self.ready_timeout_s, f"{proc.name}: {what}")
            self.timings[step or proc.name] = time.monotonic() - self._t0
        except ProcessExited:
            raise
        except ControlPlaneError as exc:
            raise ControlPlaneError(f"{exc}; last lines of {proc.log}:\n{tail(proc.log)}") from None

    def _ip(self, *args: str) -> str:
        result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ControlPlaneError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _add_lo_address(self) -> None:
        address = ipaddress.ip_address(self.api_address)  # also checks the format
        on_lo = self._ip("-4", "-o", "addr", "show", "dev", "lo")
        if f" {address}/" in on_lo:
            raise ControlPlaneError(
                f"{address} is already on lo: another control plane with a node, or one "
                f"that was killed (then: ip addr del {address}/32 dev lo)"
            )
        self._ip("addr", "add", f"{address}/32", "dev", "lo")
        self._added_lo_address = True
        _LOCAL_ADDRESSES.add(str(address))

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(
            ["openssl", *args], cwd=self.workdir / "pki", capture_output=True, text=True
        )
        if result.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{result.stderr}")

    def _make_pki(self) -> dict[str, Path]:
        """A CA, the API server's serving cert, an admin client cert, the SA key."""
        pki = self.workdir / "pki"
        pki.mkdir()
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl(
            "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "7",
            "-subj", "/CN=uerl-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        sans = [
            f"IP:{LOOPBACK}",
            *([f"IP:{self.api_address}"] if self.api_address != LOOPBACK else []),
            "DNS:localhost",
            "IP:10.96.0.1",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
        leaves = {
            "serving": ("/CN=kube-apiserver", "serverAuth", ",".join(sans)),
            "admin": ("/O=system:masters/CN=uerl-admin", "clientAuth", None),
        }
        for name, (subject, usage, san) in leaves.items():
            ext = pki / f"{name}.ext"
            lines = [
                "basicConstraints=critical,CA:FALSE",
                "keyUsage=critical,digitalSignature,keyEncipherment",
                f"extendedKeyUsage={usage}",
            ]
            if san:
                lines.append(f"subjectAltName={san}")
            ext.write_text("\n".join(lines) + "\n")
            self._openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                          "-subj", subject)  # fmt: skip
            self._openssl(
                "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "7",
                "-extfile", ext.name, "-out", f"{name}.crt",
            )  # fmt: skip
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
        self._openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        names = ["ca.crt", "serving.crt", "serving.key", "admin.crt", "admin.key", "sa.key"]
        return {name: pki / name for name in [*names, "sa.pub"]}

    def _write_kubeconfig(self, pki: dict[str, Path]) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "uerl-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(pki["ca.crt"]),
                    },
                }
            ],
            "users": [
                {
                    "name": "uerl-admin",
                    "user": {
                        "client-certificate": str(pki["admin.crt"]),
                        "client-key": str(pki["admin.key"]),
                    },
                }
            ],
            "contexts": [
                {"name": "uerl-test", "context": {"cluster": "uerl-test", "user": "uerl-admin"}}
            ],
            "current-context": "uerl-test",
        }
        path = self.workdir / "kubeconfig"
        path.write_text(json.dumps(config, indent=2))  # JSON is valid kubeconfig YAML
        path.chmod(0o600)
        return path

    def _write_kwok_config(self) -> Path:
        stages = sorted(KWOK_STAGES_DIR.glob("*.yaml"))
        if not stages:
            raise ControlPlaneError(f"no KWOK stages in {KWOK_STAGES_DIR}")
        path = self.workdir / "kwok-stages.yaml"
        path.write_text("\n---\n".join(p.read_text().strip() for p in stages) + "\n")
        return path

    def _rwx_volume_manifest(self) -> dict[str, Any]:
        # For a ReadWriteMany claim with no storage class (such as the
        # executables claim). hostPath: on the real node, this machine's directory.
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "uerl-test-rwx"},
            "spec": {
                "capacity": {"storage": "100Gi"},
                # Not ReadWriteOnce: the runs claims bind the pool below.
                "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(self.workdir / "rwx-volume")},
            },
        }

    def _rwo_volume_manifests(self) -> list[dict[str, Any]]:
        """Static provisioning, as a cluster without a dynamic provisioner has it: a pool
        of volumes the PV controller binds the stacks' ReadWriteOnce claims (runs) to, one
        each. Each is a directory on this machine that the pods' non-root users may
        write (a hostPath volume gets no fsGroup)."""
        volumes = []
        for index in range(RWO_VOLUMES):
            path = self.workdir / f"rwo-volume-{index}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
            volumes.append(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": f"uerl-test-rwo-{index}"},
                    "spec": {
                        "capacity": {"storage": "100Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "hostPath": {"path": str(path)},
                    },
                }
            )
        return volumes

    def _nodes_ready(self) -> bool:
        result = self.kubectl("get", "nodes", "-o", "json", check=False)
        if result.returncode != 0:
            return False
        ready = {
            item["metadata"]["name"]
            for item in json.loads(result.stdout)["items"]
            if _condition_true(item, "Ready")
            and not any(
                t["key"].startswith("node.kubernetes.io/")
                for t in item.get("spec", {}).get("taints", [])
            )
        }
        return all(node.name in ready for node in self.nodes)


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    """Whether the object's status has condition `kind` with status "True"."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def _as_list(objects: Sequence[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})


def _api_endpoint_slice(address: str, port: int) -> dict[str, Any]:
    """The "kubernetes" Service's endpoint (what the API server's reconciler would
    write): kube-proxy sends 10.96.0.1:443 there."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }


def _node_manifest(node: FakeNode) -> dict[str, Any]:
    resources = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": node.pods,
        "ephemeral-storage": node.ephemeral_storage,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1]},
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


def _tcp_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex((LOOPBACK, port)) == 0


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    assert url.split("/")[2].split(":")[0] in _LOCAL_ADDRESSES, url  # this machine only
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False
