"""A real multi-node Ray cluster on this machine: one `ray start --block` per node.

Head (num-cpus 0, schedules nothing), X learner nodes and Y worker nodes each
advertising one unit of the custom resource, all separate raylets on
127.0.0.2. `ray start --block` stays in the foreground as the parent of its
node's processes and stops them when it gets SIGTERM, so each node is one
handle we own; see `training.local.processes` for how they are stopped by pid.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.contract import JOB_STOP_GRACE_ENV, JOB_STOP_GRACE_S
from infra.topology import Topology
from training.local import processes
from training.run.stop import signals_held

NODE_IP = "127.0.0.2"
# Keeps every Unix socket path (<temp>/<node>/session_<date>_<pid>/sockets/...)
# well under the 107-byte limit.
TEMP_ROOT = "/tmp"
# Per-node object store: small, the local run moves tiny batches.
OBJECT_STORE_BYTES = 200 * 1024 * 1024

NodeRole = Literal["head", "learner", "worker"]
# Ray titles an actor process `ray::<class>`: uerl's multi- and single-agent env runners.
ACTOR_TITLES = ("ray::UEEnvRunner", "ray::UESingleAgentEnvRunner")


# Set for every node, and for this process by `start()`: it is the cluster's driver,
# and a driver whose auth mode differs from its cluster's gets its actors cancelled
# before they run (an inherited RAY_AUTH_MODE=token does exactly that).
NODE_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # No drain wait on SIGTERM: nothing to migrate on a local cluster.
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    # Loopback-only and short-lived: no token auth. Explicit, because an unset
    # mode turns auth on whenever ~/.ray/auth_token exists.
    "RAY_AUTH_MODE": "disabled",
    # Never pick up an address from the environment: nodes join ours.
    "RAY_ADDRESS": "",
    # As on the Kubernetes head: `ray job stop` leaves time for the final checkpoint.
    JOB_STOP_GRACE_ENV: str(JOB_STOP_GRACE_S),
}
DRIVER_ENV_KEYS = ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")


def _drive_with_node_settings() -> None:
    """This process drives the cluster: its Ray settings must match the nodes'."""
    for key in DRIVER_ENV_KEYS:
        os.environ[key] = NODE_ENV[key]
    if "ray" in sys.modules:
        # Ray caches its config when imported; refresh it as Ray itself does when
        # it changes the auth mode (ray._private.authentication).
        from ray._raylet import Config

        Config.initialize("")


class LocalClusterError(RuntimeError):
    """The local cluster could not be started; the message says which node and why."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    role: NodeRole
    num_cpus: int
    num_gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)


# `ray start` crashes (killed by a signal) tolerated per node while the cluster starts.
MAX_START_CRASHES = 1
# What `ray start` says when its raylet did not register within Ray's fixed 30 s
# (ray/_private/node.py, not configurable): on a host slow or busy enough (seen on a
# starved CI host), not a fault of the node. Started again while the deadline allows.
RAY_REGISTRATION_TIMED_OUT = "The current node timed out during startup"


@dataclass
class _Node:
    spec: NodeSpec
    proc: subprocess.Popen[bytes]
    log: Path
    # Where this start's lines begin: a log dir kept from an earlier run (`--resume` in
    # the same run dir) holds that run's lines too, its "Ray runtime started" among them.
    log_offset: int
    crashes: int = 0

    def this_start(self) -> str:
        """What the node's current `ray start` has written so far."""
        return processes.read_from(self.log, self.log_offset)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.this_start().splitlines()[-lines:]) or "(no log lines)"


def node_specs(
    *,
    learners: int,
    learner_cpus: float,
    workers: int,
    worker_cpus: float,
    custom_resource: str,
    learner_gpus: int = 0,
    learner_resource: str | None = None,
) -> list[NodeSpec]:
    """Head + X learner nodes + Y worker nodes.

    `ray start --num-cpus` takes whole CPUs (logical, may exceed the real
    cores), so fractional topology CPUs are rounded up.
    """
    specs = [NodeSpec("head", "head", 0)]
    # As on Kubernetes: learner nodes advertise the learner resource, one unit each.
    learner_units = {learner_resource: 1.0} if learner_resource else {}
    specs += [
        NodeSpec(
            f"learner{i}", "learner", math.ceil(learner_cpus), learner_gpus, dict(learner_units)
        )
        for i in range(1, learners + 1)
    ]
    specs += [
        NodeSpec(f"worker{i}", "worker", math.ceil(worker_cpus), 0, {custom_resource: 1.0})
        for i in range(1, workers + 1)
    ]
    return specs


