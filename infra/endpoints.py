"""The endpoints contract: what the infrastructure tells the trainer.

Produced by the Pulumi program (stack output `endpoints` and a ConfigMap on the
Ray head) and by `uerl local`; consumed by `uerl train`. Imports only pydantic
so the training side can read it without Pulumi.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 1

Pattern = Literal["sidecar", "networked"]
PortOffsetMode = Literal["fixed", "per_worker"]

# Where the Pulumi program mounts the endpoints ConfigMap in the head pod, so a
# job running on the head finds it with no flags.
HEAD_MOUNT_DIR = "/etc/uerl"
ENDPOINTS_FILENAME = "endpoints.json"
HEAD_ENDPOINTS_PATH = f"{HEAD_MOUNT_DIR}/{ENDPOINTS_FILENAME}"
# The games' TLS Secret (`simulator.tls`): its keys, and where pods that talk to the
# games (and the games' TLS servers) mount them.
TLS_CA_KEY, TLS_CERT_KEY, TLS_KEY_KEY = "ca.crt", "tls.crt", "tls.key"
GAME_TLS_MOUNT_DIR = "/etc/uerl-game-tls"


class EndpointsError(ValueError):
    """The endpoints object could not be read; the message says where and why."""


def worker_endpoint(
    url_template: str, port: int, port_offset_mode: PortOffsetMode, worker_index: int
) -> str:
    """`host:port` of the game that env runner `worker_index` (1..N) talks to."""
    try:
        host = url_template.format(worker_index=worker_index)
    except (KeyError, IndexError, ValueError) as exc:
        raise EndpointsError(
            f"worker_url_template {url_template!r} cannot be expanded: only "
            f"{{worker_index}} may appear in it ({exc})"
        ) from exc
    offset = worker_index if port_offset_mode == "per_worker" else 0
    return f"{host}:{port + offset}"


class RayAddresses(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dashboard_url: str = Field(description="Ray dashboard / job submission URL")
    client_address: str = Field(description="Ray client address, ray://host:10001")
    gcs_address: str = Field(description="GCS address host:port, for `ray.init(address=...)`")
    token_secret: str | None = Field(
        default=None,
        description="the Secret (in `namespace`, key `auth_token`) holding the token the "
        "dashboard, job API and GCS ask for; None: they ask for none",
    )


class Resources(BaseModel):
    """Per-node resources the trainer must ask Ray for (preflight checks them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus_per_learner: float = Field(ge=0)
    gpus_per_learner: float = Field(ge=0)
    cpus_per_env_runner: float = Field(ge=0)


class GameTLS(BaseModel):
    """How env runners talk TLS to the games: files on the machine (or pod) they run on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_path: str = Field(description="CA bundle (PEM) the games' certificate is checked against")
    cert_path: str | None = Field(default=None, description="mutual TLS: client certificate")
    key_path: str | None = Field(default=None, description="mutual TLS: its private key")

    @classmethod
    def in_directory(cls, directory: str, *, mutual: bool) -> GameTLS:
        """The Secret's files as mounted (or written) in `directory`."""
        directory = directory.rstrip("/")
        return cls(
            ca_path=f"{directory}/{TLS_CA_KEY}",
            cert_path=f"{directory}/{TLS_CERT_KEY}" if mutual else None,
            key_path=f"{directory}/{TLS_KEY_KEY}" if mutual else None,
        )

    @classmethod
    def mounted(cls, *, mutual: bool) -> GameTLS:
        """Where the stack's Ray pods mount the games' TLS Secret."""
        return cls.in_directory(GAME_TLS_MOUNT_DIR, mutual=mutual)

    @model_validator(mode="after")
    def _cert_with_key(self) -> GameTLS:
        if (self.cert_path is None) != (self.key_path is None):
            raise ValueError("cert_path and key_path go together (mutual TLS)")
        return self


class RunStorage(BaseModel):
    """Where a training run's artefacts go, as the machine the driver runs on sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str = Field(
        pattern=r"^(file:///|s3://)\S+$",
        description="file:///<directory> (a volume the driver's machine mounts) or "
        "s3://<bucket>/<prefix>; a run goes to <uri>/<run name>",
    )
    s3_endpoint: str | None = Field(default=None, description="S3: the store's URL (None: AWS)")
    s3_region: str | None = Field(default=None, description="S3: the bucket's region")
    keep_checkpoints: int | None = Field(
        default=None,
        ge=1,
        description="checkpoints a run keeps: the newest this many, the one `latest` names "
        "and the best (topology runs.keep_checkpoints); None: every one",
    )


class Endpoints(BaseModel):
    """Version 1 of the contract between infra and training."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    namespace: str
    cluster_name: str
    pattern: Pattern
    ray: RayAddresses
    discovery_endpoint: str = Field(description="host:port of the game used for discovery")
    worker_url_template: str = Field(description="host of env runner i's game; {worker_index}")
    port: int = Field(ge=1, le=65535)
    port_offset_mode: PortOffsetMode
    num_env_runners: int = Field(
        ge=0, description="Y: env runners, one UE instance each (0: a training pauses)"
    )
    num_learners: int = Field(ge=0, description="X: learner nodes")
    custom_resource: str = Field(description="Ray resource each env-runner node advertises")
    learner_custom_resource: str | None = Field(
        default=None,
        description="Ray resource each learner node advertises, one unit per learner; "
        "None: learners go to any node with room",
    )
    resources: Resources
    simulator_startup_timeout_s: float = Field(gt=0)
    tls: GameTLS | None = Field(default=None, description="TLS to the games; None: plaintext")
    runs: RunStorage | None = Field(
        default=None, description="durable run storage; None: runs/ beside the driver"
    )

    def worker_endpoint(self, worker_index: int) -> str:
        if not 1 <= worker_index <= self.num_env_runners:
            raise EndpointsError(
                f"worker_index {worker_index} is outside 1..{self.num_env_runners} "
                "(num_env_runners)"
            )
        return worker_endpoint(
            self.worker_url_template, self.port, self.port_offset_mode, worker_index
        )

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_obj(cls, data: Any, *, source: str = "endpoints") -> Endpoints:
        """Accept the object itself or a whole `pulumi stack output --json`."""
        if isinstance(data, dict) and "endpoints" in data and "schema_version" not in data:
            data = data["endpoints"]
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
                for err in exc.errors()
            )
            raise EndpointsError(f"{source} is not a valid endpoints object: {problems}") from None

    @classmethod
    def from_json(cls, text: str, *, source: str = "endpoints") -> Endpoints:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EndpointsError(f"{source} is not JSON: {exc}") from None
        return cls.from_obj(data, source=source)

    @classmethod
    def from_file(cls, path: str | Path) -> Endpoints:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise EndpointsError(f"cannot read endpoints file {path}: {exc.strerror}") from None
        return cls.from_json(text, source=str(path))
