"""The docs: the site builds strictly, the topology reference lists every field, and every
shell command shown is run by a test or says why it cannot run here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from doc_blocks import PROJECT_ROOT, all_blocks, missing_words

from infra.topology_reference import markdown_table, rows

README_MAX_LINES = 150
# Words a synopsis stands for: HOST:PORT, FILE, N ...
PLACEHOLDER = re.compile(r"^(HOST|PORT|FILE|DIR|HEAD|N|S|K|R|ID)(:|$)")


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    topology = (tmp_path / "topology" / "index.html").read_text()
    assert "workers.replicas" in topology and "<!-- topology-reference -->" not in topology


def test_the_topology_reference_has_a_row_with_a_meaning_for_every_field() -> None:
    table = markdown_table()
    paths = [row.path for row in rows()]
    assert {"workers.replicas", "simulator.tls.mutual", "learners.tolerations[].key"} <= set(paths)
    assert all(f"| `{path}` |" in table for path in paths)
    assert [row.path for row in rows() if not row.comment] == []


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
        for command, words in missing_words(block).items():
            problems.append(
                f"{block.where}: {command!r}: {', '.join(words)} not in {block.argument}"
            )
    assert problems == [], "\n".join(problems)


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
