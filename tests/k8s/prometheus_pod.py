"""A real Prometheus as a pod of the tier's node, scraping the stack's Ray pods the way a
user's Prometheus run by the Prometheus Operator does: through the stack's PodMonitor and
past its NetworkPolicy.

- The binary is Debian bookworm's `prometheus` package (tests/tools/prometheus.sh: the
  pinned version, fetched with `apt-get download`, unpacked into a cache outside the work
  tree, the same one `make test-slow`'s Prometheus uses), mounted read-only (hostPath)
  into a pod of the Ray image (Debian, glibc: the binary links libc).
- Its scrape configuration is generated from the PodMonitor as the API server holds it,
  as the Operator generates it (`scrape_configs`): kubernetes_sd role `pod` in the
  namespaces of `namespaceSelector.matchNames`, a `keep` per `selector.matchLabels`
  label, a `keep` on the endpoint's container port name, the endpoint's interval and
  path; job `<namespace>/<name>`, scrape pool `podMonitor/<namespace>/<name>/<index>`.
- The pod runs in namespace `monitoring` with labels `app.kubernetes.io/name:
  prometheus` (what the stack's `metrics.scraper` names), as a ServiceAccount that may
  get, list and watch pods in the stack's namespace (a Role there).
- Debian builds Prometheus without `kubernetes_sd_configs` (client-go is not packaged
  in Debian: `promtool check config` says "field kubernetes_sd_configs not found"). The
  one change to the Operator's configuration: each job's kubernetes_sd is a `file_sd`
  file that a second container of the pod (`DISCOVER`, Python's standard library in the
  Ray image) writes every few seconds from the pods it lists through the API server, as
  the ServiceAccount, with kubernetes_sd's own target per container port and its meta
  labels (`__meta_kubernetes_pod_label_*`, `..._labelpresent_*`,
  `..._container_port_name`, ...). Selection stays the Operator's relabelling, in
  Prometheus; scrapes go pod to pod, through the stack's NetworkPolicies.
- The test process reads Prometheus' HTTP API at the pod's address (the node's bridge
  is this machine's; no policy selects the `monitoring` pods).

BestEffort (no requests): the stack's requests fill the node's 2 cores, and a rescale
must still schedule its worker pods.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane import REPO, ControlPlane, ControlPlaneError
from host_speed import guard
from prometheus_server import api_get, prometheus_binary

NAMESPACE = "monitoring"
NAME = "prometheus"
LABELS = {"app.kubernetes.io/name": "prometheus"}
PORT = 9090
CRD_NAME = "podmonitors.monitoring.coreos.com"
CRD_FILE = (
    REPO / "third_party" / "prometheus-operator-crds-v0.85.0"
    / "monitoring.coreos.com_podmonitors.yaml"
)  # fmt: skip
BIN_MOUNT = "/opt/prometheus/bin"
SD_DIR = "/prometheus-sd"
SD_EVERY_S = 3

# kubernetes_sd's role `pod`, for Debian's build without it: argv[1] the file_sd file,
# argv[2:] the namespaces. A target per declared container port, kubernetes_sd's labels.
DISCOVER = r"""
import json, os, ssl, sys, time, urllib.request
SA = "/var/run/secrets/kubernetes.io/serviceaccount"
API = "https://%s:%s" % (os.environ["KUBERNETES_SERVICE_HOST"],
                         os.environ["KUBERNETES_SERVICE_PORT"])
ctx = ssl.create_default_context(cafile=SA + "/ca.crt")
out, namespaces, every = sys.argv[1], sys.argv[2:], float(os.environ["SD_EVERY_S"])

def name(label):
    return "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "_" for c in label)

