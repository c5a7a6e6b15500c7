"""The component package (infra/package) used by programs that are not uerl's own, run by
the real Pulumi CLI against the tier's control plane: a Pulumi YAML program (the YAML
language host built by build.sh) and a Python program using the SDK `pulumi package add`
generates, each with its own explicit Kubernetes provider. Then uerl's own project moved
onto the component: a stack made before the component existed keeps every resource (the
only step is the component's own create), and after that `up` previews no change.

(Named apart from tests/test_component_package.py, the package's schema tests: pytest
collects both directories in one session, and two test modules may not share a name.)

The YAML consumer runs on a cluster that has KubeRay already (the shared `control_plane`
of tests/k8s/conftest.py: its CRDs and operator), with `operator.install: false`: then every object
the component makes goes through the consumer's provider. The Python consumer installs
KubeRay on a cluster without it (`bare_control_plane`), where uerl reaches the cluster
itself (the CRDs, the kept claim's provider) through the `kubeconfig` input it is given,
and rescales it. The CLI's environment has no KUBECONFIG, so nothing could reach a cluster
another way. What this module leaves on the shared plane (uerl's own stack's kept claim
and namespace) goes at its end.

How the package is loaded offline. For a package given by path, Pulumi's Python host
(3.259) runs, at `pulumi package add` and at each program run that loads it, `python -m
venv <the plugin's virtualenv>` with the `python3` on PATH, then `pip install --upgrade
pip setuptools wheel` in it. The package's virtualenv is `../../.venv`, the project's, so
this would re-create uerl's own venv (with another Python if another is first on PATH) and
upgrade its pip from PyPI. Here the package's two files are copied, unchanged, into a
directory of the test whose `.venv` is a throwaway venv layered on the project's (its site
directory added by a .pth file; `wheel` is setuptools' vendored copy), with its `python3`
first on PATH and `PIP_NO_INDEX=1`: pip keeps what is installed and nothing is fetched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import venv
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import KUBERAY_CHART_DIR, KUBERAY_CRD_NAMES, REPO, ControlPlane, find_binaries
from host_speed import guard
from pulumi_project import PulumiProject
from stacks import chart_runs_operator, running_and_ready

# Every consumer's up, rescale and destroy, a few minutes each loaded.
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(guard(2700))]

PACKAGE = REPO / "infra" / "package"
# The last commit before TrainingCluster (26e5ca5's parent): uerl's program as its stacks
# were made before the component.
BEFORE_COMPONENT = "ffdf8a58c929fbc20df31bff63fc66a12b40032f"
STACK_LABEL = "app.kubernetes.io/instance"


def small_topology(name: str, replicas: int) -> dict[str, Any]:
    """The dev stack's sizes (Pulumi.dev.yaml) in a namespace of its own, on a cluster
    with KubeRay (no operator install), nothing kept by a destroy."""
    return {
        "name": name,
        "namespace": name,
        "operator": {"install": False},
        "simulator": {"kind": "mock", "cpus": 1, "memory": "1Gi"},
        "ray": {"head": {"memory": "2Gi"}},
        "learners": {"cpus": 1, "memory": "2Gi"},
        "workers": {"replicas": replicas},
        "runs": {"claim": {"keep_on_destroy": False}},
    }


def camel_keys(value: Any) -> Any:
    """The schema's property names (snake_case fields as camelCase), as YAML writes them."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            first, *rest = key.split("_")
            out[first + "".join(part.title() for part in rest)] = camel_keys(item)
        return out
    return value


# ---- the package and the consumer projects -----------------------------------------------


