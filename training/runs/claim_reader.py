"""The runs claim, read through the Ray head pod: the claim is mounted there only, so
`uerl runs list|pack --dir` run in the head's Ray container (an exec through the
Kubernetes API, as `kubectl exec` does) and their output comes back over its websocket.
The head's image is the one `uerl train` runs in, so it has `uerl`.
"""

from __future__ import annotations

import json
import queue
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infra.endpoints import Endpoints
from training.runs.follow import RunState, StoredFile, Take, only_arguments
from training.runs.transfer import Progress, each_file, extract_run
from training.runstore.listing import RunSummary
from training.runstore.location import RunStorageError, RunStorageUnavailable
from training.submit.head import API_TIMEOUT_S, HeadFinder, api_failure, kube_pod_lister
from training.submit.submit_error import CLUSTER_UNUSABLE, SubmitError

# The Kubernetes exec protocol's channels (stdout, stderr, and the status at the end).
STDOUT, STDERR, STATUS = 1, 2, 3
# The longest silence of a pack in progress: the pod reads files and sends as it goes.
SILENCE_S = 120.0
LOST = -1  # exit_code(): the exec's connection ended before its status

# (pod, command) -> a running exec in the pod's Ray container, as kubernetes.stream
# returns it (is_open, update, read_channel, close).
Exec = Callable[[str, list[str]], Any]


@dataclass(frozen=True)
class ExecResult:
    code: int
    stderr: str


def claim_root(endpoints: Endpoints) -> str:
    assert endpoints.runs is not None and endpoints.runs.uri.startswith("file://")
    return urlsplit(endpoints.runs.uri).path


