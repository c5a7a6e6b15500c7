"""The shell commands the docs show, with the marker each block carries.

Every fenced block in README.md and docs/*.md declares a language. An `sh` block is
preceded by an HTML comment (the site does not show it):
  <!-- run-by: FILE [FILE ...] -->   the files (tests, `.ci/run`) that run its commands;
  <!-- not-run: REASON -->           why it cannot run here (a real cloud cluster, Docker).
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!--\s*(run-by|not-run):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# Shell words that separate commands, and words a command's check skips.
OPERATORS = {"&&", "||", "|", ";", "&"}
REDIRECTIONS = {">", ">>", "2>", "2>&1"}
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
                if word in REDIRECTIONS:
                    break  # `> endpoints.json`: where the output goes, not the command
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


# -- what the run-by files actually run ---------------------------------------------

# A word the checker cannot know (an expression, an f-string's value): it breaks adjacency.
UNKNOWN = "\0"


@dataclass(frozen=True)
class RunWords:
    """The argument words the run-by files pass, as sequences: a Python list, tuple or
    call's arguments (module constants, `str(NAME)` and `*NAME[:n]` resolved), a string
    holding a whole command, or a line of a shell file."""

    sequences: tuple[tuple[str, ...], ...]

    @property
    def words(self) -> set[str]:
        return {w for seq in self.sequences for w in seq}

    def follows(self, first: str, second: str) -> bool:
        """Whether some sequence passes `second` right after `first`."""
        return second in self.values_after(first)

    def values_after(self, first: str) -> set[str]:
        """Every word some sequence passes right after `first`."""
        return {
            seq[i + 1] for seq in self.sequences for i in range(len(seq) - 1) if seq[i] == first
        }


def run_words(paths: list[Path]) -> RunWords:
    sequences: list[tuple[str, ...]] = []
    for path in _with_helpers(paths):
        text = path.read_text()
        found = _python_sequences(text) if path.suffix == ".py" else _shell_sequences(text)
        sequences += [tuple(seq) for seq in found if seq]
    return RunWords(tuple(sequences))


def _with_helpers(paths: list[Path]) -> list[Path]:
    """The files, and the helper that runs `uerl local` for the tests that use it (it adds
    the subcommand and the run directory)."""
    found = [path for path in paths if path.is_file()]
    helper = PROJECT_ROOT / "tests" / "local_runs.py"
    if helper not in found and any("from local_runs import" in p.read_text() for p in found):
        found.append(helper)
    return found


def _shell_sequences(text: str) -> list[list[str]]:
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            out.append(shlex.split(line, comments=True))
        except ValueError:
            out.append(line.split())
    return out


def _python_sequences(text: str) -> list[list[str]]:
    tree = ast.parse(text)
    # Names bound once in the file, by an assignment: their value is known anywhere.
    bound: dict[str, list[ast.expr | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.arg):  # a parameter: its value is the caller's
            bound.setdefault(node.arg, []).append(None)
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            bound.setdefault(node.target.id, []).append(None)
    constants = {
        name: values[0] for name, values in bound.items() if len(values) == 1 and values[0]
    }
    out: list[list[str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
        elif isinstance(node, ast.Call):
            items = node.args
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value.split())  # a whole command in one string
            continue
        else:
            continue
        out.append([w for item in items for w in _words(item, constants, depth=0)])
    return out


def _words(node: ast.expr, constants: dict[str, ast.expr], *, depth: int) -> list[str]:
    if depth > 5:
        return [UNKNOWN]
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
        return [str(node.value)]
    if isinstance(node, ast.Name) and node.id in constants:
        return _words(constants[node.id], constants, depth=depth + 1)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [w for item in node.elts for w in _words(item, constants, depth=depth + 1)]
    if isinstance(node, ast.JoinedStr):  # f"ARGS={args}"
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                inner = _words(value.value, constants, depth=depth + 1)
                if len(inner) != 1 or inner[0] == UNKNOWN:
                    return [UNKNOWN]
                parts.append(inner[0])
            else:
                parts += _words(value, constants, depth=depth + 1)
        return ["".join(parts)]
    if isinstance(node, ast.Starred):
        return _words(node.value, constants, depth=depth + 1)
    if (  # str(ITERATIONS)
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "str"
        and len(node.args) == 1
    ):
        return _words(node.args[0], constants, depth=depth + 1)
    if (  # RELAY[:2]
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Slice)
        and node.slice.step is None
    ):
        whole = _words(node.value, constants, depth=depth + 1)
        bounds = [node.slice.lower, node.slice.upper]
        if all(b is None or (isinstance(b, ast.Constant) and isinstance(b.value, int))
               for b in bounds):  # fmt: skip
            low, high = (b.value if isinstance(b, ast.Constant) else None for b in bounds)
            return whole[low:high]
    return [UNKNOWN]


def _readers_own(word: str) -> bool:
    """A path (a run directory, a checkpoint, a file the reader picks) or a placeholder."""
    return (
        ("/" in word and not word.startswith("uerl/"))
        or word.startswith("<")
        or (word in ("...", ".venv/bin/uerl"))
    )


def not_run(command: list[str], run: RunWords) -> list[str]:
    """The parts of a shown command the run-by files do not run: a subcommand or argument
    no file passes as a whole word, a flag no file passes, or a flag's value no file
    passes right after that flag (or as `--flag=value`; or a value the file computes
    there, when the file holds the shown value as a whole word)."""
    words = [w for w in command if w not in PROGRAMS]
    known = run.words
    absent: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("--"):
            if not (_readers_own(word) or word in known or _assignment_run(word, run)):
                absent.append(word)
            continue
        flag, equals, value = word.partition("=")
        if not equals and index < len(words) and not words[index].startswith("-"):
            value = words[index]
            index += 1
        given_as_one = any(w.startswith(f"{flag}=") for w in known)
        if not value or _readers_own(value):
            if flag not in known and not given_as_one:
                absent.append(flag)
        elif not (
            run.follows(flag, value)
            or f"{flag}={value}" in known
            # a word the test computes (a parameter, a loop variable) and holds as a whole
            # word; never a number, which must be passed as shown
            or (UNKNOWN in run.values_after(flag) and value in known and not _number(value))
        ):
            absent.append(f"{flag} {value}")
    return absent


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _assignment_run(word: str, run: RunWords) -> bool:
    """`ARGS="--iterations 3"` (make's variables): the name is passed, and the value's
    words as a command of their own."""
    name, equals, value = word.partition("=")
    if not equals or not any(w.startswith(f"{name}=") for w in run.words):
        return False
    return not not_run(shlex.split(value), run)


def commands_not_run(block: Block) -> dict[str, list[str]]:
    """Command -> what of it none of its run-by files runs."""
    run = run_words([PROJECT_ROOT / name for name in block.argument.split()])
    problems: dict[str, list[str]] = {}
    for command in block.commands():
        absent = not_run(command, run)
        if absent:
            problems[" ".join(command)] = absent
    return problems