def layered_venv(path: Path) -> Path:
    """A throwaway venv that sees the project's (pulumi, pulumi_kubernetes, uerl): its site
    directory added by a .pth file, and setuptools' vendored `wheel` beside it."""
    # Symlinks, as `python -m venv` makes them: Pulumi runs `python3 -m venv` on it with its
    # own python3, which could not overwrite a copy of the running binary.
    venv.EnvBuilder(with_pip=True, symlinks=True).create(path)
    base = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = base / "site-packages"
    (ours,) = (path / "lib").glob("python*/site-packages")
    (ours / "uerl-project-venv.pth").write_text(
        f"import site; site.addsitedir({str(site)!r})\n{site / 'setuptools' / '_vendor'}\n"
    )
    return path / "bin"


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """infra/package's files, unchanged, with a `.venv` two directories up (its
    `virtualenv: ../../.venv`)."""
    home = tmp_path_factory.mktemp("uerl-package")
    target = home / "infra" / "package"
    target.mkdir(parents=True)
    for name in ("PulumiPlugin.yaml", "__main__.py"):
        shutil.copy2(PACKAGE / name, target / name)
    layered_venv(home / ".venv")
    return target


def consumer(
    workdir: Path, package: Path, kubeconfig: Path, pulumi_yaml: dict[str, Any]
) -> PulumiProject:
    """A project of its own (Pulumi.yaml as given), with the CLI, its Python and YAML
    language hosts and the Kubernetes provider; no KUBECONFIG in its environment."""
    project = PulumiProject(workdir, kubeconfig)
    for entry in project.dir.iterdir():
        entry.unlink()  # uerl's own project files and links
    yaml_host = find_binaries(["pulumi-yaml"])["pulumi-language-yaml"]
    shutil.copy2(yaml_host, project.pulumi.parent / yaml_host.name)
    del project.env["KUBECONFIG"]
    plugin_bin = package.parent.parent / ".venv" / "bin"
    project.env["PATH"] = f"{plugin_bin}{os.pathsep}{project.env['PATH']}"
    project.env["PIP_NO_INDEX"] = "1"
    project.env["PIP_NO_BUILD_ISOLATION"] = "0"  # pip's spelling of --no-build-isolation
    if "PYTHONPATH" in os.environ:  # a checkout run from another's venv: its infra/
        project.env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    (project.dir / "Pulumi.yaml").write_text(yaml.safe_dump(pulumi_yaml, sort_keys=False))
    return project


def provider_settings(kubeconfig: Path) -> dict[str, Any]:
    # enableConfigMapMutable: the endpoints ConfigMap updated in place on a rescale, as
    # uerl's own Pulumi.yaml sets it.
    return {"kubeconfig": str(kubeconfig), "enableConfigMapMutable": True}


# ---- what each consumer is judged by -------------------------------------------------------


def raycluster(cp: ControlPlane, name: str) -> dict[str, Any]:
    return dict(cp.get_json("raycluster", "-n", name, name))