def exit_code(status: bytes) -> int:
    """The exec's end from its status channel (a Status object): 0, the command's exit
    code, 126 when it never ran (no such executable), or LOST when no status came (the
    connection ended first)."""
    if not status.strip():
        return LOST
    try:
        parsed = json.loads(status)
    except ValueError:
        return 126
    if parsed.get("status") == "Success":
        return 0
    for cause in (parsed.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", 1))
    return 126


def pump(response: Any, on_stdout: Callable[[bytes], None]) -> ExecResult:
    """Reads an exec to its end: stdout to `on_stdout` as it arrives, stderr kept; a
    silence of SILENCE_S is an error (a pod gone mid-way can stall, not close)."""
    stderr = b""
    status = b""
    last = time.monotonic()
    while response.is_open():
        response.update(timeout=1.0)
        out = response.read_channel(STDOUT)
        err = response.read_channel(STDERR)
        status += response.read_channel(STATUS)
        if out or err:
            last = time.monotonic()
        if out:
            on_stdout(bytes(out))
        stderr += bytes(err)
        if time.monotonic() - last > SILENCE_S:
            response.close()
            raise SubmitError(
                f"the Ray head pod sent nothing for {SILENCE_S:.0f} s", CLUSTER_UNUSABLE
            )
    # What arrived with the close.
    out = response.read_channel(STDOUT)
    if out:
        on_stdout(bytes(out))
    stderr += bytes(response.read_channel(STDERR))
    status += response.read_channel(STATUS)
    return ExecResult(exit_code(status), stderr.decode("utf-8", "replace"))


class ClaimRuns:
    """The runs on the stack's runs claim (endpoints `runs.uri` file:///...)."""

    def __init__(self, endpoints: Endpoints, head: HeadFinder, exec_: Exec) -> None:
        self.root = claim_root(endpoints)
        self.head = head
        self._exec = exec_
        self._states: dict[str, RunState] = {}

    @classmethod
    def on_cluster(cls, endpoints: Endpoints, api_client: Any) -> ClaimRuns:
        head = HeadFinder(endpoints, kube_pod_lister(api_client))
        return cls(endpoints, head, kube_exec(api_client, endpoints.namespace))

    @property
    def where(self) -> str:
        return f"file://{self.root} (the runs claim, on the Ray head pod {self.head.current})"

    def list(self) -> list[RunSummary]:
        out = bytearray()
        result = self._run(["uerl", "runs", "list", "--dir", self.root, "--json"], out.extend)
        # Nothing the user typed is in this command: its refusal (the claim not mounted
        # at root on this head) is a store that cannot be read, as a bucket's outage is.
        self._check(result, "listing the runs", refused_is_bad_input=False)
        try:
            return [RunSummary.from_json(item) for item in json.loads(bytes(out))]
        except (ValueError, TypeError) as exc:
            raise SubmitError(
                f"`uerl runs list` on the Ray head answered no run list: {exc}", CLUSTER_UNUSABLE
            ) from None

    def pull(self, name: str, into: Path, *, latest_only: bool, total: int | None) -> float:
        """Run `name` unpacked into the directory `into` as it arrives; the seconds it
        took. `total`: the bytes expected, for the progress line (None: unknown)."""
        command = ["uerl", "runs", "pack", name, "--dir", self.root]
        if latest_only:
            command.append("--latest")
        progress = Progress(f"pulling {name}", total)
        chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        unpacking = threading.Event()
        unpacking.set()
        ended: list[ExecResult | BaseException] = []

        def receive() -> None:
            def take(data: bytes) -> None:
                if unpacking.is_set():  # after a failed unpack, the rest is dropped
                    chunks.put(data)

            try:
                ended.append(self._run(command, take))
            except BaseException as exc:  # said by the caller's thread
                ended.append(exc)
            finally:
                chunks.put(None)

        receiver = threading.Thread(target=receive, name="uerl-runs-pull", daemon=True)
        receiver.start()
        try:
            extract_run(iter(chunks.get, None), name, into, progress)
        except BaseException as exc:
            unpacking.clear()  # the receiver drops the rest (a full disk, Ctrl-C, ...)
            if isinstance(exc, (tarfile.TarError, RunStorageError, RunStorageUnavailable)):
                # A stream cut short: the exec's own failure says why.
                receiver.join()
                self._raise_if_failed(ended[0], f"pulling run {name!r}")
            raise
        receiver.join()
        self._raise_if_failed(ended[0], f"pulling run {name!r}")
        return progress.finish()

    def state(self, name: str) -> RunState:
        """Run `name` as the head reads it (`uerl runs pack --manifest`), for a follow."""
        out = bytearray()
        command = ["uerl", "runs", "pack", name, "--dir", self.root, "--manifest"]
        result = self._run(command, out.extend)
        self._check(result, f"reading run {name!r}")
        try:
            data = json.loads(bytes(out))
            state = RunState(
                data["lease"],
                data["latest"],
                {
                    rel: StoredFile(int(size), float(mtime))
                    for rel, (size, mtime) in data["files"].items()
                },
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise SubmitError(
                f"`uerl runs pack --manifest` on the Ray head answered no manifest: {exc} "
                "(is its image this uerl's?)",
                CLUSTER_UNUSABLE,
            ) from None
        self._states[name] = state
        return state

    def fetch(self, name: str, files: dict[str, StoredFile], take: Take) -> None:
        """`files` of run `name` packed on the head (`uerl runs pack --only`), each given
        to `take` as it arrives."""
        state = self._states.get(name) or RunState(None, None, dict(files))
        only = only_arguments(files, state)
        command = ["uerl", "runs", "pack", name, "--dir", self.root, "--only", *only]
        chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        ended: list[ExecResult | BaseException] = []

        def receive() -> None:
            try:
                ended.append(self._run(command, chunks.put))
            except BaseException as exc:  # said by the caller's thread
                ended.append(exc)
            finally:
                chunks.put(None)

        receiver = threading.Thread(target=receive, name="uerl-runs-follow", daemon=True)
        receiver.start()
        try:
            each_file(iter(chunks.get, None), name, take)
        except (tarfile.TarError, RunStorageError, RunStorageUnavailable):
            receiver.join()
            self._raise_if_failed(ended[0], f"reading run {name!r}")
            raise
        receiver.join()
        self._raise_if_failed(ended[0], f"reading run {name!r}")

    def _raise_if_failed(self, ended: ExecResult | BaseException, doing: str) -> None:
        if isinstance(ended, BaseException):
            raise ended
        self._check(ended, doing)

    # ---- the exec ------------------------------------------------------------------

    def _run(self, command: list[str], on_stdout: Callable[[bytes], None]) -> ExecResult:
        return pump(self._start(command), on_stdout)

    def _start(self, command: list[str]) -> Any:
        return self._exec(self.head.find(), command)

    def _check(self, result: ExecResult, doing: str, *, refused_is_bad_input: bool = True) -> None:
        if result.code == 0:
            return
        said = [line for line in result.stderr.splitlines() if line.strip()]
        if result.code == LOST:
            raise SubmitError(
                f"{doing}: the connection to the Ray head pod {self.head.current} ended "
                "before the command did (the pod replaced, or the API server restarted); "
                "try again",
                CLUSTER_UNUSABLE,
            )
        if result.code == 126 and not said:
            raise SubmitError(
                f"{doing}: the Ray head pod {self.head.current} cannot run `uerl` (is its "
                "image the one `uerl train` runs in?)",
                CLUSTER_UNUSABLE,
            )
        reason = said[-1] if said else f"exit status {result.code}"
        message = f"{doing} on the Ray head pod {self.head.current}: {reason}"
        if result.code == 2 and refused_is_bad_input:  # the command refused its input: RUN
            raise RunStorageError(message)
        raise RunStorageUnavailable(message)


def kube_exec(api_client: Any, namespace: str) -> Exec:
    """Exec on the cluster, in the pod's Ray container: KubeRay's convention is that it
    is the pod's first."""
    from kubernetes.client import CoreV1Api
    from kubernetes.stream import stream

    core = CoreV1Api(api_client)

    def exec_(pod: str, command: list[str]) -> Any:
        try:
            found = core.read_namespaced_pod(pod, namespace, _request_timeout=API_TIMEOUT_S)
        except Exception as exc:  # ApiException, urllib3's errors
            raise SubmitError(api_failure(api_client, exc), CLUSTER_UNUSABLE) from None
        try:
            response = stream(
                core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container=found.spec.containers[0].name,
                command=command,
                stdin=False,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        except Exception as exc:  # ApiException(status=0): the handshake failed
            raise SubmitError(
                f"exec in the Ray head pod {pod}: {api_failure(api_client, exc)}",
                CLUSTER_UNUSABLE,
            ) from None
        # The client keeps a copy of all output for read_all() unless told not to, and
        # `stream()` does not pass that on: a pulled run would sit in memory twice.
        from kubernetes.stream import ws_client

        response._all = ws_client._IgnoredIO()
        return response

    return exec_