def topology_node_specs(topology: Topology) -> list[NodeSpec]:
    """The nodes `topology` asks for: its learners and workers, sized as it says."""
    return node_specs(
        learners=topology.learners.replicas,
        learner_cpus=topology.learners.cpus,
        workers=topology.workers.replicas,
        worker_cpus=topology.workers.cpus,
        custom_resource=topology.workers.custom_resource,
        learner_resource=topology.learners.custom_resource,
    )


class LocalRayCluster(processes.StartedGroup):
    """Context manager: start the nodes, wait until the GCS lists them all, stop them all.

    `address` is the GCS address for `ray.init(address=..., _node_ip_address=NODE_IP)`.
    """

    def __init__(
        self,
        nodes: list[NodeSpec],
        *,
        start_timeout_s: float = 120.0,
        stop_grace_s: float = 15.0,
        log_dir: Path | None = None,
        dashboard: bool = False,
        metrics_targets: Path | None = None,
        metrics_labels: dict[str, str] | None = None,
    ) -> None:
        if not nodes or nodes[0].role != "head" or any(n.role == "head" for n in nodes[1:]):
            raise ValueError("nodes must start with exactly one head node")
        self.specs = nodes
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.temp_dir = Path(TEMP_ROOT) / f"uerl-{secrets.token_hex(3)}"
        self.log_dir = log_dir or self.temp_dir / "logs"
        self.port = 0
        self.client_port = 0
        # The dashboard serves the job API (`ray job submit`); on the nodes' loopback IP.
        self.dashboard = dashboard
        self.dashboard_port = 0
        self._nodes: list[_Node] = []
        self._stopped = False
        # Each node's metrics agent serves Prometheus' text format (Ray's metrics and
        # uerl's, training.telemetry) on a port of its own; kept in `metrics_targets`, a
        # Prometheus file_sd file, as nodes come and go.
        self.metrics_ports: dict[str, int] = {}
        self.metrics_targets = metrics_targets
        self.metrics_labels = dict(metrics_labels or {})
        # What `add_worker_nodes` copies, and how many worker names were ever used.
        workers = [spec for spec in nodes if spec.role == "worker"]
        self._worker_template = workers[0] if workers else None
        self._workers_started = len(workers)

    @property
    def address(self) -> str:
        return f"{NODE_IP}:{self.port}"

    @property
    def dashboard_url(self) -> str:
        """`http://127.0.0.2:PORT` (for `ray job submit --address`), or "" without one."""
        return f"http://{NODE_IP}:{self.dashboard_port}" if self.dashboard else ""

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        _drive_with_node_settings()
        self.temp_dir.mkdir(parents=True, exist_ok=False)
        self.port = processes.free_port()
        self.client_port = processes.free_port()
        if self.dashboard:
            self.dashboard_port = processes.free_port()
        deadline = time.monotonic() + self.start_timeout_s
        head, rest = self.specs[0], self.specs[1:]
        self._launch(head)
        self._wait_started(self._nodes[0], deadline)
        # The other nodes join in parallel once the GCS is up.
        for spec in rest:
            self._launch(spec)
        for node in self._nodes[1:]:
            self._wait_started(node, deadline)
        self._wait_registered(deadline)
        self._write_metrics_targets()

    def metrics_urls(self) -> dict[str, str]:
        """Each node's metrics endpoint (Prometheus text), by node name."""
        return {
            n.spec.name: f"http://{NODE_IP}:{self.metrics_ports[n.spec.name]}/metrics"
            for n in self._nodes
            if n.spec.name in self.metrics_ports
        }

    def _write_metrics_targets(self) -> None:
        if self.metrics_targets is None:
            return
        groups = [
            {
                "targets": [f"{NODE_IP}:{self.metrics_ports[n.spec.name]}"],
                "labels": {**self.metrics_labels, "uerl_node": n.spec.name},
            }
            for n in self._nodes
            if n.spec.name in self.metrics_ports
        ]
        tmp = self.metrics_targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=2) + "\n")
        tmp.replace(self.metrics_targets)  # a scraper never reads half a file

    def stop(self) -> None:
        """Stop every node (workers first, head last); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        survivors = processes.terminate(
            [n.proc for n in self._nodes[1:]], grace_s=self.stop_grace_s
        )
        if self._nodes:
            survivors |= processes.terminate([self._nodes[0].proc], grace_s=self.stop_grace_s)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if survivors:
            raise LocalClusterError(f"processes survived SIGKILL: {sorted(survivors)}")

    # -- rescale (`uerl local scale`) -------------------------------------------

    def worker_nodes(self) -> list[str]:
        return [n.spec.name for n in self._nodes if n.spec.role == "worker"]

    def add_worker_nodes(self, count: int, *, timeout_s: float | None = None) -> list[str]:
        """Start `count` more worker nodes like the first ones; return their names once the
        GCS lists them alive. Names are never reused (each node has its own temp dir). If
        one does not come up, the ones this call started are stopped and the error raised."""
        template = self._worker_template
        if template is None:
            raise LocalClusterError("this cluster was started without worker nodes to copy")
        first = self._workers_started + 1
        self._workers_started += count
        new = [
            NodeSpec(f"worker{first + i}", "worker", template.num_cpus, 0, dict(template.resources))
            for i in range(count)
        ]
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        self.specs = [*self.specs, *new]
        try:
            for spec in new:
                self._launch(spec)
            for node in self._nodes[-count:] if count else []:
                self._wait_started(node, deadline)
            self._wait_registered(deadline)
        except BaseException:
            # Stop the nodes this call started (their names stay used: own temp dirs).
            self.remove_worker_nodes([spec.name for spec in new])
            raise
        self._write_metrics_targets()
        return [spec.name for spec in new]

    def busy_worker_nodes(self) -> set[str]:
        """Worker nodes whose raylet hosts a live env runner actor (Ray titles its actor
        processes `ray::<class>`)."""
        busy = set()
        for node in self._nodes:
            if node.spec.role == "worker" and any(
                processes.title_contains(pid, title)
                for pid in processes.tree(node.proc.pid)
                for title in ACTOR_TITLES
            ):
                busy.add(node.spec.name)
        return busy

    def remove_worker_nodes(self, names: list[str]) -> None:
        """Stop these worker nodes (TERM, then KILL) and forget them."""
        leaving = [n for n in self._nodes if n.spec.name in names and n.spec.role == "worker"]
        survivors = processes.terminate([n.proc for n in leaving], grace_s=self.stop_grace_s)
        self._nodes = [n for n in self._nodes if n not in leaving]
        self.specs = [s for s in self.specs if s.name not in names]
        self._write_metrics_targets()
        if survivors:
            raise LocalClusterError(f"processes survived SIGKILL: {sorted(survivors)}")

    def pids(self) -> set[int]:
        """Every live process of every node (leaders, raylets, GCS, agents, workers)."""
        out: set[int] = set()
        for node in self._nodes:
            out |= processes.tree(node.proc.pid) | processes.session_members(node.proc.pid)
        return out

    # -- internals -------------------------------------------------------------

    def _argv(self, spec: NodeSpec) -> list[str]:
        ray = str(Path(sys.executable).with_name("ray"))
        argv = [
            ray,
            "start",
            "--block",
            f"--node-ip-address={NODE_IP}",
            f"--num-cpus={spec.num_cpus}",
            f"--num-gpus={spec.num_gpus}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={self.temp_dir / spec.name}",
            # Random ports for workers and agents: other clusters may run here too.
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--disable-usage-stats",
            "--log-style=record",
            # Every node runs a dashboard agent; on one IP they need distinct HTTP ports
            # (the default 52365 would go to the first node only).
            f"--dashboard-agent-listen-port={processes.free_port()}",
            f"--metrics-export-port={self._metrics_port(spec)}",
        ]
        if spec.resources:
            argv.append(f"--resources={json.dumps(spec.resources)}")
        if spec.role == "head":
            argv += [
                "--head",
                f"--port={self.port}",
                f"--ray-client-server-port={self.client_port}",
            ]
            if self.dashboard:
                argv += [
                    "--include-dashboard=true",
                    f"--dashboard-host={NODE_IP}",
                    f"--dashboard-port={self.dashboard_port}",
                ]
            else:
                argv.append("--include-dashboard=false")
        else:
            argv.append(f"--address={self.address}")
        return argv

    def _metrics_port(self, spec: NodeSpec) -> int:
        self.metrics_ports[spec.name] = processes.free_port()
        return self.metrics_ports[spec.name]

    def _launch(self, spec: NodeSpec) -> None:
        with signals_held():  # a Ctrl-C now stops this node too
            self._nodes.append(_Node(spec, *self._spawn(spec)))

    def _spawn(self, spec: NodeSpec) -> tuple[subprocess.Popen[bytes], Path, int]:
        env = {**os.environ, **NODE_ENV}
        # Jobs run their entrypoint through the head's shell: `uerl train` must resolve
        # to this environment's script, as it does on the uerl Ray image.
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
        log = self.log_dir / f"{spec.name}.log"
        offset = processes.log_end(log)
        return processes.spawn(self._argv(spec), log_path=log, env=env), log, offset

    def _wait_started(self, node: _Node, deadline: float) -> None:
        while True:
            if (
                node.proc.poll() is not None
                and time.monotonic() < deadline
                and self._restart_crashed(node)
            ):
                continue
            if node.proc.poll() is not None:
                raise LocalClusterError(
                    f"ray start for node {node.spec.name} exited with code "
                    f"{node.proc.returncode}; last log lines ({node.log}):\n"
                    f"{node.tail()}"
                )
            if "Ray runtime started" in node.this_start():
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"node {node.spec.name} did not start within {self.start_timeout_s:.0f}s; "
                    f"last log lines ({node.log}):\n{node.tail()}"
                )
            time.sleep(0.2)

    def _restart_crashed(self, node: _Node) -> bool:
        """Start a node again whose `ray start` was killed by a signal while starting, or
        gave up on Ray's fixed 30 s wait for its raylet to register (a slow host: again
        until the cluster's own start deadline ends the wait).

        Seen once in hundreds of starts: `ray start` aborted (SIGABRT) by gRPC's poller
        ("epoll_wait error: Bad file descriptor"). A node that exits with another error
        (bad arguments, ports) is not retried; nor is a second crash."""
        code = node.proc.returncode
        if code > 0 and RAY_REGISTRATION_TIMED_OUT in node.this_start():
            self._start_again(
                node,
                "ray start timed out registering",
                f"node {node.spec.name} did not register within Ray's 30 s (a busy host)",
            )
            return True
        if code >= 0 or node.crashes >= MAX_START_CRASHES:
            return False
        node.crashes += 1
        self._start_again(
            node,
            f"ray start crashed ({code})",
            f"ray start for node {node.spec.name} was killed by signal {-code} while starting",
        )
        return True

    def _start_again(self, node: _Node, marker: str, said: str) -> None:
        processes.terminate([node.proc], grace_s=self.stop_grace_s)  # what it started
        with node.log.open("a") as fh:
            fh.write(f"--- uerl local: {marker}; again ---\n")
        print(f"uerl local: {said}; starting it again (log: {node.log})", flush=True)
        with signals_held():
            node.proc, node.log, node.log_offset = self._spawn(node.spec)

    def _wait_registered(self, deadline: float) -> None:
        """Poll the GCS until every node is alive in it."""
        from ray._raylet import GcsClient

        client = GcsClient(address=self.address)
        want = len(self.specs)
        have = 0
        while time.monotonic() < deadline:
            try:
                infos = client.get_all_node_info(timeout=5).values()
                have = sum(1 for info in infos if info.state == 0)  # 0 = ALIVE
            except Exception:  # GCS still coming up: retry until the deadline
                have = 0
            if have >= want:
                return
            time.sleep(0.25)
        raise LocalClusterError(
            f"the GCS at {self.address} lists {have} alive node(s) after "
            f"{self.start_timeout_s:.0f}s; expected {want} (head + learners + workers)"
        )
