"""What a topology implies, derived from its fields: the names of its objects and hosts
(stable: rescaling never renames anything), the groups of pods and the accounts it makes,
and the endpoints object it hands training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from infra.contract import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT
from infra.endpoints import Endpoints, GameTLS, RayAddresses, Resources, RunStorage
from infra.topology.pods import PodSpec, ServiceAccountSpec
from infra.topology.simulator_spec import LOOPBACK

if TYPE_CHECKING:
    from infra.endpoints import Pattern
    from infra.topology.ray_spec import LearnerSpec, RaySpec, WorkerSpec
    from infra.topology.runs_spec import RunsSpec
    from infra.topology.simulator_spec import ExecutablesSpec, SimulatorSpec


class DerivedNames:
    """Topology's derived names and groups (a base of `Topology`, which has the fields)."""

    if TYPE_CHECKING:
        name: str
        namespace: str
        pattern: Pattern
        ray: RaySpec
        learners: LearnerSpec
        workers: WorkerSpec
        simulator: SimulatorSpec
        executables: ExecutablesSpec
        runs: RunsSpec

    @property
    def head_service_host(self) -> str:
        return f"{self.name}-head-svc.{self.namespace}.svc.cluster.local"

    @property
    def ray_token_secret(self) -> str | None:
        """The Secret holding the token Ray's API and GCS ask for; None: no token."""
        if self.ray.auth.mode == "disabled":
            return None
        # KubeRay names the Secret it makes after the RayCluster.
        return self.ray.auth.secret_name or self.name

    @property
    def claim_name(self) -> str:
        return self.executables.existing_claim or f"{self.name}-ue-executables"

    @property
    def runs_claim_name(self) -> str | None:
        """The claim runs are stored on; None when they go to object storage."""
        if self.runs.store != "claim":
            return None
        return self.runs.claim.existing_claim or f"{self.name}-runs"

    @property
    def uses_executables(self) -> bool:
        """Only an Unreal build lives on the shared volume, unless it is in the game's
        image; the mock game is in its image (and dev clusters often have no
        ReadWriteMany storage)."""
        return self.simulator.kind == "unreal" and not self.executables.in_image

    @property
    def has_loader(self) -> bool:
        """A Job unpacks `executables.source_url` into the volume."""
        return self.uses_executables and self.executables.source_url is not None

    def pod_groups(self) -> dict[tuple[str, ...], PodSpec]:
        """The groups whose pods this topology makes, by config path."""
        groups: dict[tuple[str, ...], PodSpec] = {
            ("ray", "head"): self.ray.head,
            ("learners",): self.learners,
            ("workers",): self.workers,
        }
        if self.pattern == "networked":
            groups[("simulator",)] = self.simulator
        if self.has_loader:
            groups[("executables", "loader")] = self.executables.loader
        return groups

    def created_service_accounts(self) -> list[ServiceAccountSpec]:
        """The accounts the stack creates, one per name."""
        out: dict[str, ServiceAccountSpec] = {}
        for group in self.pod_groups().values():
            account = group.service_account
            if account is not None and account.create:
                out.setdefault(account.name, account)
        return list(out.values())

    @property
    def has_dedicated_discovery(self) -> bool:
        return self.pattern == "networked" and self.simulator.discovery == "dedicated"

    @property
    def forwards_game_port(self) -> bool:
        """Networked games bound to loopback are reached through a forwarder in their pod."""
        return self.pattern == "networked" and self.simulator.loopback

    @property
    def game_tls_server(self) -> Literal["forwarder", "game"] | None:
        """Which container serves TLS to env runners (None: no TLS, or none can)."""
        if self.simulator.tls is None:
            return None
        if self.forwards_game_port:
            return "forwarder"
        return "game" if self.simulator.kind == "mock" else None

    @property
    def game_tls_hosts(self) -> list[str]:
        """The names env runners dial, which the games' certificate must hold."""
        if self.pattern == "sidecar":
            return ["localhost", LOOPBACK]
        return [f"*.{self.ue_set_name}.{self.namespace}.svc.cluster.local"]

    @property
    def game_listen_port(self) -> int:
        """The port the game itself listens on."""
        return self.simulator.forwarded_port if self.forwards_game_port else self.simulator.port

    @property
    def ue_set_name(self) -> str:
        """The networked games' StatefulSet and headless Service, `<name>-ue`.

        Prefixed with the topology's name so two stacks can share a namespace."""
        return f"{self.name}-ue"

    @property
    def ue_first_ordinal(self) -> int:
        """Ordinal 0 is the dedicated discovery game; env runner i's game is ordinal i."""
        return 0 if self.has_dedicated_discovery else 1

    @property
    def ue_replicas(self) -> int:
        return self.workers.replicas + (1 - self.ue_first_ordinal)

    def ue_instance_name(self, index: int | str) -> str:
        """Pod (and DNS) name of game `index`: `<name>-ue-1` ... `<name>-ue-Y`, `<name>-ue-0`."""
        return f"{self.ue_set_name}-{index}"

    def ue_instance_host(self, index: int | str) -> str:
        # A StatefulSet pod's DNS name under its headless Service.
        return (
            f"{self.ue_instance_name(index)}.{self.ue_set_name}.{self.namespace}.svc.cluster.local"
        )

    def endpoints(self) -> Endpoints:
        """The endpoints object for this topology deployed on Kubernetes."""
        port = self.simulator.port
        if self.pattern == "sidecar":
            template, discovery = "localhost", f"localhost:{port}"
        else:
            # The one place game host names are spelled: env runners expand the template.
            template = self.ue_instance_host("{worker_index}")
            discovery = f"{self.ue_instance_host(self.ue_first_ordinal)}:{port}"
        head = self.head_service_host
        return Endpoints(
            namespace=self.namespace,
            cluster_name=self.name,
            pattern=self.pattern,
            ray=RayAddresses(
                dashboard_url=f"http://{head}:{DASHBOARD_PORT}",
                client_address=f"ray://{head}:{CLIENT_PORT}",
                gcs_address=f"{head}:{GCS_PORT}",
                token_secret=self.ray_token_secret,
            ),
            discovery_endpoint=discovery,
            worker_url_template=template,
            port=port,
            port_offset_mode="fixed",
            num_env_runners=self.workers.replicas,
            num_learners=self.learners.replicas,
            custom_resource=self.workers.custom_resource,
            learner_custom_resource=self.learners.custom_resource,
            resources=Resources(
                cpus_per_learner=self.learners.cpus,
                gpus_per_learner=self.learners.gpus,
                cpus_per_env_runner=self.workers.cpus,
            ),
            simulator_startup_timeout_s=self.simulator.startup_timeout_s,
            tls=GameTLS.mounted(mutual=self.simulator.tls.mutual) if self.simulator.tls else None,
            runs=RunStorage(
                uri=self.runs.uri,
                s3_endpoint=self.runs.s3.endpoint if self.runs.s3 else None,
                s3_region=self.runs.s3.region if self.runs.s3 else None,
                keep_checkpoints=self.runs.keep_checkpoints,
            ),
        )
