"""The shell commands the docs show, with the marker each block carries.

Every fenced block in README.md and docs/*.md declares a language. An `sh` block is
preceded by an HTML comment (the site does not show it):
  <!-- run-by: FILE [FILE ...] -->   the files (tests, `.ci/run`) that run its commands;
  <!-- not-run: REASON -->           why it cannot run here (a real cloud cluster, Docker).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!--\s*(run-by|not-run):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# Shell words that separate commands, and words a command's check skips.
OPERATORS = {"&&", "||", "|", ";", "&"}
# The program itself: tests run `uerl X` as `python -m training.cli X`, often through a
# helper (`run_local`); what is checked are its subcommand and options.
PROGRAMS = {"uerl"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    text: str
    marker: str | None  # run-by / not-run
    argument: str  # the files, or the reason

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(PROJECT_ROOT)}:{self.line}"

    def commands(self) -> list[list[str]]:
        """Each command of the block as its words (continuations joined, comments and
        shell operators dropped)."""
        joined = self.text.replace("\\\n", " ")
        out: list[list[str]] = []
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            current: list[str] = []
            for word in words:
                if word in OPERATORS:
                    if current:
                        out.append(current)
                    current = []
                else:
                    current.append(word)
            if current:
                out.append(current)
        return out


def doc_files() -> list[Path]:
    return [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, language = opening.groups()
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        above = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.match(above.strip())
        body = "\n".join(line[len(indent) :] for line in lines[index + 1 : end])
        found.append(
            Block(
                path,
                index + 1,
                language,
                body,
                marker.group(1) if marker else None,
                marker.group(2) if marker else "",
            )
        )
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]


def checked_words(command: list[str]) -> list[str]:
    """The words of a command a file that runs it must hold: paths (a run directory, a
    checkpoint, a file the reader picks) and placeholders are the reader's own."""
    words: list[str] = []
    for word in command:
        for part in re.split(r"[=\s]", word):
            if not part or ("/" in part and not part.startswith("uerl/")):
                continue
            if part.startswith("<") or part in ("...", ".venv/bin/uerl"):
                continue
            if part not in PROGRAMS:
                words.append(part)
    return words


def missing_words(block: Block) -> dict[str, list[str]]:
    """Command -> the words none of its run-by files holds."""
    sources = []
    for name in block.argument.split():
        path = PROJECT_ROOT / name
        sources.append(path.read_text() if path.exists() else "")
    text = "\n".join(sources)
    problems: dict[str, list[str]] = {}
    for command in block.commands():
        absent = [word for word in checked_words(command) if word not in text]
        if absent:
            problems[" ".join(command)] = absent
    return problems
