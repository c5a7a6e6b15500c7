"""A bucket in memory behind pyarrow's filesystem interface, the layer the run store
talks to (`S3Location.filesystem()`): keys are kept exactly as written or planted, so a
test can hold a key no well-behaved writer makes (`..`, `//`), and `on_upload` runs after
each object is stored, so a test can act between two uploads of one round. Real S3
semantics (SeaweedFS) are tested in tests/k8s/test_run_storage.py."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from pyarrow import fs

from training.runstore.bucket import S3Location


class _Upload(io.BytesIO):
    """An object being written: stored whole when closed, as one PUT is."""

    def __init__(self, bucket: FakeBucket, key: str) -> None:
        super().__init__()
        self._bucket, self._key = bucket, key

    def close(self) -> None:
        if not self.closed:
            self._bucket.objects[self._key] = self.getvalue()
            super().close()
            self._bucket.on_upload(self._key)


class FakeBucket(fs.FileSystemHandler):
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}  # "bucket/prefix/run/relative" -> data
        self._lock = threading.Lock()
        self.on_upload: Callable[[str], None] = lambda key: None
        # Runs before every request (a listing, a read, a write, a delete), so a test can
        # fail it as a store would (raise OSError("... 503 ...")).
        self.on_request: Callable[[str], None] = lambda path: None

    def text(self, key: str) -> str | None:
        data = self.objects.get(key)
        return None if data is None else data.decode()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return id(self)

    def get_type_name(self) -> str:
        return "fake-bucket"

    def normalize_path(self, path: str) -> str:
        return path

    def _info(self, path: str) -> fs.FileInfo:
        if path in self.objects:
            return fs.FileInfo(path, fs.FileType.File, size=len(self.objects[path]))
        if "/" not in path.strip("/") or any(k.startswith(path + "/") for k in self.objects):
            return fs.FileInfo(path, fs.FileType.Directory)  # a bucket, or a common prefix
        return fs.FileInfo(path, fs.FileType.NotFound)

    def get_file_info(self, paths: list[str]) -> list[fs.FileInfo]:
        for path in paths:
            self.on_request(path)
        return [self._info(path) for path in paths]

    def get_file_info_selector(self, selector: fs.FileSelector) -> list[fs.FileInfo]:
        self.on_request(selector.base_dir)
        base = selector.base_dir.rstrip("/") + "/"
        keys = sorted(k for k in self.objects if k.startswith(base))
        if selector.recursive:
            return [self._info(k) for k in keys]
        children = sorted({base + k[len(base) :].split("/", 1)[0] for k in keys})
        return [self._info(child) for child in children]

    def create_dir(self, path: str, recursive: bool) -> None:
        pass

    def delete_dir(self, path: str) -> None:
        pass

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        pass

    def delete_root_dir_contents(self) -> None:
        self.objects.clear()

    def delete_file(self, path: str) -> None:
        self.on_request(path)
        self.objects.pop(path, None)

    def move(self, src: str, dest: str) -> None:
        self.objects[dest] = self.objects.pop(src)

    def copy_file(self, src: str, dest: str) -> None:
        self.objects[dest] = self.objects[src]

    def open_input_stream(self, path: str) -> Any:
        self.on_request(path)
        if path not in self.objects:
            raise FileNotFoundError(path)
        return pa.PythonFile(io.BytesIO(self.objects[path]), mode="r")

    def open_input_file(self, path: str) -> Any:
        return self.open_input_stream(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        self.on_request(path)
        return pa.PythonFile(_Upload(self, path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise NotImplementedError("S3 has no append")

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """A PUT with `If-None-Match: *` (S3Location.put_if_absent): refused when the key
        is there, as the store's 412; atomic (one thread at a time here)."""
        self.on_request(key)
        with self._lock:
            if key in self.objects:
                return False
            self.objects[key] = data
        self.on_upload(key)
        return True


def install(monkeypatch: pytest.MonkeyPatch) -> FakeBucket:
    """Every S3Location's filesystem is this one bucket in memory (for the test)."""
    fake = FakeBucket()
    filesystem = fs.PyFileSystem(fake)
    monkeypatch.setattr(S3Location, "filesystem", lambda self: filesystem)
    monkeypatch.setattr(
        S3Location, "put_if_absent", lambda self, key, data: fake.put_if_absent(key, data)
    )
    return fake
