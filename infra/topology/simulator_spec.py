"""The game (`simulator`: one instance per env runner, its command, port, probe and TLS)
and where its build comes from (`executables`: the shared volume and the loader Job)."""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from infra import k8s_rules
from infra.topology.pods import PodSpec, SizedSpec
from infra.topology.validation_errors import FieldError
from infra.topology.value_types import (
    GPU_RESOURCE,
    MAX_CPUS,
    ClaimName,
    GpuResource,
    Image,
    Quantity,
    SecretName,
    Spec,
    SpreadConstraint,
    StorageClassName,
    Text,
)

# The forwarder (networked pattern, loopback games) runs this image's `python`.
FORWARDER_IMAGE = "python:3.11-slim"
# The labels a networked game's topology spread constraint selects by, unless it says
# (infra/manifests/simulator.py: the stack's games).
GAME_SELECTOR_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/name")


class GameTLSSpec(Spec):
    """TLS for the games' gRPC. The Secret (in the stack's namespace, made by you or
    cert-manager, or by `uerl tls-secret`) holds `ca.crt`, `tls.crt` and `tls.key`;
    the certificate names the hosts env runners dial (`uerl tls-secret` says which)."""

    secret: SecretName
    """The Secret's name (it holds ca.crt, tls.crt, tls.key)."""
    mutual: bool = False
    """Games accept only clients presenting a certificate the Secret's CA signed; env runners
    present the Secret's own certificate (it must allow client auth)."""


SIMULATOR_DEFAULTS: dict[str, dict[str, Any]] = {
    # A packaged Linux UE build runs from the shared volume; `{executable}` is
    # the game's launcher inside it. Schola reads its port from -ScholaPort; the
    # address it binds comes from the build's project settings (`simulator.listen`).
    "unreal": {
        "image": "ubuntu:22.04",
        "command": ["{executable}"],
        "args": ["-ScholaPort={port}", "-nullrhi", "-unattended", "-nosplash", "-nosound"],
    },
    # The mock game (uerl mock-ue), for tests and dev clusters. It binds where
    # `simulator.listen` says a build binds, so dev clusters exercise that path.
    "mock": {
        "image": "uerl/mock-ue:0.1.0",
        "command": ["uerl", "mock-ue"],
        "args": ["--host", "{host}", "--port", "{port}"],
    },
}
PLACEHOLDERS = frozenset({"port", "executable", "host"})
LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"


