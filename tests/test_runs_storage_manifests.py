"""`runs`: where a training's artefacts go on a cluster. The claim (default) is created and
mounted on the Ray head, where the driver runs; object storage gives the head its
credentials; the endpoints tell the driver the same place."""

from __future__ import annotations

from typing import Any

import pytest

from infra import manifests
from infra.manifests import pod_security, runs_storage
from infra.topology import RUNS_MOUNT_PATH, Topology, TopologyError

S3 = {"store": "s3", "s3": {"bucket": "game-runs", "endpoint": "http://store.example:8333"}}


def build(runs: dict[str, Any] | None = None) -> manifests.Manifests:
    return manifests.build(Topology.parse({"runs": runs} if runs is not None else {}))


def head_pod(built: manifests.Manifests) -> dict[str, Any]:
    return built.raycluster["spec"]["headGroupSpec"]["template"]["spec"]


def mounts(pod: dict[str, Any]) -> list[str]:
    return [m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])]


def test_by_default_runs_go_to_a_claim_of_the_default_storage_class() -> None:
    claim = build().runs_pvc
    assert claim is not None
    assert claim["metadata"]["name"] == "uerl-runs"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "20Gi"}},
    }


def test_the_head_mounts_the_claim_writable_by_the_ray_group() -> None:
    pod = head_pod(build())
    assert RUNS_MOUNT_PATH in mounts(pod)
    volume = next(v for v in pod["volumes"] if v["name"] == runs_storage.VOLUME_NAME)
    assert volume["persistentVolumeClaim"] == {"claimName": "uerl-runs"}
    assert pod["securityContext"]["fsGroup"] == pod_security.RAY_GID


def test_only_the_head_mounts_the_claim() -> None:
    for group in build().raycluster["spec"]["workerGroupSpecs"]:
        assert RUNS_MOUNT_PATH not in mounts(group["template"]["spec"])


def test_the_endpoints_send_runs_to_the_mounted_claim() -> None:
    runs = Topology.parse({}).endpoints().runs
    assert runs is not None and runs.uri == f"file://{RUNS_MOUNT_PATH}"


def test_size_and_storage_class_are_the_claims() -> None:
    claim = build({"claim": {"size": "200Gi", "storage_class": "fast-ssd"}}).runs_pvc
    assert claim is not None
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"


def test_an_existing_claim_is_mounted_not_created() -> None:
    built = build({"claim": {"existing_claim": "team-runs"}})
    assert built.runs_pvc is None
    volume = next(v for v in head_pod(built)["volumes"] if v["name"] == runs_storage.VOLUME_NAME)
    assert volume["persistentVolumeClaim"]["claimName"] == "team-runs"


def test_object_storage_needs_no_claim_and_sends_runs_to_the_bucket() -> None:
    built = build(S3)
    assert built.runs_pvc is None
    assert RUNS_MOUNT_PATH not in mounts(head_pod(built))
    runs = built.topology.endpoints().runs
    assert runs is not None
    assert (runs.uri, runs.s3_endpoint, runs.s3_region) == (
        "s3://game-runs/uerl-runs",
        "http://store.example:8333",
        "us-east-1",
    )


def test_the_credentials_secret_reaches_the_head_as_the_s3_variables() -> None:
    runs = {**S3, "s3": {**S3["s3"], "credentials_secret": "runs-keys"}}  # type: ignore[dict-item]
    env = head_pod(build(runs))["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "runs-keys", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "runs-keys", "key": "AWS_SECRET_ACCESS_KEY"},
    }


def test_without_a_credentials_secret_the_head_gets_no_keys() -> None:
    env = head_pod(build(S3))["containers"][0]["env"]
    assert not [e for e in env if e["name"].startswith("AWS_")]


@pytest.mark.parametrize(
    ("runs", "path"),
    [
        ({"store": "s3"}, "topology.runs.s3"),
        ({"s3": {"bucket": "game-runs"}}, "topology.runs.store"),
        ({"store": "s3", "s3": {"bucket": "Game_Runs"}}, "topology.runs.s3.bucket"),
        ({"store": "s3", "s3": {"bucket": "ab"}}, "topology.runs.s3.bucket"),
        ({"store": "s3", "s3": {"bucket": "runs", "prefix": "/a/"}}, "topology.runs.s3.prefix"),
        ({"store": "s3", "s3": {"bucket": "runs", "endpoint": "s3.aws"}},
         "topology.runs.s3.endpoint"),
        ({"store": "s3", "s3": {"bucket": "runs", "credentials_secret": "A"}},
         "topology.runs.s3.credentials_secret"),
        ({"claim": {"size": "0"}}, "topology.runs.claim.size"),
        ({"store": "nfs"}, "topology.runs.store"),
    ],
)  # fmt: skip
def test_bad_run_storage_is_refused_naming_the_field(runs: dict[str, Any], path: str) -> None:
    with pytest.raises(TopologyError) as exc:
        Topology.parse({"runs": runs})
    assert f"{path}:" in str(exc.value)
