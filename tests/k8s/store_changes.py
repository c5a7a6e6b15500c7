"""Every change of a stored run's `checkpoints/latest`, as the store itself reports it,
for the fault schedule's checker (fault_schedule.Checker.store_changed): a round of
checks follows each change rather than a sample every few seconds.

- A claim (its volume is a directory on this machine): inotify, through watchdog, on
  the claim's directory (recursive: the run's directory is made once the run starts).
- A bucket (SeaweedFS): its filer's metadata stream (`weed filer.meta.tail`), one JSON
  object a change; followed again when the store was killed and is back.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from object_store import ObjectStore

LATEST = "checkpoints/latest"  # fault_schedule's layout: the run's pointer


@contextlib.contextmanager
def claim_changes(run_dir: Path, on_change: Callable[[], None]) -> Iterator[None]:
    """`on_change()` for each write or rename of `run_dir`'s `checkpoints/latest`."""
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers import Observer

    pointer = f"{run_dir}/{LATEST}"

    class Latest(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            paths = (str(event.src_path), str(getattr(event, "dest_path", "") or ""))
            if event.event_type in ("created", "modified", "moved", "closed") and any(
                path == pointer for path in paths
            ):
                on_change()

    # The claim's root, which is there: the run's directory is the run's to make (as the
    # pod's user; one made here would be root's, and the run could not write it).
    root = run_dir.parent
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: the claim's directory on this machine is not there")
    observer = Observer()
    observer.schedule(Latest(), str(root), recursive=True)
    observer.start()
    try:
        yield
    finally:
        observer.stop()
        observer.join(10)


@contextlib.contextmanager
def bucket_changes(
    store: ObjectStore, run_root: str, on_change: Callable[[], None]
) -> Iterator[None]:
    """`on_change()` for each change of `<run_root>/checkpoints/latest` (`run_root`: the
    run's `bucket/prefix/run`) in the filer's metadata stream."""
    stopped = threading.Event()
    current: list[subprocess.Popen[str]] = []

    # SeaweedFS's address form for a server whose gRPC port is its own: host:http.grpc.
    filer = f"{store.address}:{store.filer_port}.{store.filer_grpc_port}"

    def follow() -> None:
        while not stopped.is_set():
            tail = store.started.popen(
                [str(store.weed), "filer.meta.tail", f"-filer={filer}",
                 f"-pathPrefix=/buckets/{run_root}/checkpoints"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True,
            )  # fmt: skip
            current[:] = [tail]
            assert tail.stdout is not None
            for line in tail.stdout:
                if '"latest"' in line:
                    on_change()
            tail.wait()
            stopped.wait(1.0)  # the store killed: follow it again once it is back

    thread = threading.Thread(target=follow, name="uerl-bucket-changes", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        for tail in current:
            tail.terminate()  # our own child, by pid
        thread.join(15)