def groups_ready(cp: ControlPlane, name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in cp.get_json("pods", "-n", name, "-l", f"ray.io/cluster={name}")["items"]:
        if running_and_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
            group = pod["metadata"]["labels"]["ray.io/group"]
            out[group] = out.get(group, 0) + 1
    return out


def worker_replicas(cp: ControlPlane, name: str) -> int:
    groups = raycluster(cp, name)["spec"]["workerGroupSpecs"]
    (workers,) = [g for g in groups if g["groupName"] == "workers"]
    return int(workers["replicas"])


def stack_objects(cp: ControlPlane, name: str) -> list[str]:
    kinds = cp.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    out = cp.kubectl(
        "get", ",".join(kinds), "-A", "-l", f"{STACK_LABEL}={name}", "-o", "name",
        "--ignore-not-found",
    ).stdout  # fmt: skip
    return sorted(line for line in out.splitlines() if line)


def up_ready(
    project: PulumiProject, cp: ControlPlane, name: str, during: Any = None, what: str = ""
) -> None:
    """`up`: the RayCluster ready with 2 workers, the endpoints output saying so, the
    stack's objects labelled."""
    result = project.up("dev", during=during)
    print(f"pulumi up of {name}{what}: {result.seconds:.1f}s")
    assert raycluster(cp, name)["status"]["state"] == "ready", result.output
    assert groups_ready(cp, name) == {"headgroup": 1, "learners": 1, "workers": 2}
    endpoints = project.outputs("dev")["endpoints"]
    assert endpoints["num_env_runners"] == 2 and endpoints["cluster_name"] == name
    assert stack_objects(cp, name), "the stack's objects carry its label"


def rescaled_to_three(
    project: PulumiProject, cp: ControlPlane, name: str, rescale: Any, during: Any = None
) -> None:
    """The input changed to 3 workers (`rescale`) and `up`: the worker group follows, and
    the endpoints output."""
    rescale()
    result = project.up("dev", during=during)
    print(f"pulumi up of {name}, workers 2 -> 3: {result.seconds:.1f}s")
    assert worker_replicas(cp, name) == 3
    cp.wait_until(
        lambda: groups_ready(cp, name) == {"headgroup": 1, "learners": 1, "workers": 3},
        guard(180),
        f"{name}'s third worker Running and Ready",
    )
    assert project.outputs("dev")["endpoints"]["num_env_runners"] == 3


def up_ready_rescale_destroy(
    project: PulumiProject, cp: ControlPlane, name: str, rescale: Any
) -> None:
    """`up` (RayCluster ready, 2 workers), the input changed to 3 and `up` (the worker
    group follows, and the endpoints output), `destroy` (nothing of the stack left)."""
    up_ready(project, cp, name)
    rescaled_to_three(project, cp, name, rescale)

    result = project.run("destroy", "--yes", stack="dev")
    print(f"pulumi destroy of {name}: {result.seconds:.1f}s")
    # keep_on_destroy false: the claim and the namespace go too.
    cp.wait_until(lambda: not stack_objects(cp, name), guard(180), f"{name}'s objects gone")
    cp.wait_until(
        lambda: cp.kubectl("get", "namespace", name, check=False).returncode != 0,
        guard(180),
        f"namespace {name} gone",
    )
    assert project.resources("dev") == []


# ---- a Pulumi YAML program --------------------------------------------------------------


def yaml_program(package: Path, kubeconfig: Path, topology: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "consumer-yaml",
        "runtime": "yaml",
        # Written here: `pulumi package add` generates the YAML SDK but then asks the
        # language host to link it, which pulumi-yaml v1.25.0 does not implement ("method
        # Link not implemented"), and the entry is never written.
        "packages": {"uerl": str(package)},
        "resources": {
            "k8s": {
                "type": "pulumi:providers:kubernetes",
                "properties": provider_settings(kubeconfig),
            },
            "cluster": {
                "type": "uerl:index:TrainingCluster",
                "properties": {"topology": camel_keys(topology)},
                "options": {"providers": ["${k8s}"]},
            },
        },
        "outputs": {"endpoints": "${cluster.endpoints}"},
    }


@pytest.fixture(scope="module")
def yaml_consumer(
    control_plane: ControlPlane, package: Path, tmp_path_factory: pytest.TempPathFactory
) -> PulumiProject:
    kubeconfig = control_plane.kubeconfig
    program = yaml_program(package, kubeconfig, small_topology("uerl-yaml", 2))
    project = consumer(tmp_path_factory.mktemp("yaml"), package, kubeconfig, program)
    added = project.run("package", "add", str(package), check=False)
    # The SDK is generated (a package declaration for YAML); linking is what fails.
    assert (project.dir / "sdks" / "uerl").is_dir(), added.output
    assert "Link not implemented" in added.output, added.output
    project.new_stack("dev")
    return project


def test_a_yaml_program_brings_a_training_cluster_up_rescales_it_and_destroys_it(
    yaml_consumer: PulumiProject, control_plane: ControlPlane, package: Path
) -> None:
    project, cp = yaml_consumer, control_plane
    program = yaml.safe_load((project.dir / "Pulumi.yaml").read_text())

    def rescale() -> None:
        program["resources"]["cluster"]["properties"]["topology"]["workers"]["replicas"] = 3
        (project.dir / "Pulumi.yaml").write_text(yaml.safe_dump(program, sort_keys=False))

    up_ready_rescale_destroy(project, cp, "uerl-yaml", rescale)


def test_a_bad_topology_value_in_the_yaml_program_fails_preview_in_one_line(
    yaml_consumer: PulumiProject, control_plane: ControlPlane, package: Path
) -> None:
    program = yaml.safe_load((yaml_consumer.dir / "Pulumi.yaml").read_text())
    program["resources"]["cluster"]["properties"]["topology"]["workers"]["replicas"] = -1
    (yaml_consumer.dir / "Pulumi.yaml").write_text(yaml.safe_dump(program, sort_keys=False))
    result = yaml_consumer.run("preview", stack="dev", check=False)
    print(result.output)
    assert result.returncode != 0
    message = "topology.workers.replicas: Input should be greater than or equal to 0"
    assert message in result.output, result.output
    assert control_plane.kubectl("get", "namespace", "uerl-yaml", check=False).returncode != 0
    for words in ("Traceback", "pydantic", 'File "', "Unexpected <class"):
        assert words not in result.output, result.output


# ---- a Python program -----------------------------------------------------------------------

PYTHON_PROGRAM = '''\
"""A team's own program: its provider, and uerl's training cluster beside its things."""

import json
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s
import pulumi_uerl as uerl

settings = json.loads(Path("settings.json").read_text())
k8s_provider = k8s.Provider("k8s", **settings["provider"])
cluster = uerl.TrainingCluster(
    "rl",
    topology=settings["topology"],
    **settings.get("access", {}),  # kubeconfig, context: where uerl reaches the cluster itself
    opts=pulumi.ResourceOptions(providers=[k8s_provider]),
)
pulumi.export("endpoints", cluster.endpoints)
'''


def python_project(
    cp: ControlPlane, package: Path, workdir: Path, settings: dict[str, Any]
) -> PulumiProject:
    """The Python program above, its settings as given (the provider's kubeconfig added),
    the package added and a `dev` stack."""
    kubeconfig = cp.kubeconfig
    program = {
        "name": "consumer-python",
        "runtime": {"name": "python", "options": {"toolchain": "pip", "virtualenv": "venv"}},
    }
    project = consumer(workdir, package, kubeconfig, program)
    layered_venv(project.dir / "venv")
    (project.dir / "requirements.txt").write_text("pulumi\npulumi-kubernetes\n")
    (project.dir / "__main__.py").write_text(PYTHON_PROGRAM)
    provider = {"kubeconfig": str(kubeconfig), "enable_config_map_mutable": True}
    (project.dir / "settings.json").write_text(json.dumps({"provider": provider, **settings}))
    project.run("package", "add", str(package))
    # What `package add` did: the SDK generated, installed into the program's venv, and
    # the package recorded in Pulumi.yaml and requirements.txt.
    written = yaml.safe_load((project.dir / "Pulumi.yaml").read_text())
    assert written["packages"] == {"uerl": str(package)}, written
    assert "sdks/uerl" in (project.dir / "requirements.txt").read_text()
    subprocess.run(
        [str(project.dir / "venv" / "bin" / "python"), "-c", "import pulumi_uerl"], check=True
    )
    project.new_stack("dev")
    return project


# ---- uerl's own stack, made before the component ---------------------------------------------


def tree_at(commit: str, dest: Path) -> Path:
    """uerl's program (infra/) at `commit`, from this clone's history."""
    has = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    assert has.returncode == 0, (
        f"commit {commit[:12]} is not in this clone's history (a shallow clone?): "
        "`git fetch --unshallow` gives it"
    )
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "infra"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def own_project(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PulumiProject]:
    """uerl's own project; after the module, what its destroy keeps (the runs claim, in
    namespace `uerl`) is deleted and waited for: the plane is shared, and
    test_controlplane.py's dev stack is `uerl` in namespace `uerl` too."""
    cp = control_plane
    yield PulumiProject(tmp_path_factory.mktemp("own"), cp.kubeconfig)
    cp.kubectl("delete", "namespace", "uerl", "--ignore-not-found", "--wait=false")
    cp.wait_until(
        lambda: cp.kubectl("get", "namespace", "uerl", check=False).returncode != 0,
        guard(180),
        "namespace uerl gone",
    )


def test_a_stack_made_before_the_component_previews_no_change_after_the_move(
    own_project: PulumiProject, control_plane: ControlPlane, tmp_path: Path
) -> None:
    project, cp = own_project, control_plane
    old = tree_at(BEFORE_COMPONENT, tmp_path / "before")
    assert not (old / "infra" / "components" / "training_cluster.py").exists()
    link = project.dir / "infra"
    link.unlink()
    link.symlink_to(old / "infra", target_is_directory=True)
    current_pythonpath = os.environ.get("PYTHONPATH")
    project.env["PYTHONPATH"] = str(old)  # before the venv's uerl, which is today's
    # The cluster has KubeRay already: the chart installed beside it, its CRDs left alone.
    project.new_stack(
        "dev",
        {
            "topology.operator.chart_path": str(KUBERAY_CHART_DIR),
            "topology.operator.crds": "skip",
        },
    )
    project.up("dev")
    assert raycluster(cp, "uerl")["status"]["state"] == "ready"
    before = {r["urn"] for r in project.resources("dev")}

    link.unlink()
    link.symlink_to(REPO / "infra", target_is_directory=True)
    if current_pythonpath is None:
        del project.env["PYTHONPATH"]
    else:
        project.env["PYTHONPATH"] = current_pythonpath
    # Every resource the old program made is kept (aliases): the one created is the
    # component itself, a logical resource with no object in the cluster. An object
    # whose manifest changed since (the head's pod template, say) is updated in place,
    # never replaced, deleted or made again under another name.
    preview = project.preview_json("dev")
    steps = {step["urn"]: step["op"] for step in preview["steps"]}
    print(json.dumps(preview.get("changeSummary"), indent=1))
    component = "urn:pulumi:dev::uerl::uerl:index:TrainingCluster::uerl"
    created = {urn for urn, op in steps.items() if op == "create"}
    assert created == {component}, steps
    kept = {"same", "update"}
    assert {urn: op for urn, op in steps.items() if urn != component and op not in kept} == {}
    assert set(preview["changeSummary"]) <= {"create", "same", "update"}, preview["changeSummary"]

    uid = raycluster(cp, "uerl")["metadata"]["uid"]
    project.up("dev")  # the move itself: the URNs change, nothing is replaced
    after = {r["urn"] for r in project.resources("dev")}
    assert any("uerl:index:TrainingCluster" in urn for urn in after)
    assert len(after) == len(before) + 1  # the component itself
    assert raycluster(cp, "uerl")["metadata"]["uid"] == uid
    preview_after = project.run("preview", "--expect-no-changes", stack="dev")
    print(preview_after.output)
    project.run("destroy", "--yes", stack="dev")
    kept = ["namespace/uerl", "persistentvolumeclaim/uerl-runs"]  # keep_on_destroy
    cp.wait_until(
        lambda: stack_objects(cp, "uerl") == kept, guard(180), "the dev stack's objects gone"
    )


# ---- a program whose training cluster installs KubeRay -------------------------------------

OPERATOR_RELEASE = "kuberay-operator"


def installing_topology(name: str) -> dict[str, Any]:
    """The small topology with the defaults a new cluster takes: the operator installed
    (its CRDs applied by uerl itself), the runs claim kept by a destroy (taken back by a
    provider of uerl's)."""
    return {
        **small_topology(name, 2),
        "operator": {"install": True, "chart_path": str(KUBERAY_CHART_DIR)},
        "runs": {"claim": {"keep_on_destroy": True}},
    }


@pytest.fixture(scope="module")
def installing_consumer(
    bare_control_plane: ControlPlane, package: Path, tmp_path_factory: pytest.TempPathFactory
) -> PulumiProject:
    settings = {"topology": installing_topology("uerl-op")}
    workdir = tmp_path_factory.mktemp("installing")
    return python_project(bare_control_plane, package, workdir, settings)


def test_a_program_that_installs_kuberay_without_its_kubeconfig_is_refused_in_one_line(
    installing_consumer: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    # Without the provider's kubeconfig, uerl's own steps would reach $KUBECONFIG's cluster.
    result = installing_consumer.run("preview", stack="dev", check=False)
    print(result.output)
    assert result.returncode != 0
    diagnostics = result.output.split("Diagnostics:", 1)[-1].splitlines()
    (first, *_) = [line.strip() for line in diagnostics if line.strip().startswith("error:")]
    assert first.startswith(
        "error: uerl:index:TrainingCluster resource 'rl' has a problem: kubeconfig: this "
        "TrainingCluster has a Kubernetes provider of its own"
    ), result.output
    assert "topology.operator.crds (install" in first
    # Pulumi's Python host prints the program's own traceback under it (the engine shut
    # the resource monitor down); none of it is uerl's code.
    assert "infra/components" not in result.output, result.output
    assert bare_control_plane.kubectl("get", "namespace", "uerl-op", check=False).returncode != 0


def test_a_program_installs_kuberay_through_the_kubeconfig_it_gives_rescales_and_destroys_it(
    installing_consumer: PulumiProject, bare_control_plane: ControlPlane
) -> None:
    """A Python program's training cluster: KubeRay installed through the kubeconfig the
    program gives (its CRDs applied by uerl), up with 2 workers, rescaled to 3 by the
    program's input, destroyed with only the kept claim and namespace left."""
    project, cp, name = installing_consumer, bare_control_plane, "uerl-op"
    settings_file = project.dir / "settings.json"
    settings = json.loads(settings_file.read_text())
    # The file's text as one line of JSON, as a cluster resource outputs it (EKS's): the
    # CLI's environment has no KUBECONFIG, so this is uerl's only way to the cluster.
    kubeconfig = json.dumps(yaml.safe_load(cp.kubeconfig.read_text()))
    settings["access"] = {"kubeconfig": kubeconfig}
    settings_file.write_text(json.dumps(settings))

    operator = chart_runs_operator(cp, name, OPERATOR_RELEASE)
    up_ready(project, cp, name, during=operator, what=", KubeRay installed")
    listed = cp.get_json("crd", "--show-managed-fields")["items"]
    crds = {c["metadata"]["name"]: c for c in listed}
    assert set(crds) >= KUBERAY_CRD_NAMES
    # Applied by uerl's CRDs resource (its field manager), through the kubeconfig given.
    for crd in KUBERAY_CRD_NAMES:
        managers = {m["manager"] for m in crds[crd]["metadata"]["managedFields"]}
        assert "uerl" in managers, (crd, managers)
    cp.kubectl("get", "deployment", "-n", name, OPERATOR_RELEASE)

    def rescale() -> None:
        settings["topology"]["workers"]["replicas"] = 3
        settings_file.write_text(json.dumps(settings))

    rescaled_to_three(project, cp, name, rescale, during=operator)

    result = project.run("destroy", "--yes", stack="dev", during=operator)
    print(f"pulumi destroy of {name}: {result.seconds:.1f}s")
    # Compute and KubeRay go (`crds: install`: the stack's own CRDs with them); the runs
    # claim and its namespace stay (`keep_on_destroy`).
    kept = {f"persistentvolumeclaim/{name}-runs", f"namespace/{name}"}
    cp.wait_until(lambda: set(stack_objects(cp, name)) == kept, guard(180), "only the kept")
    crds_left = {c["metadata"]["name"] for c in cp.get_json("crd")["items"]}
    assert not crds_left & KUBERAY_CRD_NAMES
    operator_left = cp.kubectl("get", "deployment", "-n", name, OPERATOR_RELEASE, check=False)
    assert operator_left.returncode != 0, operator_left.stdout
    assert project.resources("dev") == []
