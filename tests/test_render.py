"""`uerl render`: the stack's objects as multi-document YAML, offline, like `helm template`."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from doc_blocks import blocks
from infra_fixtures import KUBERAY_CHART, PROJECT_ROOT, rendered, split_documents

from infra.config_path import ConfigPathError, parse_path, parse_value, set_path
from infra.manifests import pod_security
from infra.render import main
from training.cli import main as uerl


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def kinds(text: str) -> list[str]:
    return [yaml.safe_load(doc)["kind"] for doc in split_documents(text)[1]]


@pytest.fixture(autouse=True)
def _in_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECT_ROOT)


def test_dev_stack_renders_namespace_endpoints_and_raycluster(capsys) -> None:
    code, out, _ = run(capsys, "--stack", "dev")
    assert code == 0
    # The NetworkPolicy comes before any pod it guards; the runs' claim before the head.
    assert kinds(out) == [
        "Namespace",
        "NetworkPolicy",
        "NetworkPolicy",  # the run supervisors' way to the head's job API
        "PersistentVolumeClaim",
        "ConfigMap",
        "RayCluster",
    ]


def test_output_starts_with_a_comment_naming_the_operator_chart_and_version(capsys) -> None:
    header, _ = split_documents(run(capsys, "--stack", "dev")[1])
    assert header.startswith("# uerl render")
    assert "kuberay-operator 1.7.0" in header
    assert all(line.startswith("#") for line in header.splitlines())


def test_no_operator_comment_when_the_cluster_already_has_it(capsys) -> None:
    header, _ = split_documents(
        run(capsys, "--stack", "dev", "--set", "topology.operator.install=false")[1]
    )
    assert "not installed by the stack" in header


def test_set_pattern_networked_adds_one_statefulset_and_one_headless_service(capsys) -> None:
    _, out, _ = run(capsys, "--stack", "dev", "--set", "topology.pattern=networked")
    names = [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(out)]
    assert ("StatefulSet", "uerl-ue") in names and ("Service", "uerl-ue") in names
    assert kinds(out)[-2:] == ["Service", "StatefulSet"]


def test_set_worker_replicas_resizes_the_worker_group(capsys) -> None:
    _, out, _ = run(capsys, "--stack", "dev", "--set", "topology.workers.replicas=4")
    (cluster,) = [o for o in yaml.safe_load_all(out) if o["kind"] == "RayCluster"]
    assert cluster["spec"]["workerGroupSpecs"][1]["replicas"] == 4


def test_topology_file_in_yaml_or_json(capsys, tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("pattern: networked\nworkers:\n  replicas: 3\n")
    (tmp_path / "t.json").write_text(
        json.dumps({"pattern": "networked", "workers": {"replicas": 3}})
    )
    yaml_out = run(capsys, "--topology", str(tmp_path / "t.yaml"))[1]
    json_out = run(capsys, "--topology", str(tmp_path / "t.json"))[1]
    assert yaml_out == json_out
    (games,) = [o for o in yaml.safe_load_all(yaml_out) if o["kind"] == "StatefulSet"]
    assert games["spec"]["replicas"] == 4  # 3 workers' games + the discovery game


def test_a_topology_file_that_is_not_yaml_is_one_line_naming_where(capsys, tmp_path) -> None:
    # Before: PyYAML's five lines, naming "<unicode string>" for the file.
    bad = tmp_path / "t.yaml"
    bad.write_text("workers:\n  replicas: [1,\n")
    code, out, err = run(capsys, "--topology", str(bad))
    assert (code, out) == (2, "")
    assert err.strip() == (
        f"uerl render: {bad} is not valid YAML at line 3, column 1: expected the node "
        "content, but found '<stream end>'"
    )


def test_invalid_topology_prints_one_message_naming_the_path_and_exits_2(capsys) -> None:
    code, out, err = run(capsys, "--stack", "dev", "--set", "topology.workers.replicas=-1")
    assert (code, out) == (2, "")
    assert "topology.workers.replicas" in err and "Traceback" not in err


def test_unknown_key_names_the_path(capsys) -> None:
    code, _, err = run(capsys, "--stack", "dev", "--set", "topology.workers.replica=3")
    assert code == 2 and "topology.workers.replica: unknown key" in err


def test_unknown_stack_is_a_clear_error(capsys) -> None:
    code, _, err = run(capsys, "--stack", "nosuchstack")
    assert code == 2 and "Pulumi.nosuchstack.yaml" in err


def test_set_paths_must_start_at_topology(capsys) -> None:
    code, _, err = run(capsys, "--set", "workers.replicas=3")
    assert code == 2 and "topology." in err


def test_uerl_render_dispatches_here(capsys) -> None:
    assert uerl(["render", "--stack", "dev"]) == 0
    assert "kind: RayCluster" in capsys.readouterr().out


def test_uerl_render_runs_as_a_command_without_a_traceback_on_errors() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "training.cli", "render", "--set", "topology.simulator.port=0"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("uerl render: invalid topology (1 error):")
    assert "topology.simulator.port" in proc.stderr and "Traceback" not in proc.stderr


# -- `pulumi config set --path` semantics ------------------------------------------------


def test_set_values_are_typed_like_pulumi_config_set_path() -> None:
    assert [parse_value(v) for v in ("4", "true", "false", "1.5", "04", "mock")] == [
        4,
        True,
        False,
        "1.5",
        "04",
        "mock",
    ]


def test_set_paths_support_list_indices_and_quoted_keys() -> None:
    data: dict = {}
    set_path(data, parse_path('topology.learners.node_selector["kubernetes.io/arch"]'), "amd64")
    set_path(data, parse_path("topology.learners.tolerations[0].key"), "gpu")
    assert data == {
        "topology": {
            "learners": {
                "node_selector": {"kubernetes.io/arch": "amd64"},
                "tolerations": [{"key": "gpu"}],
            }
        }
    }


def test_set_path_rejects_an_index_past_the_end() -> None:
    with pytest.raises(ConfigPathError, match="past the end"):
        set_path({"topology": {"a": []}}, parse_path("topology.a[2]"), 1)


# -- rescaling: stable names, nothing else changes ---------------------------------------


def _changed_paths(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            p
            for k in a.keys() | b.keys()
            for p in _changed_paths(a.get(k), b.get(k), f"{path}/{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            p
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for p in _changed_paths(x, y, f"{path}/{i}")
        ]
    return [] if a == b else [path]


def _endpoints(doc: str) -> dict:
    return json.loads(yaml.safe_load(doc)["data"]["endpoints.json"])


SCALE_ONLY = {
    "/spec/workerGroupSpecs/1/replicas",
    "/spec/workerGroupSpecs/1/minReplicas",
    "/spec/workerGroupSpecs/1/maxReplicas",
}
GAMES_SCALE_ONLY = {"/spec/replicas"}


@pytest.mark.parametrize("pattern", ["sidecar", "networked"])
def test_rescaling_2_4_1_changes_only_replica_counts_and_endpoint_counts(pattern: str) -> None:
    steps = [
        rendered(f"topology.pattern={pattern}", f"topology.workers.replicas={n}") for n in (2, 4, 1)
    ]
    checked = 0
    for before, after in itertools.pairwise(steps):
        for key in before.keys() & after.keys():
            old, new = before[key], after[key]
            if key[0] == "RayCluster":
                assert set(_changed_paths(yaml.safe_load(old), yaml.safe_load(new))) == SCALE_ONLY
            elif key[0] == "ConfigMap":
                assert _changed_paths(_endpoints(old), _endpoints(new)) == ["/num_env_runners"]
            elif key[0] == "StatefulSet":
                assert set(_changed_paths(yaml.safe_load(old), yaml.safe_load(new))) == (
                    GAMES_SCALE_ONLY
                )
            else:
                assert old == new, key  # byte-identical
            checked += 1
    assert checked >= 6


def test_rescaling_the_networked_games_keeps_the_same_two_objects() -> None:
    two, four, one = (
        rendered("topology.pattern=networked", f"topology.workers.replicas={n}") for n in (2, 4, 1)
    )
    assert two.keys() == four.keys() == one.keys()
    replicas = [
        yaml.safe_load(r[("StatefulSet", "uerl-ue")])["spec"]["replicas"] for r in (two, four, one)
    ]
    assert replicas == [3, 5, 2]  # Y games + the discovery game (ordinal 0)


# The chart the repository carries, relative to the project root as a user would set it.
LOCAL_CHART = KUBERAY_CHART.relative_to(PROJECT_ROOT).as_posix()


def test_relative_chart_path_renders_from_the_project_root_in_a_subdirectory(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(PROJECT_ROOT / "infra")
    code, out, _ = run(
        capsys,
        "--stack",
        "dev",
        "--set",
        f"topology.operator.chart_path={LOCAL_CHART}",
    )
    header, _ = split_documents(out)
    assert code == 0
    assert str(KUBERAY_CHART.resolve()) in header


def test_chart_version_mismatch_is_a_clear_error_naming_the_path(capsys) -> None:
    code, _, err = run(
        capsys,
        "--set",
        f"topology.operator.chart_path={LOCAL_CHART}",
        "--set",
        "topology.operator.chart_version=1.8.0",
    )
    assert code == 2 and "topology.operator.chart_version" in err and "Traceback" not in err


# -- a team's own cluster ------------------------------------------------------------------


def test_set_learners_gpu_resource_renders_their_gpus_under_that_name(capsys) -> None:
    sets = ("topology.learners.gpus=2", "topology.learners.gpu_resource=amd.com/gpu")
    _, out, _ = run(capsys, "--stack", "dev", *itertools.chain(*(("--set", s) for s in sets)))
    (cluster,) = [o for o in yaml.safe_load_all(out) if o["kind"] == "RayCluster"]
    learner = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert learner["resources"]["limits"]["amd.com/gpu"] == "2"


def test_a_label_naming_uerls_own_prints_one_message_naming_the_field_and_exits_2(capsys) -> None:
    code, out, err = run(
        capsys, "--stack", "dev", "--set", 'topology.workers.labels["app.kubernetes.io/name"]=x'
    )
    assert (code, out) == (2, "")
    assert (
        """topology.workers.labels["app.kubernetes.io/name"]: 'app.kubernetes.io/name' is one"""
        in err
    )


def test_the_own_cluster_example_of_the_docs_renders_every_pod_placed(
    capsys, tmp_path: Path
) -> None:
    (example,) = [
        b
        for b in blocks(PROJECT_ROOT / "docs" / "kubernetes.md")
        if b.language == "yaml" and "uerl:topology" in b.text
    ]
    topology = yaml.safe_load(example.text)["config"]["uerl:topology"]
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(topology))
    code, out, err = run(capsys, "--topology", str(tmp_path / "own.yaml"))
    assert code == 0, err
    objects = list(yaml.safe_load_all(out))
    kinds_in_order = [o["kind"] for o in objects]
    assert kinds_in_order.index("ServiceAccount") < kinds_in_order.index("RayCluster")
    pods = pod_security.pod_specs(objects)
    assert {spec["serviceAccountName"] for spec in pods.values()} == {"uerl-runner"}
    assert all(spec["imagePullSecrets"] == [{"name": "registry"}] for spec in pods.values())
