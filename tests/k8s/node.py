"""A real Kubernetes node on this machine, beside a ControlPlane (controlplane.py).

`Node(control_plane)` starts, as root, in a temporary directory: containerd (with
Debian's runc), the kubelet, the CNI bridge of the node's `spec.podCIDR`,
kube-proxy (iptables mode), CoreDNS (cluster.local only, behind the kube-dns
ClusterIP) and kube-router (NetworkPolicy only). Pods then really run; their images
are imported from docker-archives (`import_image`) and named with
`imagePullPolicy: Never`: there is no registry.

No pod traffic leaves the machine: no masquerade, and mangle FORWARD drops
whatever the pod bridge would forward to another interface (or receive from one).
NodePorts listen only on the API address.

On every exit path the node is taken down and the machine left as it was: pods,
containers and sandboxes, shim processes (by pid), mounts under the node's
directory, the bridge and veths, iptables and ipset rules (kube-proxy's,
kube-router's, CNI's, ours), cgroups, the files the pieces write outside the node's
directory, and every sysctl they touched. `leftovers` lists what could not be
undone (empty when all went well).

    with ControlPlane(api_address=NODE_API_ADDRESS) as cp, Node(cp) as node:
        node.import_image(archive)
        cp.kubectl("run", ...)

One node per machine at a time (it owns the bridge name, the cgroup root and the
KUBE-* iptables chains).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane import (
    LOOPBACK,
    NODE_API_ADDRESS,
    POD_CIDR,
    SERVICE_CIDR,
    ControlPlane,
    ControlPlaneError,
    Process,
    _condition_true,
    _die_with_parent,
    _http_ok,
    find_binaries,
    free_ports,
    tail,
)
from host_speed import guard
from lifecycle import StartStop
from node_images import Image, pause_image

HERE = Path(__file__).resolve().parent
# Hang guards (host_speed.guard), not speed goals: a start-up step (the kubelet was Ready
# 4.4 s after its start on the loaded VM); teardown's wait for the kubelet to stop the
# pods (18.5 s for the whole teardown of 15 pods there); a `ctr` command; an image import
# (the Ray image: 69 s).
READY_TIMEOUT_S = guard(180)
PODS_GONE_TIMEOUT_S = guard(180)
CTR_TIMEOUT_S = guard(120)
IMPORT_TIMEOUT_S = guard(600)
INSTALL_PACKAGES = HERE / "build" / "install-node-packages.sh"

# build.sh's pieces the node runs (their binaries: controlplane.PIECES).
NODE_PIECES = ("kubernetes-node", "containerd", "cni-plugins", "coredns", "kube-router")
# What the node runs from Debian (tests/k8s/build/debian-packages.txt).
HOST_TOOLS = (
    "runc",
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables-save",
    "ip6tables-restore",
    "ipset",
    "ip",
)

NODE_POD_CIDR = "10.244.255.0/24"  # in POD_CIDR (kube-proxy's cluster CIDR), far from KWOK's
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "uerl-cni0"
# The kubelet's cgroupRoot, in every v1 hierarchy; under UERL_NODE_CGROUP_PARENT when set
# (.ci/run-capped: the pods then share the run's CPU cap instead of escaping it).
CGROUP_ROOT = str(Path(os.environ.get("UERL_NODE_CGROUP_PARENT", "").strip("/")) / "uerl-node")
CGROUP_FS = Path("/sys/fs/cgroup")
CNI_NETWORK = "uerl-node"
OUR_RULE_COMMENT = "uerl-node: no pod traffic leaves this machine"
# iptables chains of kube-proxy and the kubelet (KUBE-), kube-router (KUBE-ROUTER-,
# KUBE-NWPLCY-, KUBE-POD-FW-, ...) and the CNI portmap plugin (CNI-).
CHAIN_PREFIXES = ("KUBE-", "CNI-")
# ipsets of kube-router (IPv4 and IPv6).
IPSET_PREFIXES = ("KUBE-", "kube-router-", "inet6:KUBE-", "inet6:kube-router-")
# Written outside the node's directory whatever the configuration: libcni's result
# cache, the kubelet's log symlinks and device-plugin socket (/var/lib/kubelet); and
# what containerd and runc would use by default (moved by their configuration):
# removed at the end if they were not there before.
HOST_PATHS = (
    Path("/var/lib/cni"),
    Path("/var/log/containers"),
    Path("/run/containerd"),
    Path("/var/run/netns"),
    Path("/var/lib/kubelet"),
    Path("/opt/containerd"),
)
# Sysctls the pieces change (kubelet: kernel.panic*, vm.overcommit_memory; the bridge
# plugin: forwarding; kube-proxy: route_localnet, bridge-nf, conntrack) and their kin:
# all compared before and after.
SYSCTL_FILES = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "net/ipv4/ip_forward",
    "net/ipv4/ip_local_port_range",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
)
SYSCTL_DIRS = (
    "net/ipv4/conf/all",
    "net/ipv4/conf/default",
    "net/ipv4/conf/lo",
    "net/bridge",
    "net/netfilter",
)
SYSCTL_VOLATILE = {"nf_conntrack_count"}
# The kubelet's start-up writes; put back as soon as it is up, not only at the end.
KUBELET_SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory")
# In the node's directory: the snapshot `--cleanup` restores after a kill.
HOST_STATE_FILE = "host-state-before.json"


class NodeError(ControlPlaneError):
    """The node could not start, or its host prerequisites are missing."""


# ---- the machine's state, before and after ------------------------------------------


@dataclass
class HostState:
    """What a node may change on the machine; two snapshots must be equal after a node."""

    sysctls: dict[str, str] = field(default_factory=dict)
    links: set[str] = field(default_factory=set)
    lo_addresses: set[str] = field(default_factory=set)
    # User chains ("iptables filter KUBE-FORWARD"), built-in ones whose policy is not
    # ACCEPT, every rule ("iptables nat -A ..."), and the nft tables (iptables-nft
    # creates a table, with its empty ACCEPT base chains, on first use).
    chains: set[str] = field(default_factory=set)
    rules: set[str] = field(default_factory=set)
    nft_tables: set[str] = field(default_factory=set)
    our_rules: int = 0
    ipsets: set[str] = field(default_factory=set)
    cgroups: set[str] = field(default_factory=set)  # hierarchies with our cgroup root
    paths: set[str] = field(default_factory=set)  # HOST_PATHS that exist

    def to_json(self) -> str:
        return json.dumps(
            {"sysctls": self.sysctls, "nft_tables": sorted(self.nft_tables),
             "paths": sorted(self.paths)}, indent=1,
        )  # fmt: skip

    @classmethod
    def capture(cls) -> HostState:
        chains, rules = _iptables_chains()
        return cls(
            sysctls=read_sysctls(),
            links=set(_ip_json("link", "show")),
            lo_addresses={
                f"{a['local']}/{a['prefixlen']}"
                for link in _ip_json_raw("-4", "addr", "show", "dev", "lo")
                for a in link.get("addr_info", [])
            },
            chains=chains,
            rules=rules,
            nft_tables=set(_nft_tables()),
            our_rules=sum(OUR_RULE_COMMENT in rule for rule in rules),
            ipsets=set(_ipsets()),
            cgroups={p.relative_to(CGROUP_FS).parts[0] for p in CGROUP_FS.glob(f"*/{CGROUP_ROOT}")},
            paths={str(p) for p in HOST_PATHS if p.exists()},
        )

    def differences(self, after: HostState) -> list[str]:
        """What `after` has that this snapshot had not (or lacks that it had)."""
        out = []
        for key in sorted(self.sysctls.keys() | after.sysctls.keys()):
            if self.sysctls.get(key) != after.sysctls.get(key):
                out.append(f"sysctl {key}: {self.sysctls.get(key)} -> {after.sysctls.get(key)}")
        names = ("links", "lo_addresses", "chains", "rules", "nft_tables", "ipsets", "cgroups",
                 "paths")  # fmt: skip
        for name in names:
            before, now = getattr(self, name), getattr(after, name)
            out += [f"{name}: new {x}" for x in sorted(now - before)]
            out += [f"{name}: gone {x}" for x in sorted(before - now)]
        if after.our_rules != self.our_rules:
            out.append(
                f"iptables rules '{OUR_RULE_COMMENT}': {self.our_rules} -> {after.our_rules}"
            )
        return out


def read_sysctls() -> dict[str, str]:
    root = Path("/proc/sys")
    files = [root / f for f in SYSCTL_FILES]
    for d in SYSCTL_DIRS:
        files += sorted(p for p in (root / d).glob("*") if p.is_file())
    values = {}
    for path in files:
        if path.name in SYSCTL_VOLATILE:
            continue
        with contextlib.suppress(OSError):
            values[str(path.relative_to(root))] = " ".join(path.read_text().split())
    return values


def write_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", key).write_text(value + "\n")


def shim_pids(shim: Path, address: str) -> list[int]:
    """Processes running `shim` (our build's binary) for the containerd at `address`
    (the same binary may serve someone else's containerd: never theirs)."""
    return [pid for pid, argv in _processes_of(shim) if address in argv]


def _processes_of(binary: Path) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process running `binary`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "exe") != str(binary):
                continue
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        found.append((int(proc.name), argv))
    return found


def _node_dir_of(argv: list[str]) -> Path | None:
    """The node directory (/tmp/uerl-node-*) one of the arguments names, if any."""
    pattern = re.escape(str(Path(tempfile.gettempdir()) / "uerl-node-")) + r"[^/\s]+"
    for arg in argv:
        match = re.search(pattern, arg)
        if match:
            return Path(match.group())
    return None


def mounts_under(root: Path) -> list[str]:
    """Mount points at or under `root`, deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape_mount(line.split()[4])
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


# ---- the node ------------------------------------------------------------------------


class Node(StartStop):
    """Context manager: a real node named `name` (kubelet, containerd, CNI, kube-proxy,
    CoreDNS, kube-router) registered with `control_plane`, which must serve on a
    non-loopback address (ControlPlane(api_address=NODE_API_ADDRESS)).

    `timings` says when each piece became ready (seconds since start),
    `start_seconds` the total; `rss_mib()` the pieces' memory; `leftovers` what
    teardown could not undo. The work directory (logs under `logs/`) is removed on a
    clean exit and kept when something failed, or with keep=True / UERL_K8S_KEEP=1.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        *,
        name: str = "uerl-node-0",
        pod_cidr: str = NODE_POD_CIDR,
        ready_timeout_s: float = READY_TIMEOUT_S,
        keep: bool | None = None,
        cpu_cfs_quota: bool = False,
    ) -> None:
        """`cpu_cfs_quota`: enforce containers' CPU limits as a production node does (off
        by default, see the kubelet's config below); bench_pods.py measures both."""
        self.cpu_cfs_quota = cpu_cfs_quota
        if control_plane.api_address == LOOPBACK:
            raise NodeError(
                "the control plane serves on 127.0.0.1, which pods cannot reach: start it "
                "with ControlPlane(api_address=NODE_API_ADDRESS)"
            )
        self.cp = control_plane
        self.address = control_plane.api_address  # the node's InternalIP too
        self.name = name
        self.pod_cidr = pod_cidr
        self.ready_timeout_s = ready_timeout_s
        self.keep = keep if keep is not None else os.environ.get("UERL_K8S_KEEP") == "1"
        self.bin = _find_node_binaries()
        self.workdir = Path()
        self.processes: list[Process] = []
        self.timings: dict[str, float] = {}
        self.start_seconds = 0.0
        self.leftovers: list[str] = []
        self.before: HostState | None = None
        self.sandbox_image: Image | None = None
        self._procs: dict[str, Process] = {}
        self._t0 = 0.0
        self._failed = False
        self._env: dict[str, str] = {}
        self._ports: dict[str, int] = {}

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def start(self) -> None:
        self._t0 = time.monotonic()
        _preflight()
        self.before = HostState.capture()
        _refuse_leftovers(self.before)
        # Under /tmp with a short name: containerd's socket path must fit in 108 bytes.
        self.workdir = Path(tempfile.mkdtemp(prefix="uerl-node-"))
        (self.workdir / "logs").mkdir()
        # For `node.py --cleanup` after a kill: what to put back.
        (self.workdir / HOST_STATE_FILE).write_text(self.before.to_json())
        self._env = {
            **os.environ,
            "HOME": str(self.workdir),
            "PATH": f"{self.bin['containerd'].parent}:{os.environ.get('PATH', '')}",
        }
        names = (
            "kubelet",
            "kubelet-healthz",
            "proxy-metrics",
            "proxy-healthz",
            "dns",
            "dns-health",
            "dns-ready",
        )
        self._ports = dict(zip(names, free_ports(len(names)), strict=True))

        # Before anything turns forwarding on (the bridge plugin does, at the first pod).
        self._install_forward_guard()
        self._make_cgroup_root()

        self.sandbox_image = pause_image()
        containerd = self._spawn(
            "containerd",
            [str(self.bin["containerd"]), "--config", str(self._write_containerd_config())],
        )
        self._wait(
            containerd,
            lambda: self._ctr("version", check=False).returncode == 0,
            "answering on its socket",
        )
        self.import_image(self.sandbox_image.archive)
        self.timings["containerd"] = time.monotonic() - self._t0

        self._write_cni_config()
        self.cp.kubectl("create", "-f", "-", input=json.dumps(self._node_manifest()))
        kubelet = self._spawn("kubelet", self._kubelet_argv())
        self._wait(kubelet, self._ready, f"node {self.name} Ready", step="kubelet")
        # The kubelet set kernel.panic, kernel.panic_on_oops and vm.overcommit_memory at
        # start (and only then): give the machine its own values back at once.
        self._restore_sysctls(KUBELET_SYSCTLS)

        proxy = self._spawn("kube-proxy", self._kube_proxy_argv())
        self._wait(
            proxy,
            lambda: _http_ok(f"http://{LOOPBACK}:{self._ports['proxy-healthz']}/healthz"),
            "/healthz",
        )

        self.cp.apply(self._dns_objects())
        coredns = self._spawn(
            "coredns", [str(self.bin["coredns"]), "-conf", str(self._write_corefile())]
        )
        self._wait(
            coredns,
            lambda: _http_ok(f"http://{LOOPBACK}:{self._ports['dns-ready']}/ready"),
            "/ready",
        )

        router = self._spawn("kube-router", self._kube_router_argv())
        self._wait(
            router,
            lambda: "KUBE-ROUTER-FORWARD" in _iptables_save("iptables", "filter"),
            "its KUBE-ROUTER-FORWARD chain",
        )

        self.start_seconds = time.monotonic() - self._t0
        steps = ", ".join(f"{what} {t:.1f}s" for what, t in self.timings.items())
        (self.workdir / "start-seconds.txt").write_text(f"{self.start_seconds:.2f}\n{steps}\n")
        print(
            f"node {self.name} up in {self.start_seconds:.1f}s ({steps}); "
            f"logs in {self.workdir / 'logs'}"
        )

    def stop(self) -> None:
        """Take the node down and put the machine back as it was (every step is tried
        whatever failed before it); `leftovers` says what could not be undone."""
        errors: list[str] = []

        def step(what: str, fn: Callable[[], object]) -> None:
            try:
                fn()
            except BaseException as exc:  # keep going: each step undoes something else
                errors.append(f"{what}: {exc!r}")

        if self.workdir != Path():
            step("pods", self._delete_pods)
            for name in ("kube-router", "coredns", "kube-proxy", "kubelet"):
                step(f"stop {name}", lambda name=name: self._stop_process(name))
            step("containers", self._remove_containers)
            step("stop containerd", lambda: self._stop_process("containerd"))
            for proc in reversed(self.processes):  # anything started and not yet stopped
                step(f"stop {proc.name}", proc.stop)
            step("shims", self._kill_shims)
            step("cgroup processes", self._kill_cgroup_processes)
            step("mounts", lambda: _unmount_all(self.workdir))
            step("links", self._delete_links)
            step("iptables", _strip_iptables)
            step("nft tables", lambda: _delete_new_nft_tables(
                self.before.nft_tables if self.before else set()))  # fmt: skip
            step("ipsets", self._destroy_ipsets)
            step("cgroups", _remove_cgroup_root)
            step("host paths", self._remove_host_paths)
            step("node object", self._delete_api_objects)
        if self.before is not None:
            step("sysctls", lambda: self._restore_sysctls(tuple(self.before.sysctls)))
            self.leftovers = self.before.differences(HostState.capture())
            self.leftovers += [f"mount {m}" for m in mounts_under(self.workdir)]
            shim = self.bin["containerd-shim-runc-v2"]
            self.leftovers += [
                f"shim pid {p}" for p in shim_pids(shim, str(self.containerd_socket))
            ]
        self.processes.clear()
        if not errors and not self.leftovers:  # restored: nothing for --cleanup to redo
            (self.workdir / HOST_STATE_FILE).unlink(missing_ok=True)
        if self.workdir != Path() and self.workdir.exists():
            if self._failed or self.keep or errors or self.leftovers:
                print(f"node work directory kept: {self.workdir}")
            elif not mounts_under(self.workdir):  # never rm -r through a mount
                shutil.rmtree(self.workdir, ignore_errors=True)
        if errors or self.leftovers:
            raise NodeError("node teardown: " + "; ".join(errors + self.leftovers))

    # ---- for tests -------------------------------------------------------------------

    def import_image(self, archive: Path) -> None:
        """Import a docker-archive (or OCI archive) into the node's containerd, for pods
        that name its tag with imagePullPolicy: Never."""
        self._ctr(
            "-n",
            "k8s.io",
            "images",
            "import",
            "--platform",
            "linux/amd64",
            str(archive),
            timeout_s=IMPORT_TIMEOUT_S,
        )

    def import_images_from_index(self, refs: Iterable[str], index: Path | None = None) -> None:
        """Import images built by tests/k8s/images/ (their index.json: image ref -> an
        entry whose "archive" is the docker-archive, or the archive's path itself)."""
        cache = Path(os.environ.get("UERL_IMAGE_CACHE", "~/.cache/uerl-images")).expanduser()
        index = index or cache / "index.json"
        mapping = json.loads(index.read_text())
        for ref in refs:
            if ref not in mapping:
                raise NodeError(f"{ref} is not in {index} (build it with tests/k8s/images/)")
            entry = mapping[ref]
            self.import_image(Path(entry["archive"] if isinstance(entry, dict) else entry))

    def images(self) -> list[str]:
        out = self._ctr("-n", "k8s.io", "images", "ls", "-q").stdout
        return [line for line in out.splitlines() if line and not line.startswith("sha256:")]

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of each piece, and of all pod shims together."""
        out = {p.name: _rss_mib(p.popen.pid) for p in self.processes if p.popen.poll() is None}
        shims = shim_pids(self.bin["containerd-shim-runc-v2"], str(self.containerd_socket))
        out["shims"] = sum(_rss_mib(pid) for pid in shims)
        out["shim count"] = float(len(shims))
        return out

    def log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    # ---- start-up pieces -------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> Process:
        log = self.log(name)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self._env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        proc = Process(name, popen, log)
        self.processes.append(proc)
        self._procs[name] = proc
        return proc

    def _stop_process(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None:
            proc.stop(timeout_s=20)
            self.processes.remove(proc)

    def _wait(
        self, proc: Process, check: Callable[[], bool], what: str, step: str | None = None
    ) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            for p in [*self.processes, *self.cp.processes]:
                p.check_alive()
            if check():
                self.timings[step or proc.name] = time.monotonic() - self._t0
                return
            if time.monotonic() > deadline:
                raise NodeError(
                    f"timed out after {self.ready_timeout_s:.0f}s waiting for {proc.name}: "
                    f"{what}; last lines of {proc.log}:\n{tail(proc.log)}"
                )
            time.sleep(0.2)

    def ctr(self, *args: str) -> str:
        """`ctr ARGS` against this node's containerd: its output."""
        return self._ctr(*args).stdout

    def _ctr(
        self, *args: str, check: bool = True, timeout_s: float = CTR_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin["ctr"]), "--address", str(self.containerd_socket), *args]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=self._env, check=False
        )
        if check and result.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def _install_forward_guard(self) -> None:
        # mangle FORWARD runs before filter FORWARD, where kube-proxy and kube-router
        # insert (and keep first) their own jumps, some of which ACCEPT.
        for rule in (["-i", BRIDGE, "!", "-o", BRIDGE], ["!", "-i", BRIDGE, "-o", BRIDGE]):
            _run(
                [
                    "iptables",
                    "-w",
                    "-t",
                    "mangle",
                    "-I",
                    "FORWARD",
                    *rule,
                    "-m",
                    "comment",
                    "--comment",
                    OUR_RULE_COMMENT,
                    "-j",
                    "DROP",
                ]
            )

    def _make_cgroup_root(self) -> None:
        # The kubelet refuses a cgroupRoot that does not exist; cpuset needs its cpus
        # and mems filled in before anything can join a child.
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy
            for part in Path(CGROUP_ROOT).parts:  # a parent of UERL_NODE_CGROUP_PARENT's too
                parent, path = path, path / part
                if path.is_dir():
                    continue
                path.mkdir()
                if hierarchy.name == "cpuset":
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        (path / knob).write_text((parent / knob).read_text())

    def _write_containerd_config(self) -> Path:
        base = self.workdir / "containerd"
        cni_bin = self.bin["bridge"].parent
        config = f"""\
version = 4
root = "{base / "root"}"
state = "{base / "state"}"
imports = []  # nothing of the machine's /etc/containerd
# Not wanted here, and some would write outside the node's directory.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[plugins."io.containerd.server.v1.grpc"]
  address = "{self.containerd_socket}"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "{self.containerd_socket}.ttrpc"
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{self.workdir / "s"}"  # not /run/containerd/s
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{self.sandbox_image.ref if self.sandbox_image else ""}"
[plugins."io.containerd.cri.v1.runtime"]
  # root here lacks CAP_SYS_RESOURCE: without this every sandbox fails ("can't get
  # final child's PID from pipe: EOF") trying to lower its OOM score.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true  # not /var/run/netns
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{self.workdir / "cni" / "net.d"}"
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc")}"
        Root = "{self.workdir / "runc"}"  # not /run/containerd/runc
        SystemdCgroup = false
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
"""
        path = base / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
        return path

    def _write_cni_config(self) -> None:
        conf = {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # nothing is NATed off the machine
                    "hairpinMode": True,  # a pod reaching itself through its Service
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        path = self.workdir / "cni" / "net.d" / f"10-{CNI_NETWORK}.conflist"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(conf, indent=2))

    def _node_manifest(self) -> dict[str, Any]:
        # Created before the kubelet registers so that spec.podCIDR is there from the
        # start (the kubelet does not set it; kube-router needs it).
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "uerl-node",
                },
            },
            "spec": {"podCIDR": self.pod_cidr, "podCIDRs": [self.pod_cidr]},
        }

    def _kubelet_argv(self) -> list[str]:
        root = self.workdir / "kubelet"
        (root / "pod-logs").mkdir(parents=True)
        resolv = self.workdir / "resolv.conf"  # pods get no search domain of the host's
        resolv.write_text("")
        ca = Path(self.cp.kubeconfig).parent / "pki" / "ca.crt"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.address,
            "port": self._ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": LOOPBACK,
            "healthzPort": self._ports["kubelet-healthz"],
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "failCgroupV1": False,  # this machine has cgroup v1
            "failSwapOn": False,
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "podLogsDir": str(root / "pod-logs"),
            "registerNode": True,
            # Imported images cannot be pulled again: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            # Requests still decide what fits (scheduling, Ray's advertised CPUs), but a
            # whole uerl stack shares these 2 cores: with CFS quotas its 0.2-CPU pods
            # would train at a fifth of a core each while the other sits idle.
            "cpuCFSQuota": self.cpu_cfs_quota,
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
        }
        path = self.workdir / "kubelet-config.json"
        path.write_text(json.dumps(config, indent=2))
        return [
            str(self.bin["kubelet"]),
            f"--config={path}",
            f"--kubeconfig={self.cp.kubeconfig}",
            f"--root-dir={root}",
            f"--cert-dir={root / 'pki'}",  # not /var/lib/kubelet/pki
            f"--hostname-override={self.name}",
            f"--node-ip={self.address}",
            "--v=2",
        ]

    def _kube_proxy_argv(self) -> list[str]:
        return [
            str(self.bin["kube-proxy"]),
            f"--kubeconfig={self.cp.kubeconfig}",
            f"--hostname-override={self.name}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={POD_CIDR}",
            # NodePorts only on the API address (never on the machine's own interfaces).
            f"--nodeport-addresses={self.address}/32",
            # 0: leave the machine's conntrack sysctls alone.
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            f"--metrics-bind-address={LOOPBACK}:{self._ports['proxy-metrics']}",
            f"--healthz-bind-address={LOOPBACK}:{self._ports['proxy-healthz']}",
            "--v=2",
        ]

    def _dns_objects(self) -> list[dict[str, Any]]:
        """kube-dns: the ClusterIP the kubelet gives pods, its one endpoint CoreDNS on
        the node's address (a host process, so no selector)."""
        port = self._ports["dns"]
        meta = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}}
        return [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "kube-dns", **meta},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": port},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": port},
                    ],
                },
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kube-dns-node",
                    "namespace": "kube-system",
                    "labels": {"kubernetes.io/service-name": "kube-dns", "k8s-app": "kube-dns"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
                "ports": [
                    {"name": "dns", "port": port, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": port, "protocol": "TCP"},
                ],
            },
        ]

    def _write_corefile(self) -> Path:
        # cluster.local and reverse lookups only: no `forward`, nothing asked upstream.
        corefile = f"""\
.:{self._ports["dns"]} {{
    bind {self.address}
    errors
    health {LOOPBACK}:{self._ports["dns-health"]}
    ready {LOOPBACK}:{self._ports["dns-ready"]}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.cp.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"""
        path = self.workdir / "Corefile"
        path.write_text(corefile)
        return path

    def _kube_router_argv(self) -> list[str]:
        return [
            str(self.bin["kube-router"]),
            f"--kubeconfig={self.cp.kubeconfig}",
            f"--hostname-override={self.name}",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--enable-cni=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Its health server would listen on every address: off (readiness is its chains).
            "--health-port=0",
            "--metrics-port=0",
            "--v=1",
        ]

    def _ready(self) -> bool:
        result = self.cp.kubectl("get", "node", self.name, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        node = json.loads(result.stdout)
        return _condition_true(node, "Ready") and not any(
            t["key"] == "node.kubernetes.io/not-ready" for t in node["spec"].get("taints", [])
        )

    # ---- teardown pieces -------------------------------------------------------------

    def _delete_pods(self) -> None:
        """Cordon, then delete every pod on the node and wait (bounded) until the
        kubelet has stopped them: their sandboxes are torn down through CNI."""
        if "kubelet" not in self._procs or self._procs["kubelet"].popen.poll() is not None:
            return
        self.cp.kubectl("cordon", self.name)
        selector = f"--field-selector=spec.nodeName={self.name}"
        self.cp.kubectl(
            "delete", "pods", "--all-namespaces", selector, "--grace-period=1", "--wait=false"
        )
        deadline = time.monotonic() + PODS_GONE_TIMEOUT_S
        while time.monotonic() < deadline:
            out = self.cp.kubectl("get", "pods", "-A", selector, "-o", "name", check=False)
            if out.returncode == 0 and not out.stdout.strip():
                return
            time.sleep(0.5)
        waited = f"{PODS_GONE_TIMEOUT_S:.0f} s"
        raise NodeError(f"pods still on the node after {waited} (removed through containerd)")

    def _remove_containers(self) -> None:
        """Whatever the kubelet left in containerd: tasks killed, containers removed."""
        if "containerd" not in self._procs:
            return
        for task in self._ctr("-n", "k8s.io", "tasks", "ls", "-q", check=False).stdout.split():
            self._ctr("-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task, check=False)
            self._ctr("-n", "k8s.io", "tasks", "delete", "-f", task, check=False)
        for container in self._ctr(
            "-n", "k8s.io", "containers", "ls", "-q", check=False
        ).stdout.split():
            self._ctr("-n", "k8s.io", "containers", "delete", container, check=False)

    def _kill_shims(self) -> None:
        shim = self.bin["containerd-shim-runc-v2"]
        _kill_and_wait(shim_pids(shim, str(self.containerd_socket)), "shim")

    def _kill_cgroup_processes(self) -> None:
        pids: set[int] = set()
        for hierarchy in _cgroup_hierarchies(unified=True):
            for procs in (hierarchy / CGROUP_ROOT).rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids |= {int(p) for p in procs.read_text().split()}
        _kill_and_wait(sorted(pids), "container process")

    def _delete_links(self) -> None:
        # Host ends of pods' veths, then the bridge (veths whose netns is gone are
        # gone already).
        for link in _ip_json_raw("link", "show", "master", BRIDGE) if _link_exists(BRIDGE) else []:
            _run(["ip", "link", "del", link["ifname"]], check=False)
        if _link_exists(BRIDGE):
            _run(["ip", "link", "del", BRIDGE])

    def _destroy_ipsets(self) -> None:
        before = self.before.ipsets if self.before else set()
        for name in _ipsets():
            if name not in before and name.startswith(IPSET_PREFIXES):
                _run(["ipset", "destroy", name], check=False)

    def _remove_host_paths(self) -> None:
        before = self.before.paths if self.before else set()
        for path in HOST_PATHS:
            if str(path) not in before and path.exists():
                if mounts_under(path):
                    raise NodeError(f"{path} still has mounts: {mounts_under(path)}")
                shutil.rmtree(path, ignore_errors=True)
            elif path == Path("/var/lib/cni"):
                _remove_cni_results(path)
            elif path == Path("/var/log/containers"):
                for link in path.glob("*.log"):
                    if str(self.workdir) in os.readlink(link):
                        link.unlink()

    def _delete_api_objects(self) -> None:
        if all(p.popen.poll() is None for p in self.cp.processes):
            self.cp.kubectl("delete", "node", self.name, "--ignore-not-found", check=False)
            self.cp.kubectl(
                "delete",
                "-n",
                "kube-system",
                "service/kube-dns",
                "endpointslice/kube-dns-node",
                "--ignore-not-found",
                check=False,
            )

    def _restore_sysctls(self, keys: Sequence[str]) -> None:
        if self.before is None:
            return
        now = read_sysctls()
        for key in keys:
            value = self.before.sysctls.get(key)
            if value is not None and now.get(key) != value:
                with contextlib.suppress(OSError):  # read-only ones cannot have changed
                    write_sysctl(key, value)


# ---- helpers -------------------------------------------------------------------------


def _find_node_binaries() -> dict[str, Path]:
    return find_binaries(NODE_PIECES)


def _preflight() -> None:
    if os.geteuid() != 0:
        raise NodeError("a real node needs root (containerd, the kubelet, iptables)")
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if missing:
        raise NodeError(f"missing {', '.join(missing)}: run {INSTALL_PACKAGES}")
    if not _cgroup_hierarchies():
        raise NodeError(f"no cgroup v1 hierarchies under {CGROUP_FS}")


def _refuse_leftovers(state: HostState) -> None:
    found = [c for c in state.chains if c.split()[2].startswith(CHAIN_PREFIXES)]
    found += [s for s in state.ipsets if s.startswith(IPSET_PREFIXES)]
    found += [f"link {BRIDGE}"] if BRIDGE in state.links else []
    found += [f"cgroup {h}/{CGROUP_ROOT}" for h in sorted(state.cgroups)]
    found += ["iptables rules of another node"] if state.our_rules else []
    if found:
        raise NodeError(
            "another node runs on this machine, or one was killed and left: "
            f"{', '.join(sorted(found)[:10])}; clean up with "
            f"`python {HERE / 'node.py'} --cleanup`"
        )


def _run(argv: list[str], check: bool = True, input: str | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _ip_json_raw(*args: str) -> list[dict[str, Any]]:
    out = _run(["ip", "-j", *args], check=False)
    return json.loads(out) if out.strip() else []


def _ip_json(*args: str) -> list[str]:
    return [link["ifname"] for link in _ip_json_raw(*args)]


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _iptables_save(cmd: str, table: str | None = None) -> str:
    if shutil.which(f"{cmd}-save") is None:
        return ""
    return _run([f"{cmd}-save", *(["-t", table] if table else [])], check=False)


def _iptables_chains() -> tuple[set[str], set[str]]:
    """User chains and built-in ones with a policy other than ACCEPT (`cmd table chain
    [policy]`), and every rule (`cmd table -A ...`), of both families."""
    chains, rules = set(), set()
    for cmd in ("iptables", "ip6tables"):
        table = ""
        for line in _iptables_save(cmd).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":"):
                name, policy = line[1:].split()[:2]
                if policy == "-":
                    chains.add(f"{cmd} {table} {name}")
                elif policy != "ACCEPT":
                    chains.add(f"{cmd} {table} {name} {policy}")
            elif line.startswith("-A"):
                rules.add(f"{cmd} {table} {line}")
    return chains, rules


def _nft_tables() -> list[str]:
    """`family name` of each nft table (empty without the nft tool)."""
    if shutil.which("nft") is None:
        return []
    out = _run(["nft", "list", "tables"], check=False)
    return [line.removeprefix("table ").strip() for line in out.splitlines() if line.strip()]


def _delete_new_nft_tables(before: set[str]) -> None:
    """The tables iptables-nft created for the node (kube-proxy's, kube-router's and our
    rules are gone by now): iptables itself cannot delete a table. Only empty ones."""
    for table in _nft_tables():
        if table in before or table.split()[0] not in ("ip", "ip6"):
            continue
        listing = _run(["nft", "list", "table", *table.split()], check=False)
        body = [
            line.strip()
            for line in listing.splitlines()
            if line.strip() and not line.strip().startswith(("table ", "chain ", "type ", "}"))
        ]
        if not body:  # nothing but empty base chains
            _run(["nft", "delete", "table", *table.split()])


def _strip_iptables() -> None:
    """Remove KUBE-*/CNI-* chains, every rule jumping to them and our own rules, in
    both families: each changed table is rewritten at once by *-restore (the tables
    left as they are stay untouched). kube-router's --cleanup-config crashes here
    (no IPVS), so it is done here for kube-proxy and kube-router alike."""

    def ours(chain: str) -> bool:
        return chain.startswith(CHAIN_PREFIXES)

    for cmd in ("iptables", "ip6tables"):
        kept_tables = []
        for block in re.split(r"(?m)^(?=\*)", _iptables_save(cmd)):
            lines = block.splitlines()
            if not lines or not lines[0].startswith("*"):
                continue
            kept, changed = [], False
            for line in lines:
                parts = line.split()
                drop = (
                    (line.startswith(":") and ours(line[1:].split()[0]))
                    or (line.startswith("-A") and ours(parts[1]))
                    or (
                        line.startswith("-A")
                        and any(
                            parts[i] in ("-j", "-g") and ours(parts[i + 1])
                            for i in range(len(parts) - 1)
                        )
                    )
                    or OUR_RULE_COMMENT in line
                )
                changed |= drop
                if not drop:
                    kept.append(line)
            if changed:
                kept_tables.append("\n".join(kept) + "\n")
        if kept_tables:
            _run([f"{cmd}-restore", "-w"], input="".join(kept_tables))


def _ipsets() -> list[str]:
    if shutil.which("ipset") is None:
        return []
    return _run(["ipset", "list", "-n"], check=False).split()


def _cgroup_hierarchies(unified: bool = False) -> list[Path]:
    """The cgroup v1 hierarchies, and the hybrid unified one if `unified` (runc creates
    the container's cgroup there too; the kubelet does not need the root there)."""
    return sorted(
        p
        for p in CGROUP_FS.iterdir()
        if p.is_dir() and (p / "cgroup.procs").exists() and (unified or p.name != "unified")
    )


def _remove_cgroup_root() -> None:
    for hierarchy in _cgroup_hierarchies(unified=True):
        root = hierarchy / CGROUP_ROOT
        if not root.exists():
            continue
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
        for path in [*reversed(dirs), root]:
            for _ in range(50):  # a cgroup empties a little after its last process exits
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _kill_and_wait(pids: Sequence[int], what: str) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # A big process (a Ray head) frees its memory before it is gone: seconds when loaded.
    deadline = time.monotonic() + guard(30)
    while time.monotonic() < deadline:
        alive = [
            pid
            for pid in pids
            if Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid)
        ]
        if not alive:
            return
        time.sleep(0.1)
    raise NodeError(f"{what} processes still alive after SIGKILL: {alive}")


def _proc_state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line
    except OSError:
        pass
    return "zombie"  # gone


def _unmount_all(root: Path) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for point in mounts_under(root):
        if libc.umount2(point.encode(), 2) != 0:  # MNT_DETACH
            err = ctypes.get_errno()
            if err not in (22, 2):  # EINVAL: not a mount (any more); ENOENT
                raise NodeError(f"umount {point}: {os.strerror(err)}")


def _unescape_mount(field_: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _remove_cni_results(cni: Path) -> None:
    """libcni's cached results of our network, and of the loopback network of the same
    containers (`<network>-<container id>-<interface>`)."""
    ours = list((cni / "results").glob(f"{CNI_NETWORK}-*"))
    ids = {r.name.removeprefix(f"{CNI_NETWORK}-").rsplit("-", 1)[0] for r in ours}
    for result in ours + [r for i in ids for r in (cni / "results").glob(f"cni-loopback-{i}-*")]:
        result.unlink(missing_ok=True)


def cleanup_leftovers() -> list[str]:
    """Undo what a killed node left (no node may be running): the processes of its
    directory (/tmp/uerl-node-*: shims and containerd, by pid, only those whose
    arguments name such a directory), mounts there, the bridge, iptables chains and
    rules, kube-router's ipsets, the cgroup root, the sysctls it changed. Refuses while
    a node's kubelet runs. Returns what it did."""
    done = []
    bins = _find_node_binaries()
    live = [pid for pid, argv in _processes_of(bins["kubelet"]) if _node_dir_of(argv)]
    if live:
        raise NodeError(f"a node is running (kubelet pid {live}): stop its test first")
    for name in ("kube-router", "coredns", "kube-proxy", "containerd", "containerd-shim-runc-v2"):
        pids = [pid for pid, argv in _processes_of(bins[name]) if _node_dir_of(argv)]
        if pids:
            _kill_and_wait(pids, name)
            done.append(f"killed {name} {pids}")
    for hierarchy in _cgroup_hierarchies(unified=True):
        for procs in (hierarchy / CGROUP_ROOT).rglob("cgroup.procs"):
            pids = [int(p) for p in procs.read_text().split()]
            if pids:
                _kill_and_wait(pids, "container process")
                done.append(f"killed {pids} in {procs.parent}")
    for workdir in Path(tempfile.gettempdir()).glob("uerl-node-*"):
        if mounts_under(workdir):
            _unmount_all(workdir)
            done.append(f"unmounted under {workdir}")
    if _link_exists(BRIDGE):
        _run(["ip", "link", "del", BRIDGE])
        done.append(f"deleted {BRIDGE}")
    chains, rules = _iptables_chains()
    ours = any(OUR_RULE_COMMENT in rule for rule in rules)
    if ours or any(c.split()[2].startswith(CHAIN_PREFIXES) for c in chains):
        _strip_iptables()
        done.append("removed KUBE-*/CNI-* iptables chains and our rules")
    for name in _ipsets():
        if name.startswith(IPSET_PREFIXES):
            _run(["ipset", "destroy", name], check=False)
            done.append(f"destroyed ipset {name}")
    lo = _run(["ip", "-4", "-o", "addr", "show", "dev", "lo"], check=False)
    if f" {NODE_API_ADDRESS}/" in lo:  # a killed ControlPlane(api_address=...)'s
        _run(["ip", "addr", "del", f"{NODE_API_ADDRESS}/32", "dev", "lo"])
        done.append(f"removed {NODE_API_ADDRESS}/32 from lo")
    if any((h / CGROUP_ROOT).exists() for h in _cgroup_hierarchies(unified=True)):
        _remove_cgroup_root()
        done.append(f"removed cgroup {CGROUP_ROOT}")
    for saved in Path(tempfile.gettempdir()).glob(f"uerl-node-*/{HOST_STATE_FILE}"):
        before = json.loads(saved.read_text())
        now = read_sysctls()
        for key, value in before["sysctls"].items():
            if now.get(key) != value:
                with contextlib.suppress(OSError):
                    write_sysctl(key, value)
                    done.append(f"sysctl {key}: {now.get(key)} -> {value}")
        _delete_new_nft_tables(set(before["nft_tables"]))
        for path in HOST_PATHS:
            if str(path) not in before["paths"] and path.exists() and not mounts_under(path):
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"removed {path}")
        saved.rename(saved.with_suffix(".restored"))
    return done


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--cleanup"]:
        sys.exit(f"usage: {sys.argv[0]} --cleanup   (undo what a killed node left behind)")
    try:
        done = cleanup_leftovers()
    except NodeError as exc:
        sys.exit(f"node.py --cleanup: {exc}")
    for line in done or ["nothing to clean up"]:
        print(line)
