"""A stand-in for the Kubernetes API as the KubeRay CRDs' provider uses it: CRDs read,
applied server-side and deleted, and custom resources listed cluster-wide. Plain HTTP
on loopback (tests/fake_kube_api.py serves pods, port-forwards and Secrets, not these).

Server-side apply is modelled as far as the provider relies on it: a CRD in `conflicts`
answers 409 (field-manager conflict, naming the manager) unless applied with force.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"


def crd_object(name: str, *managers: str, version: str = "v1") -> dict[str, Any]:
    """A served CRD `<plural>.<group>`, as the API returns it."""
    plural, group = name.split(".", 1)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "managedFields": [{"manager": m} for m in managers]},
        "spec": {
            "group": group,
            "names": {"plural": plural},
            "versions": [{"name": version, "served": True, "storage": True}],
        },
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }


def custom_resource(kind: str, name: str, namespace: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
    }


@dataclass
class FakeCrdAPI:
    crds: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> object
    # "/apis/<group>/<version>/<plural>" -> the custom resources of that kind
    resources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # CRD name -> the manager that owns a field the next apply changes
    conflicts: dict[str, str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)  # "METHOD path?query", in order
    url: str = ""

    def kubeconfig(self) -> str:
        """A kubeconfig's text reaching this API (the provider's `kubeconfig` input; YAML,
        whose newlines tell the provider it is no path)."""
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "fake", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )

    def calls(self, method: str) -> list[str]:
        return [a for a in self.asked if a.startswith(f"{method} ")]

    def answer(self, method: str, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
        self.asked.append(f"{method} {target}")
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        if path.startswith(CRD_PATH):
            name = path.removeprefix(CRD_PATH)
            if method == "PATCH":
                return self._apply(name, json.loads(body), query)
            existing = self.crds.get(name)
            if existing is None:
                return 404, _status(404, f'customresourcedefinitions "{name}" not found')
            if method == "DELETE":
                del self.crds[name]
            return 200, existing
        if method == "GET" and path in self.resources:
            return 200, {"kind": "List", "metadata": {}, "items": self.resources[path]}
        if method == "GET" and path.startswith("/apis/"):
            return 200, {"kind": "List", "metadata": {}, "items": []}
        return 404, _status(404, f"{path} not found")

    def _apply(
        self, name: str, doc: dict[str, Any], query: dict[str, list[str]]
    ) -> tuple[int, dict[str, Any]]:
        manager = query.get("fieldManager", [""])[0]
        forced = query.get("force", ["false"])[0] == "true"
        owner = self.conflicts.get(name)
        if owner is not None and not forced:
            message = f'Apply failed with 1 conflict: conflict with "{owner}": .spec.versions'
            status = _status(409, message)
            status["details"] = {
                "name": name,
                "causes": [
                    {
                        "type": "FieldManagerConflict",
                        "message": f'conflict with "{owner}"',
                        "field": ".spec.versions",
                    }
                ],
            }
            return 409, status
        self.conflicts.pop(name, None)
        applied = crd_object(name, manager)
        applied["spec"] = doc.get("spec", applied["spec"])
        self.crds[name] = applied
        return 200, applied


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "code": code}  # fmt: skip


@contextlib.contextmanager
def serving(api: FakeCrdAPI) -> Iterator[FakeCrdAPI]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            status, body = api.answer(self.command, self.path, self.rfile.read(length))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