def groups():
    token = open(SA + "/token").read().strip()
    for ns in namespaces:
        ask = urllib.request.Request(API + "/api/v1/namespaces/%s/pods" % ns,
                                     headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(ask, context=ctx, timeout=10) as answer:
            pods = json.load(answer)["items"]
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status", {})
            ip = status.get("podIP")
            if not ip:
                continue
            ready = [c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"]
            common = {
                "__meta_kubernetes_namespace": ns,
                "__meta_kubernetes_pod_name": meta["name"],
                "__meta_kubernetes_pod_uid": meta["uid"],
                "__meta_kubernetes_pod_ip": ip,
                "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
                "__meta_kubernetes_pod_phase": status.get("phase", ""),
                "__meta_kubernetes_pod_ready": (ready or ["unknown"])[0].lower(),
            }
            for key, value in meta.get("labels", {}).items():
                common["__meta_kubernetes_pod_label_" + name(key)] = value
                common["__meta_kubernetes_pod_labelpresent_" + name(key)] = "true"
            for c in pod["spec"]["containers"]:
                for port in c.get("ports", []):
                    yield {"targets": ["%s:%d" % (ip, port["containerPort"])], "labels": dict(
                        common,
                        __meta_kubernetes_pod_container_name=c["name"],
                        __meta_kubernetes_pod_container_port_name=port.get("name", ""),
                        __meta_kubernetes_pod_container_port_number=str(port["containerPort"]),
                        __meta_kubernetes_pod_container_port_protocol=port.get("protocol", "TCP"),
                    )}

last = None
while True:
    try:
        text = json.dumps(list(groups()), sort_keys=True)
    except Exception as exc:  # the API server restarting, a token rotating: next round
        print("listing pods failed:", exc, flush=True)
        text = last
    if text != last:
        with open(out + ".new", "w") as fh:
            fh.write(text)
        os.replace(out + ".new", out)
        print("targets:", len(json.loads(text)), flush=True)
        last = text
    time.sleep(every)
"""


def install_pod_monitor_crd(cp: ControlPlane) -> None:
    """The Prometheus Operator's PodMonitor CRD (vendored), established."""
    cp.kubectl("apply", "--server-side", "--field-manager=uerl-tests", "-f", str(CRD_FILE))
    cp.kubectl("wait", "--for=condition=Established", f"--timeout={guard(120):.0f}s",
               "crd", CRD_NAME)  # fmt: skip


def binary() -> Path:
    """The cached `prometheus` binary (fetched first when absent), as `make test-slow`'s."""
    return prometheus_binary()


def _label_name(name: str) -> str:
    """A Kubernetes label's name as Prometheus' kubernetes_sd names its meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


class UnmodelledPodMonitor(ValueError):
    """A PodMonitor field the Operator's translation here does not model: scraping without
    it would judge other targets than a real Operator would, so the tier stops instead."""


def job_name(pod_monitor: dict[str, Any], index: int = 0) -> str:
    meta = pod_monitor["metadata"]
    return f"podMonitor/{meta['namespace']}/{meta['name']}/{index}"


def scrape_configs(pod_monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """The scrape configuration the Prometheus Operator makes of `pod_monitor` (the parts
    a uerl PodMonitor uses; anything else is refused, not ignored)."""
    meta, spec = pod_monitor["metadata"], pod_monitor["spec"]
    selector = spec["selector"]
    if set(selector) - {"matchLabels"}:
        raise UnmodelledPodMonitor(f"selector {selector}: only matchLabels here")
    namespaces = spec.get("namespaceSelector", {})
    if set(namespaces) - {"matchNames"}:
        raise UnmodelledPodMonitor(f"namespaceSelector {namespaces}: only matchNames here")
    names = namespaces.get("matchNames") or [meta["namespace"]]
    keep_labels = [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_pod_label_{_label_name(key)}",
                f"__meta_kubernetes_pod_labelpresent_{_label_name(key)}",
            ],
            "regex": f"({value});true",
        }
        for key, value in sorted(selector.get("matchLabels", {}).items())
    ]
    configs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        extra = set(endpoint) - {"port", "path", "interval", "scheme"}
        if extra:
            raise UnmodelledPodMonitor(f"podMetricsEndpoints[{index}]: {sorted(extra)}")
        config: dict[str, Any] = {
            "job_name": job_name(pod_monitor, index),
            "honor_labels": False,
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": names}}],
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "relabel_configs": [
                {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
                {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                 "regex": "(Failed|Succeeded)"},
                *keep_labels,
                {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                 "regex": endpoint["port"]},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"],
                 "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
                {"target_label": "endpoint", "replacement": endpoint["port"]},
            ],
        }  # fmt: skip
        if "interval" in endpoint:
            config["scrape_interval"] = endpoint["interval"]
        configs.append(config)
    return configs


def without_kubernetes_sd(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A scrape config with each kubernetes_sd (role pod) replaced by a file_sd file that
    DISCOVER fills; the namespaces DISCOVER lists."""
    namespaces: set[str] = set()
    sd_file = f"{SD_DIR}/pods.json"
    jobs = []
    for job in config["scrape_configs"]:
        job = dict(job)
        for sd in job.pop("kubernetes_sd_configs"):
            if sd["role"] != "pod":
                raise UnmodelledPodMonitor(f"kubernetes_sd role {sd['role']}")
            namespaces.update(sd["namespaces"]["names"])
        job["file_sd_configs"] = [{"files": [sd_file], "refresh_interval": f"{SD_EVERY_S}s"}]
        jobs.append(job)
    return {**config, "scrape_configs": jobs}, sorted(namespaces)


def manifests(
    pod_monitor: dict[str, Any], image: str, binary_dir: Path, *, probe_pod: str | None = None
) -> list[dict[str, Any]]:
    """The namespace, the ServiceAccount and its Role in each scraped namespace, the
    configuration and the pod; `probe_pod`: a pod of the same namespace without the
    scraper's labels (Python in it, to probe from)."""
    operators = {"global": {"scrape_timeout": "4s"}, "scrape_configs": scrape_configs(pod_monitor)}
    config, watched = without_kubernetes_sd(operators)
    rbac: list[dict[str, Any]] = []
    for ns in watched:
        rbac += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": f"{NAMESPACE}-{NAME}", "namespace": ns},
             "rules": [{"apiGroups": [""], "resources": ["pods"],
                        "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": f"{NAMESPACE}-{NAME}", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": f"{NAMESPACE}-{NAME}"},
             "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        ]  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {
            "serviceAccountName": NAME,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": NAME, "image": image, "imagePullPolicy": "Never",
                "command": [
                    f"{BIN_MOUNT}/prometheus", "--config.file=/etc/prometheus/prometheus.yml",
                    "--storage.tsdb.path=/prometheus", f"--web.listen-address=:{PORT}",
                    "--storage.tsdb.retention.time=1d",
                ],
                "ports": [{"name": "web", "containerPort": PORT}],
                "readinessProbe": {"httpGet": {"path": "/-/ready", "port": PORT},
                                   "periodSeconds": 2},
                "volumeMounts": [
                    {"name": "bin", "mountPath": BIN_MOUNT, "readOnly": True},
                    {"name": "config", "mountPath": "/etc/prometheus", "readOnly": True},
                    {"name": "data", "mountPath": "/prometheus"},
                    {"name": "sd", "mountPath": SD_DIR, "readOnly": True},
                ],
            }, {
                "name": "discover", "image": image, "imagePullPolicy": "Never",
                "command": ["python3", "-c", DISCOVER, f"{SD_DIR}/pods.json", *watched],
                "env": [{"name": "SD_EVERY_S", "value": str(SD_EVERY_S)}],
                "volumeMounts": [{"name": "sd", "mountPath": SD_DIR}],
            }],
            "volumes": [
                {"name": "bin", "hostPath": {"path": str(binary_dir), "type": "Directory"}},
                {"name": "config", "configMap": {"name": NAME}},
                {"name": "data", "emptyDir": {}},
                {"name": "sd", "emptyDir": {}},
            ],
        },
    }  # fmt: skip
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": NAME, "namespace": NAMESPACE}},
        *rbac,
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": NAME, "namespace": NAMESPACE},
         "data": {"prometheus.yml": json.dumps(config, indent=1)}},  # YAML reads JSON
        pod,
    ]  # fmt: skip
    if probe_pod is not None:
        objects.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": probe_pod, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": image,
                                     "imagePullPolicy": "Never",
                                     "command": ["sleep", "infinity"]}],
                     "terminationGracePeriodSeconds": 1},
        })  # fmt: skip
    return objects


