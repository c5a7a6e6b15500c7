"""The docs: the site builds strictly, the topology reference lists every field, and every
shell command shown is run by a test or says why it cannot run here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from doc_blocks import PROJECT_ROOT, Block, all_blocks, commands_not_run
from proc_tree import Deadline

from infra.topology_reference import markdown_table, rows

README_MAX_LINES = 150
# Words a synopsis stands for: HOST:PORT, FILE, N ...
PLACEHOLDER = re.compile(r"^(HOST|PORT|FILE|DIR|HEAD|N|S|K|R|ID)(:|$)")


@dataclass
class Site:
    directory: Path
    build: subprocess.CompletedProcess[str]

    def page(self, name: str) -> str:
        return (self.directory / name / "index.html").read_text()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, module_deadline: Deadline) -> Site:
    directory = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(directory)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=module_deadline.left(),
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return Site(directory, done)


def test_the_site_builds_in_strict_mode(site: Site) -> None:
    assert site.build.returncode == 0, site.build.stdout + site.build.stderr
    topology = site.page("topology")
    assert "workers.replicas" in topology and "<!-- topology-reference -->" not in topology


def test_no_page_shows_an_escaped_pipe(site: Site) -> None:
    # A `\|` written to keep a table cell whole shows its backslash inside code.
    shown = [
        str(page.relative_to(site.directory))
        for page in sorted(site.directory.rglob("*.html"))
        if "\\|" in page.read_text()
    ]
    assert shown == []
    assert "<code>'sidecar' | 'networked'</code>" in site.page("topology")


def test_the_home_page_draws_its_diagram_with_the_sites_own_mermaid(site: Site) -> None:
    home = (site.directory / "index.html").read_text()
    assert '<pre class="mermaid"><code>flowchart ' in home
    # Material fetches mermaid.js from a CDN unless the page has it: the site ships it.
    assert '<script src="javascripts/mermaid.min.js"></script>' in home
    assert (site.directory / "javascripts" / "mermaid.min.js").stat().st_size > 1_000_000


def test_the_topology_reference_has_a_row_with_a_meaning_for_every_field() -> None:
    table = markdown_table()
    paths = [row.path for row in rows()]
    assert {"workers.replicas", "simulator.tls.mutual", "learners.tolerations[].key"} <= set(paths)
    assert all(f"| `{path}`" in table for path in paths)
    assert [row.path for row in rows() if not row.comment] == []


def test_the_reference_gives_each_field_as_the_component_spells_it_where_that_differs() -> None:
    # `uerl:topology` and Python say node_selector; YAML and TypeScript, nodeSelector.
    table = markdown_table()
    assert "| `workers.node_selector`<br>`workers.nodeSelector` |" in table
    assert "| `workers.replicas` |" in table  # one word: spelled alike
    by_path = {row.path: row for row in rows()}
    assert by_path["learners.tolerations[].key"].component_path == "learners.tolerations[].key"
    assert by_path["runs.claim.keep_on_destroy"].component_path == "runs.claim.keepOnDestroy"


def test_the_reference_shows_the_codes_defaults_and_constraints() -> None:
    by_path = {row.path: row for row in rows()}
    assert by_path["workers.replicas"].default == "2"
    assert by_path["workers.replicas"].constraint == ">= 0, <= 1000"
    assert by_path["pattern"].type == "'sidecar' | 'networked'"


def test_every_fenced_block_names_its_language() -> None:
    unnamed = [block.where for block in all_blocks() if not block.language]
    assert unnamed == []


def test_every_shell_block_is_run_by_a_test_or_says_why_not() -> None:
    unmarked = [block.where for block in all_blocks() if block.language in ("sh", "bash")
                and block.marker is None]  # fmt: skip
    assert unmarked == [], "sh blocks with neither run-by nor not-run: " + ", ".join(unmarked)


def test_commands_marked_run_by_are_in_the_files_that_run_them() -> None:
    problems = []
    for block in all_blocks():
        if block.marker != "run-by":
            continue
        for name in block.argument.split():
            if not (PROJECT_ROOT / name).exists():
                problems.append(f"{block.where}: {name} does not exist")
        for command, parts in commands_not_run(block).items():
            problems.append(
                f"{block.where}: {command!r}: {', '.join(parts)} not run by {block.argument}"
            )
    assert problems == [], "\n".join(problems)


def _shown(command: str, runner: Path) -> dict[str, list[str]]:
    return commands_not_run(Block(runner, 1, "sh", command, "run-by", str(runner)))


def test_a_shown_flags_value_is_the_one_the_test_passes_after_that_flag(tmp_path: Path) -> None:
    runner = tmp_path / "test_x.py"
    runner.write_text(
        'ITERATIONS = 30\nrun("local", "--iterations", str(ITERATIONS), "--seed", "3")\n'
    )
    # "3" is in the file, but as --seed's value: the run is 30 iterations.
    assert _shown("uerl local --iterations 3", runner) == {
        "uerl local --iterations 3": ["--iterations 3"]
    }
    assert _shown("uerl local --iterations 30 --seed=3", runner) == {}


def test_a_shown_word_must_be_a_whole_word_the_test_passes(tmp_path: Path) -> None:
    runner = tmp_path / "test_x.py"
    runner.write_text('run("local-eval", "--policies", configuration)\nPOLICIES = ["shared"]\n')
    assert _shown("uerl local --policies shared", runner) == {
        "uerl local --policies shared": ["local"]
    }


def test_not_run_blocks_give_a_reason() -> None:
    bare = [b.where for b in all_blocks() if b.marker == "not-run" and len(b.argument) < 10]
    assert bare == []


def test_the_readme_first_screen_is_short() -> None:
    lines = (PROJECT_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def test_commands_marked_run_by_hold_no_placeholder() -> None:
    # A command a test runs is a whole command, not a synopsis to fill in.
    placeholders = [
        f"{block.where}: {' '.join(command)}"
        for block in all_blocks()
        if block.marker == "run-by"
        for command in block.commands()
        if any(w == "..." or w.startswith(("<", "[")) or PLACEHOLDER.match(w) for w in command)
    ]
    assert placeholders == []
