"""A clone needs nothing beside it: what the README's commands run reads no `../shared`.

The project's developers have a `shared/` directory beside the work tree; a user's clone
does not. The third-party data the tests and builds read is in `third_party/` instead. The
one exception is tests/k8s/build/build.sh's fallback for the two Go sources the module
proxy refuses (the Pulumi language host and Kubernetes provider), in `patched_source`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIRD_PARTY = ROOT / "third_party"
BUILD_SH = ROOT / "tests" / "k8s" / "build" / "build.sh"

# What `make setup/local/test/images/docs/e2e/render` and `pulumi up` run or read.
# Markdown is left out: it is read by people, not run (docs/ has its own checks).
SCANNED = (
    "infra",
    "training",
    "protos",
    "native",
    "tests",
    "docker",
    "Makefile",
    "pyproject.toml",
    "mkdocs.yml",
    "Pulumi.yaml",
    "Pulumi.dev.yaml",
)

# Each way the sibling directory has been named from here: relative, absolute, joined to
# the repository's parent (pathlib or shell), and the variable that overrode it. Not the
# word itself (the `shared` policy configuration) nor a container's own `/shared` mount.
SIBLING = re.compile(
    r"(?:\.\./)+shared\b"
    r"|(?:/[\w.-]+|\$\{?\w+\}?|\))/shared\b"
    r"""|/\s*["']shared["'/]"""
    r"|\bUERL_SHARED_DIR\b"
)
SHARED_VAR = re.compile(r"\$\{?SHARED\b")
# `"../shared" in text`: a check looking for the name (the docs tests), not a path.
SEARCH_FOR_IT = re.compile(r"""(["'])\.\./shared\1\s+(?:not\s+)?in\b""")


def _names_sibling(line: str) -> bool:
    return bool(SIBLING.search(SEARCH_FOR_IT.sub("", line)))


def _run_files() -> list[Path]:
    """Tracked files under SCANNED, and new ones not ignored (a change before its commit)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SCANNED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    files = [ROOT / name for name in listed if name and not name.endswith(".md")]
    # This file names the forms it looks for.
    return [f for f in files if f.is_file() and f != Path(__file__).resolve()]


def _patched_source(text: str) -> str:
    (body,) = re.findall(r"^patched_source\(\) \{.*?^\}$", text, re.MULTILINE | re.DOTALL)
    return body


def _without_build_sh_fallback(text: str) -> str:
    """build.sh less its fallback: the one `SHARED=` line, the body of `patched_source`
    and the comments naming ../shared/third_party (the next test pins what that body reads)."""
    text = re.sub(r"^SHARED=.*$", "", text, count=1, flags=re.MULTILINE)
    body = _patched_source(text)
    text = text.replace(body, "\n" * body.count("\n"))  # the line numbers stay
    return re.sub(r"^\s*#.*\.\./shared/third_party.*$", "", text, flags=re.MULTILINE)


def test_nothing_the_readme_commands_run_names_the_sibling_shared_directory() -> None:
    found = []
    for path in _run_files():
        text = path.read_text(errors="replace")
        if path == BUILD_SH:
            text = _without_build_sh_fallback(text)
        for number, line in enumerate(text.splitlines(), 1):
            if _names_sibling(line) or (path == BUILD_SH and SHARED_VAR.search(line)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "read third_party/ instead (third_party/README.md):\n" + "\n".join(found)


def test_build_sh_reads_the_sibling_only_for_the_go_sources_the_proxy_refuses() -> None:
    text = BUILD_SH.read_text()
    (definition,) = re.findall(r"^SHARED=.*$", text, re.MULTILINE)
    assert "UERL_SHARED_DIR" in definition
    body = _patched_source(text)
    uses = [line.strip() for line in body.splitlines() if SHARED_VAR.search(line)]
    assert uses and all("$SHARED/third_party/" in line for line in uses), uses
    # Called for those two sources and nothing else.
    calls = re.findall(r"^\s*patched_source (\S+)", text, re.MULTILINE)
    assert calls == [
        '"pulumi-language-python-$PULUMI_VERSION"',
        '"pulumi-kubernetes-provider-$PULUMI_KUBERNETES_VERSION/provider"',
    ]


@pytest.mark.parametrize(
    "line",
    [
        'SHARED_SCHEMAS = PROJECT_ROOT.parent / "shared" / "schemas"',
        'CHART = ROOT.parent / "shared" / "charts" / "kuberay-operator-1.7.0"',
        'str((PROJECT_ROOT.parent / "shared/charts/kuberay-operator-1.7.0").resolve())',
        '"topology.operator.chart_path=../shared/charts/kuberay-operator-1.7.0"',
        'SHARED=${UERL_SHARED_DIR:-$(cd "$HERE/../../../.." && pwd)/shared}',
        'schema = Path("/work/shared/schemas/pulumi-v3.259.0/project.json")',
        'kubectl apply -f "$REPO/../shared/charts/x/crds"',
        'stages="${WORK}/shared/kwok-stages-v0.8.0"',
    ],
)
def test_the_check_recognises_each_way_of_naming_the_sibling(line: str) -> None:
    assert _names_sibling(line)


@pytest.mark.parametrize(
    "line",
    [
        'return {aid: SHARED_POLICY_ID for aid in sorted(agents)}  # "shared"',
        'game = two_carts().with_policies("shared")',
        'shared = {"name": "shared", "mountPath": "/shared"}',
        '["sh", "-c", "cat /shared/sidecar-up && exec sleep 3600"]',
        "`shared_health.py` (every runner's game state in Ray's GCS store)",
        "github.com/aws/aws-sdk-go-v2/service/internal/s3shared v1.19.32",
        'if "../shared" in line',
    ],
)
def test_the_check_leaves_other_uses_of_the_word_alone(line: str) -> None:
    assert not _names_sibling(line)


def test_each_third_party_item_carries_its_licence_and_provenance() -> None:
    items = sorted(p for p in THIRD_PARTY.iterdir() if p.is_dir())
    readme = (THIRD_PARTY / "README.md").read_text()
    assert items
    for item in items:
        assert (item / "PROVENANCE.md").is_file(), item
        assert any(item.rglob("LICENSE")), f"{item}: no upstream LICENSE"
        assert f"`{item.name}/" in readme, f"{item.name} is not listed in third_party/README.md"
