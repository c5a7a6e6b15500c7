"""Every pod uerl creates passes the `restricted` Pod Security Standard.

One function, `restrict`, applied to each pod spec the builders make (Ray head,
learners, workers with their sidecar games, networked games and their forwarder,
the loader Job): non-root with a numeric user (the kubelet cannot check a named
one), no privilege escalation, every capability dropped, seccomp `RuntimeDefault`,
and one writable `emptyDir` at /tmp (the game's $HOME, Ray's sessions). Root
filesystems are read-only except the Ray containers': Ray jobs and user code write
under $HOME (uv/pip caches of runtime environments, a run directory started there),
and the image keeps its Python in $HOME, so it cannot be covered by a volume.
KubeRay copies the Ray container's security context into the init container it
injects, so that one passes too.
"""

from __future__ import annotations

from typing import Any

from infra.manifests.common import K8sObject
from infra.topology import Topology

NAMESPACE_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
TMP_VOLUME = "uerl-tmp"
TMP_PATH = "/tmp"
# The numeric users of every container uerl creates, in one place.
# rayproject/ray images run as `ray` (1000, group `users` 100).
RAY_UID, RAY_GID = 1000, 100
# Packaged Unreal games refuse to run as root; the loader writes the build as this
# user too, so the game owns what it runs.
UNREAL_UID = 1000
# docker/mock-ue.Dockerfile's user.
MOCK_UID = 10001
# The forwarder and the wait-for-build check need no files of their own.
NOBODY_UID = 65534
# What a restricted container may not do, whatever its image.
# The volume types `restricted` allows; any other (hostPath, nfs, gitRepo, ...) is refused.
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
# The sysctls `baseline` (and so `restricted`) allows, v1.36.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
_LOCKED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def container_context(
    uid: int, gid: int | None = None, *, read_only_root: bool = True
) -> dict[str, Any]:
    """The security context of a container running as `uid` (and `gid`)."""
    out: dict[str, Any] = {"runAsUser": uid, "readOnlyRootFilesystem": read_only_root}
    if gid is not None:
        out["runAsGroup"] = gid
    return out  # `restrict` adds what every container gets


def restrict(pod_spec: dict[str, Any], *, fs_group: int | None = None) -> dict[str, Any]:
    """Locks down `pod_spec` in place (and returns it). Every container must already
    say which numeric user it runs as (`container_context`); a builder that forgot is
    a bug, caught here rather than by the API server."""
    pod_context: dict[str, Any] = {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if fs_group is not None:
        pod_context["fsGroup"] = fs_group  # volumes the pod writes (the build, the runs)
    pod_spec["securityContext"] = pod_context
    containers = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    for container in containers:
        context = container.get("securityContext") or {}
        if not isinstance(context.get("runAsUser"), int) or context["runAsUser"] == 0:
            raise ValueError(f"container {container['name']!r}: no non-root runAsUser set")
        context = {"readOnlyRootFilesystem": True} | context  # unless the builder said why not
        container["securityContext"] = context | _LOCKED | {"runAsNonRoot": True}
        mounts = container.setdefault("volumeMounts", [])
        if not any(m["mountPath"] == TMP_PATH for m in mounts):
            mounts.append({"name": TMP_VOLUME, "mountPath": TMP_PATH})
    volumes = pod_spec.setdefault("volumes", [])
    if not any(v["name"] == TMP_VOLUME for v in volumes):
        volumes.append({"name": TMP_VOLUME, "emptyDir": {}})
    return pod_spec


def namespace_labels(topology: Topology) -> dict[str, str]:
    """A namespace uerl creates enforces the topology's Pod Security Standard."""
    return {NAMESPACE_ENFORCE_LABEL: topology.security.pod_security}


def violations(pod_spec: dict[str, Any]) -> list[str]:
    """What in `pod_spec` the `restricted` standard forbids (empty: it passes). The
    checks of Kubernetes' PodSecurity admission for `restricted`, v1.36, on the
    fields uerl sets; used by the tests on every rendered pod."""
    out: list[str] = []
    pod = pod_spec.get("securityContext") or {}
    if pod_spec.get("hostNetwork") or pod_spec.get("hostPID") or pod_spec.get("hostIPC"):
        out.append("host namespaces")
    for vol in pod_spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        for kind in sorted(kinds - RESTRICTED_VOLUME_TYPES):
            out.append(f"volume {vol['name']}: {kind}")
    for sysctl in pod.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')}")
    out += _selinux_and_apparmor("pod", pod)
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        name = container["name"]
        ctx = container.get("securityContext") or {}
        if ctx.get("privileged"):
            out.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation != false")
        if "ALL" not in (ctx.get("capabilities") or {}).get("drop", []):
            out.append(f"{name}: capabilities.drop lacks ALL")
        if set((ctx.get("capabilities") or {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities")
        if ctx.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
            out.append(f"{name}: runAsNonRoot != true")
        if ctx.get("runAsUser", pod.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                out.append(f"{name}: hostPort")
        if ctx.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount {ctx['procMount']}")
        out += _selinux_and_apparmor(name, ctx)
    return out


def _selinux_and_apparmor(where: str, ctx: dict[str, Any]) -> list[str]:
    out: list[str] = []
    selinux = ctx.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in _SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        out.append(f"{where}: seLinuxOptions")
    apparmor = (ctx.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"{where}: appArmorProfile {apparmor}")
    return out


def pod_specs(objects: list[K8sObject]) -> dict[str, dict[str, Any]]:
    """Every pod spec among rendered objects, by a name saying where it is."""
    out: dict[str, dict[str, Any]] = {}
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        if kind in ("StatefulSet", "Job", "Deployment"):
            out[f"{kind}/{name}"] = spec["template"]["spec"]
        elif kind == "RayCluster":
            out[f"RayCluster/{name}/head"] = spec["headGroupSpec"]["template"]["spec"]
            for group in spec["workerGroupSpecs"]:
                out[f"RayCluster/{name}/{group['groupName']}"] = group["template"]["spec"]
    return out
