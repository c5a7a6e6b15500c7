"""Where a training's runs are stored (`runs`): a claim mounted on the head, or an
S3-compatible bucket (its names checked by infra/s3_rules.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from infra import s3_rules
from infra.topology.validation_errors import FieldError
from infra.topology.value_types import (
    ClaimName,
    Quantity,
    SecretName,
    Spec,
    StorageClassName,
    checked_text,
)

# Where the Ray head mounts the runs claim (`runs.store: claim`).
RUNS_MOUNT_PATH = "/uerl/runs"
# The keys of `runs.s3.credentials_secret`, passed to the head as the environment
# variables of the same names (what every S3 client reads).
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

BucketName = checked_text(s3_rules.bucket_name)
KeyPrefix = checked_text(s3_rules.key_prefix)
EndpointUrl = checked_text(s3_rules.endpoint_url)
RegionName = checked_text(s3_rules.region_name)


class RunsClaimSpec(Spec):
    """The PersistentVolumeClaim runs are stored on (`runs.store: claim`)."""

    existing_claim: ClaimName | None = None
    """Use this PersistentVolumeClaim instead of creating one."""
    size: Quantity = "20Gi"
    """Size of the claim uerl creates, a Kubernetes quantity."""
    storage_class: StorageClassName | None = None
    """Storage class of that claim. None: the cluster's default; "": no class (a volume made for
    it)."""
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    """Only the Ray head mounts it (the driver runs there)."""
    keep_on_destroy: bool = True
    """`pulumi destroy` leaves the claim uerl created, runs and all (the next `pulumi up` takes it
    back); false: destroy deletes it with every run on it."""

    @model_validator(mode="after")
    def _keeps_only_its_own(self) -> RunsClaimSpec:
        # uerl never deletes a claim it did not create: the field would do nothing.
        if self.existing_claim is not None and "keep_on_destroy" in self.model_fields_set:
            raise FieldError(
                ("keep_on_destroy",),
                "runs.claim.existing_claim is set: uerl creates no claim, and never deletes it",
            )
        return self


class RunsS3Spec(Spec):
    """An S3-compatible bucket runs are stored in (`runs.store: s3`)."""

    bucket: BucketName
    """The bucket; it must exist (a training refuses to start otherwise)."""
    prefix: KeyPrefix = "uerl-runs"
    """Key prefix of every run: `s3://<bucket>/<prefix>/<run>/...`."""
    endpoint: EndpointUrl | None = None
    """The store's URL. None: AWS S3 in `region`."""
    region: RegionName = "us-east-1"
    """The bucket's region (S3-compatible stores mostly ignore it)."""
    credentials_secret: SecretName | None = None
    """A Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, given to the head as those
    variables. None: the head's service account identity (IRSA, workload identity) or the node's
    grants access."""


class RunsSpec(Spec):
    """Where a training's artefacts go (checkpoints, metrics, curves, events, logs, ONNX):
    durable storage outside the Ray head, so a run outlives its pods."""

    store: Literal["claim", "s3"] = "claim"
    """`claim`: a PersistentVolumeClaim mounted on the head; `s3`: an S3-compatible bucket."""
    claim: RunsClaimSpec = RunsClaimSpec()
    s3: RunsS3Spec | None = None
    keep_checkpoints: int | None = Field(default=5, ge=1)
    """Checkpoints a run keeps: the newest this many, and also the one `latest` names and the best
    (highest episode return mean); older ones are deleted from the claim, the bucket and the
    head's staging as the run goes on. None: every one is kept."""
    staging_size: Quantity = "10Gi"
    """Size limit of the Ray head's /tmp (an emptyDir: Ray's session files, and a run bound for a
    bucket is written there first), a Kubernetes quantity. Past it the kubelet evicts the head (a
    supervised run resumes on the next)."""

    @model_validator(mode="after")
    def _store_is_described(self) -> RunsSpec:
        if self.store == "s3" and self.s3 is None:
            raise FieldError(("s3",), "runs.store is 's3': give at least s3.bucket")
        if self.store == "claim" and self.s3 is not None:
            raise FieldError(
                ("store",), "runs.s3 is set but runs.store is 'claim': set store to 's3'"
            )
        return self

    @property
    def uri(self) -> str:
        """Where runs go, as the head sees it."""
        if self.store == "s3":
            assert self.s3 is not None  # checked above
            return f"s3://{self.s3.bucket}/{self.s3.prefix}"
        return f"file://{RUNS_MOUNT_PATH}"