@dataclass
class InClusterPrometheus:
    cp: ControlPlane
    url: str
    pod_monitor: dict[str, Any]
    started_s: float  # apply to ready
    ready_at: float  # time.time() when it answered

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return api_get(self.url, path, params)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """[{"metric": labels, "value": [t, "v"]}] at `at` (now: None)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return list(self.get("/api/v1/query", params)["result"])

    def query_range(
        self, expr: str, start: float, end: float, step_s: float = 5.0
    ) -> list[dict[str, Any]]:
        """[{"metric": labels, "values": [[t, "v"], ...]}] from `start` to `end`."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step_s}
        return list(self.get("/api/v1/query_range", params)["result"])

    def targets(self) -> list[dict[str, Any]]:
        """The active targets of the PodMonitor's scrape pool."""
        pool = job_name(self.pod_monitor)
        active = self.get("/api/v1/targets", {"state": "active"})["activeTargets"]
        return [t for t in active if t["scrapePool"] == pool]

    def cpu_seconds(self) -> float:
        """User and system CPU of Prometheus and its discoverer (PID 1 of each container)."""
        total = 0.0
        for container in (NAME, "discover"):
            stat = self.cp.kubectl(
                "exec", "-n", NAMESPACE, NAME, "-c", container, "--", "cat", "/proc/1/stat"
            ).stdout
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / 100  # utime, stime: clock ticks
        return total


def start(
    cp: ControlPlane, stack_namespace: str, image: str, *, probe_pod: str | None = None
) -> InClusterPrometheus:
    """Prometheus scraping the one PodMonitor of `stack_namespace`, ready to answer."""
    monitors = cp.get_json("podmonitors.monitoring.coreos.com", "-n", stack_namespace)["items"]
    if len(monitors) != 1:
        raise ControlPlaneError(f"{len(monitors)} PodMonitor(s) in {stack_namespace}, not one")
    (pod_monitor,) = monitors
    started = time.monotonic()
    cp.apply(manifests(pod_monitor, image, binary().parent, probe_pod=probe_pod))
    pods = [f"pod/{NAME}"] + ([f"pod/{probe_pod}"] if probe_pod else [])
    done = cp.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready",
                      f"--timeout={guard(180):.0f}s", *pods, check=False)  # fmt: skip
    if done.returncode != 0:
        log = cp.kubectl("logs", "-n", NAMESPACE, NAME, "--tail=40", check=False)
        raise ControlPlaneError(f"prometheus not ready:\n{done.stderr}\n{log.stdout}{log.stderr}")
    ip = cp.get_json("pod", "-n", NAMESPACE, NAME)["status"]["podIP"]
    return InClusterPrometheus(
        cp, f"http://{ip}:{PORT}", pod_monitor, time.monotonic() - started, time.time()
    )