class SimulatorSpec(PodSpec, SizedSpec):
    """The game: one instance per env runner (plus an optional discovery instance). Its
    pod fields (`node_selector` ... `service_account`, `topology_spread_constraints`) are
    the networked games' pods'; a sidecar game runs in the workers' pod."""

    kind: Literal["unreal", "mock"] = "unreal"
    """`unreal`: a packaged build on the shared volume; `mock`: `uerl mock-ue`, no volume."""
    image: Image | None = None
    """The game container's image. None: `ubuntu:22.04` (unreal), `uerl/mock-ue:0.1.0` (mock)."""
    executable: Text = "Game.sh"
    """Path of the game launcher relative to `executables.mount_path`."""
    command: list[Text] | None = None
    """The game's command and arguments; placeholders `{port}` (where it listens), `{host}`
    (127.0.0.1 or 0.0.0.0) and `{executable}`. None: the kind's default, unreal
    `["{executable}"]` with `["-ScholaPort={port}", "-nullrhi", "-unattended", "-nosplash",
    "-nosound"]`."""
    args: list[Text] | None = None
    """The game's arguments, with the same placeholders (see `command`)."""
    port: int = Field(default=50051, ge=1, le=65535)
    """The port env runners connect to (the endpoints' `port`)."""
    listen: Literal["loopback", "all_interfaces"] = "loopback"
    """Where the build's gRPC server binds. `loopback`: Schola's default (RPCServerSettings.Address
    127.0.0.1; -ScholaPort changes only the port). `all_interfaces`: a build packaged to bind
    0.0.0.0."""
    internal_port: int | None = Field(default=None, ge=1, le=65535)
    """Networked pattern with a loopback game: the game listens on 127.0.0.1 on this port and a
    forwarder in its pod serves `port` on the pod IP. None: `port` + 1 (`port` - 1 for 65535)."""
    forwarder_image: Image = FORWARDER_IMAGE
    """The image running that forwarder (its `python`, standard library only)."""
    cpus: float = Field(default=2, gt=0, le=MAX_CPUS)
    """CPUs of the game container."""
    memory: Quantity = "4Gi"
    """Memory of the game container, a Kubernetes quantity."""
    gpus: int = Field(default=0, ge=0, le=16)
    """GPUs of the game container, asked for as `gpu_resource`."""
    gpu_resource: GpuResource = GPU_RESOURCE
    """The extended resource the game's GPUs are, e.g. `amd.com/gpu`."""
    topology_spread_constraints: list[SpreadConstraint] = []
    """How the networked games spread over nodes or zones: Kubernetes topology spread constraints,
    passed through; one without `labelSelector` selects the stack's games."""
    env: dict[Text, Text] = {}
    """Extra environment of the game (an unreal game also gets HOME=/tmp)."""
    startup_timeout_s: float = Field(default=120, gt=0, le=3600)
    """Time the game has to open its port before it is restarted (startup probe)."""
    probe: Literal["tcp", "grpc"] = "tcp"
    """How the kubelet checks the game: `tcp`, its port takes connections; `grpc`, its gRPC server
    answers (`schola-probe` in the game's container: the image docker/unreal-game.Dockerfile
    builds has it). Unreal games only."""
    tls: GameTLSSpec | None = None
    """TLS to the games (off by default): served by the forwarder where there is one, else by the
    game itself (the mock game can; a stock Schola build cannot)."""
    discovery: Literal["dedicated", "worker1"] = "dedicated"
    """`dedicated`: a separate instance (ordinal 0) answers discovery (networked); `worker1`:
    discovery reuses instance 1 (a game serves one client at a time, and discovery closes its
    session before training starts)."""

    @classmethod
    def pod_field_names(cls) -> tuple[str, ...]:
        return (*super().pod_field_names(), "topology_spread_constraints")

    @field_validator("topology_spread_constraints")
    @classmethod
    def _spread(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # One without a labelSelector is given the stack's games' (manifests/simulator.py).
        return k8s_rules.spread_constraints(value, set(GAME_SELECTOR_LABELS))

    @field_validator("command", "args")
    @classmethod
    def _placeholders(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            try:
                names = {f[1] for f in string.Formatter().parse(item) if f[1] is not None}
            except ValueError as exc:
                raise ValueError(f"{item!r} is not a valid template: {exc}") from None
            unknown = names - PLACEHOLDERS
            if unknown:
                raise ValueError(
                    f"{item!r} uses unknown placeholder(s) {sorted(unknown)}; "
                    f"allowed: {sorted(PLACEHOLDERS)} (write '{{{{' for a literal brace)"
                )
        return value

    @model_validator(mode="after")
    def _grpc_probe_needs_the_game_image(self) -> SimulatorSpec:
        if self.probe == "grpc" and self.kind != "unreal":
            raise FieldError(
                ("probe",),
                "the grpc probe runs schola-probe in the game's image "
                "(docker/unreal-game.Dockerfile), which the mock game's has not: use tcp",
            )
        return self

    @model_validator(mode="after")
    def _internal_port_differs(self) -> SimulatorSpec:
        if self.internal_port == self.port:
            raise ValueError(
                f"internal_port {self.internal_port} equals port: the forwarder serves "
                "`port`, the game must listen on another one"
            )
        return self

    @property
    def image_ref(self) -> str:
        return self.image or SIMULATOR_DEFAULTS[self.kind]["image"]

    @property
    def loopback(self) -> bool:
        return self.listen == "loopback"

    @property
    def host(self) -> str:
        return LOOPBACK if self.loopback else ALL_INTERFACES

    @property
    def forwarded_port(self) -> int:
        """The game's own port behind a forwarder."""
        if self.internal_port is not None:
            return self.internal_port
        return self.port + 1 if self.port < 65535 else self.port - 1

    def render_command(
        self, mount_path: str, *, port: int | None = None
    ) -> tuple[list[str], list[str]]:
        """(command, args) with `{port}` (the game's listening port, default `port`),
        `{host}` and `{executable}` substituted."""
        values = {
            "port": self.port if port is None else port,
            "host": self.host,
            "executable": f"{mount_path.rstrip('/')}/{self.executable}",
        }
        defaults = SIMULATOR_DEFAULTS[self.kind]
        command = self.command if self.command is not None else defaults["command"]
        args = self.args if self.args is not None else defaults["args"]
        return (
            [part.format(**values) for part in command],
            [part.format(**values) for part in args],
        )


class LoaderSpec(PodSpec):
    """The loader Job's pod (with `source_url`): where it runs and as whom."""


class ExecutablesSpec(Spec):
    """The shared volume holding the packaged game, mounted read-only into every UE container."""

    existing_claim: ClaimName | None = None
    """Use this PersistentVolumeClaim instead of creating one."""
    size: Quantity = "20Gi"
    """Size of the claim uerl creates, a Kubernetes quantity."""
    storage_class: StorageClassName | None = None
    """Storage class of that claim (it must provide the access mode). None: the cluster's default;
    "": no class (a volume made for it)."""
    access_mode: Literal["ReadWriteMany", "ReadOnlyMany"] = "ReadWriteMany"
    """Every game pod mounts the volume at once, so one claim serves many nodes."""
    mount_path: Text = Field(default="/opt/ue", pattern=r"^/\S*$")
    """Where every UE container mounts the volume (read-only), absolute."""
    in_image: bool = False
    """The build is in `simulator.image`, at `mount_path` (docker/unreal-game.Dockerfile puts it
    there): no volume, no loader Job; the fields above and below are unused."""
    source_url: Text | None = Field(default=None, pattern=r"^(https?|s3|gs)://\S+$")
    """A build archive (.zip / .tar.gz) unpacked into the volume by a one-off Job."""
    loader_image: Image = "alpine:3.20"
    """Image of that Job and of the init containers waiting for it (needs sh, wget, tar, unzip:
    alpine has them; s3:// needs `aws`, gs:// `gsutil`)."""
    loader_timeout_s: int = Field(default=3600, ge=60, le=86400)
    """How long `pulumi up` waits for the loader Job. A claim the storage cannot provide (no
    ReadWriteMany) keeps the Job pending for all of it."""
    loader: LoaderSpec = LoaderSpec()

    @model_validator(mode="after")
    def _a_build_in_the_image_needs_no_volume(self) -> ExecutablesSpec:
        volume = [name for name in ("existing_claim", "source_url") if getattr(self, name)]
        if self.in_image and volume:
            raise FieldError(
                (volume[0],),
                "executables.in_image is true: the build is in the game's image, so no "
                "volume is mounted and nothing is loaded into one",
            )
        return self
