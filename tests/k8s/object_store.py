"""A real S3-compatible object store for the run storage tests: SeaweedFS (`weed mini`,
built by tests/k8s/build/build.sh), on this machine as a user's store would be beside
their cluster, with one identity (access key, secret) and the buckets asked for.

    with ObjectStore(buckets=["runs"]) as store:
        store.endpoint      # http://127.0.0.1:PORT
        store.environment() # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY of the identity
        store.pause(30)     # the store unreachable (SIGSTOP) for 30 s, then back
        store.kill_and_restart(20)  # killed (SIGKILL), started again on its data 20 s later
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from controlplane import LOOPBACK, find_binaries, free_ports, tail
from host_speed import guard
from proc_tree import StartedProcesses

# A hang guard: `weed mini` starts a master, a volume server, a filer and S3 first.
START_TIMEOUT_S = guard(240)


class ObjectStoreError(RuntimeError):
    """The store did not start (its log's last lines say why)."""


class ObjectStore:
    def __init__(self, *, buckets: Sequence[str] = (), address: str = LOOPBACK) -> None:
        self.weed = find_binaries(["seaweedfs"])["weed"]
        self.buckets = list(buckets)
        self.address = address
        self.access_key = "uerl-" + secrets.token_hex(4)
        self.secret_key = secrets.token_hex(16)
        self.workdir = Path()
        self.proc: subprocess.Popen[bytes] | None = None
        self._args: list[str] = []
        self.started = StartedProcesses(grace_s=20)
        self.port = 0
        self.filer_port = 0  # its metadata stream: store_changes.bucket_changes
        self.filer_grpc_port = 0

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.port}"

    def environment(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def __enter__(self) -> ObjectStore:
        self.workdir = Path(tempfile.mkdtemp(prefix="uerl-s3-"))
        (self.workdir / "data").mkdir()
        config = self.workdir / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "uerl",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        # Each gRPC port too: by default one is its HTTP port + 10000, which may be taken
        # or past 65535 for a free port chosen here.
        s3, master, volume, filer, *grpc = free_ports(8)
        self.port, self.filer_port, self.filer_grpc_port = s3, filer, grpc[2]
        args = [
            str(self.weed), "mini", f"-dir={self.workdir / 'data'}",
            f"-ip={self.address}", f"-ip.bind={self.address}",
            f"-s3.port={s3}", f"-master.port={master}", f"-volume.port={volume}",
            f"-filer.port={filer}", f"-s3.config={config}",
            f"-master.port.grpc={grpc[0]}", f"-volume.port.grpc={grpc[1]}",
            f"-filer.port.grpc={grpc[2]}", f"-s3.port.grpc={grpc[3]}",
            # Only S3: nothing else listens (the defaults would take fixed ports).
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",
        ]  # fmt: skip
        if self.buckets:
            args.append(f"-bucket={','.join(self.buckets)}")
        self._args = args
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        """`weed mini` on the store's ports and data directory, until it answers."""
        with (self.workdir / "weed.log").open("ab") as log:  # the child keeps its own
            # Its own process group: `pause` stops every process of the store at once.
            self.proc = self.started.popen(
                self._args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                start_new_session=True,
            )  # fmt: skip
        self._wait_ready()

    def kill_and_restart(self, down_s: float) -> None:
        """The whole store killed (SIGKILL: connections reset, nothing shut down), down
        for `down_s`, then started again on the same ports and data, as a store's node
        lost and its service back; returns once it answers again."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        time.sleep(down_s)
        self._start()

    def filesystem(self) -> Any:
        """pyarrow's S3 filesystem on the store, as the identity."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=f"{self.address}:{self.port}",
            scheme="http",
            region="us-east-1",
            # The tests' own reads: room for a store just back from a pause, loaded.
            connect_timeout=10,
            request_timeout=30,
        )

    def _wait_ready(self) -> None:
        """S3 answers the identity, and every bucket asked for is there."""
        from pyarrow import fs

        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ObjectStoreError(
                    f"weed exited ({self.proc.returncode}):\n{tail(self.workdir / 'weed.log')}"
                )
            try:
                s3 = self.filesystem()
                infos = [s3.get_file_info(bucket) for bucket in self.buckets]
                if all(info.type == fs.FileType.Directory for info in infos):
                    if not self.buckets:
                        s3.get_file_info(fs.FileSelector("", recursive=False))
                    return
                last = f"buckets {[i.path for i in infos if i.type != fs.FileType.Directory]}"
            except OSError as exc:
                last = str(exc).splitlines()[0]
            time.sleep(0.5)
        raise ObjectStoreError(
            f"S3 on {self.endpoint} not ready in {START_TIMEOUT_S:.0f} s ({last}):\n"
            f"{tail(self.workdir / 'weed.log')}"
        )

    def pause(self, seconds: float) -> None:
        """The whole store stopped (SIGSTOP: connections hang, as with a store or its
        network gone) for `seconds`, then going on where it was."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)  # a paused store takes its SIGTERM
        self.started.stop()  # SIGTERM, up to 20 s, then SIGKILL to what it started
        if exc_type is None:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)
