"""The docs as a reader sees them: every page's Markdown rendered with the site's own
Markdown extensions (mkdocs.yml), the stylesheet's rules, the navigation and the paths a
reader is told to type. Fast: no site build (tests/test_docs.py builds it)."""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser

import markdown
import pytest
import yaml
from doc_blocks import PROJECT_ROOT, doc_files
from mkdocs.config import load_config
from mkdocs.utils.meta import get_data

DOCS = PROJECT_ROOT / "docs"
STYLESHEET = DOCS / "stylesheets" / "extra.css"
REPOSITORY = "https://github.com/uerl/uerl"
# A line of a paragraph that starts like a list item: a step or a bullet that Markdown did
# not take as one (a code block or a table inside an item, indented too little, ends the
# list, and what follows runs on as one paragraph).
LIST_MARKER = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+\S")


@pytest.fixture(scope="module")
def render():
    config = load_config(str(PROJECT_ROOT / "mkdocs.yml"))

    def to_html(text: str) -> str:
        md = markdown.Markdown(
            extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"]
        )
        return md.convert(get_data(text)[0])  # front matter off, as MkDocs does

    return to_html


class _ParagraphLines(HTMLParser):
    """Each paragraph's text lines, code left out."""

    def __init__(self) -> None:
        super().__init__()
        self.paragraphs: list[list[str]] = []
        self._text: list[str] | None = None
        self._code = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "p":
            self._text = []
        elif tag in ("code", "pre"):
            self._code += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("code", "pre"):
            self._code -= 1
        elif tag == "p" and self._text is not None:
            self.paragraphs.append("".join(self._text).splitlines())
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None and not self._code:
            self._text.append(data)


def list_items_run_on(html: str) -> list[str]:
    """The paragraph lines that begin like a list item: items a list lost."""
    parser = _ParagraphLines()
    parser.feed(html)
    return [line.strip() for p in parser.paragraphs for line in p if LIST_MARKER.match(line)]


def css_rules(css: str) -> list[tuple[str, str, dict[str, str]]]:
    """(media query or "", selector, declarations) of every rule of a stylesheet."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    found = []

    def walk(text: str, media: str) -> None:
        index = 0
        while (brace := text.find("{", index)) != -1:
            head = text[index:brace].strip()
            depth, end = 1, brace + 1
            while depth:
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                end += 1
            body = text[brace + 1 : end - 1]
            if head.startswith("@media"):
                walk(body, head)
            else:
                declarations = dict(
                    (name.strip(), value.strip())
                    for name, _, value in (d.partition(":") for d in body.split(";"))
                    if value.strip()
                )
                for selector in head.split(","):
                    found.append((media, " ".join(selector.split()), declarations))
            index = end

    walk(css, "")
    return found


def test_the_list_check_finds_steps_a_code_block_cut_off(render) -> None:
    broken = "1. Validate:\n\n   ```text\n   error\n   ```\n2. Install.\n3. Wait.\n"
    whole = "1. Validate:\n\n    ```text\n    error\n    ```\n\n2. Install.\n3. Wait.\n"
    assert list_items_run_on(render(broken)) == ["2. Install.", "3. Wait."]
    assert list_items_run_on(render(whole)) == []
    assert render(whole).count("<li>") == 3


def test_the_list_check_finds_bullets_a_table_cut_off(render) -> None:
    table = "| a | b |\n{0}|---|---|\n{0}| 1 | 2 |\n\n{0}What it shows.\n"
    broken = "- one:\n\n  " + table.format("  ") + "- two\n- three\n"
    whole = "- one:\n\n    " + table.format("    ") + "\n- two\n- three\n"
    assert list_items_run_on(render(broken)) == ["- two", "- three"]
    assert list_items_run_on(render(whole)) == []
    assert render(whole).count("<li>") == 3


def test_no_page_has_a_list_broken_by_a_code_block_or_a_table(render) -> None:
    broken = {
        str(path.relative_to(PROJECT_ROOT)): lines
        for path in doc_files()
        if (lines := list_items_run_on(render(path.read_text())))
    }
    assert broken == {}


def test_what_pulumi_up_does_is_one_numbered_list_of_six_steps(render) -> None:
    page = render((DOCS / "kubernetes.md").read_text())
    section = page.split('id="what-pulumi-up-does"', 1)[1]
    steps = section.split("<ol>", 1)[1].split("</ol>", 1)[0]
    assert steps.count("<li>") == 6
    assert "invalid topology" in steps  # the code block stays inside step 1


def test_code_in_table_cells_never_breaks_inside_a_word() -> None:
    # Material's `.md-typeset code { word-break: break-word }` cut `IfNotPresent` into
    # `IfNotPrese` / `nt` in narrow columns; a more specific rule must undo it.
    rules = {selector: d for media, selector, d in css_rules(STYLESHEET.read_text()) if not media}
    cell = rules.get(".md-typeset td code", {})
    assert cell.get("white-space") == "nowrap" or (
        cell.get("word-break") in ("keep-all", "normal") and cell.get("overflow-wrap") == "normal"
    ), cell


def test_code_blocks_wrap_long_lines_clear_of_the_copy_button() -> None:
    rules = {selector: d for media, selector, d in css_rules(STYLESHEET.read_text()) if not media}
    block = rules.get(".md-typeset pre > code", {})
    assert block.get("white-space") == "pre-wrap"
    assert block.get("padding-right", "0").endswith("em")


def test_a_table_without_a_header_shows_no_header_bar() -> None:
    hidden = [
        selector
        for media, selector, d in css_rules(STYLESHEET.read_text())
        if not media and "thead" in selector and ":empty" in selector and d.get("display") == "none"
    ]
    assert hidden != []


def test_the_topology_reference_stacks_its_columns_on_a_narrow_screen() -> None:
    narrow = {
        selector: d
        for media, selector, d in css_rules(STYLESHEET.read_text())
        if "max-width" in media
    }
    assert narrow[".md-typeset .topology-reference thead"]["display"] == "none"
    assert narrow[".md-typeset .topology-reference tr"].get("border")
    labelled = narrow[".md-typeset .topology-reference td:nth-child(2)::before"]
    assert labelled["content"] == '"type: "'


def test_the_topology_reference_has_a_heading_and_an_anchor_per_group() -> None:
    sys.path.insert(0, str(DOCS))
    try:
        from hooks import topology_sections
    finally:
        sys.path.remove(str(DOCS))
    page = topology_sections()
    groups = ["ray", "learners", "workers", "simulator", "executables", "operator", "security"]
    for group in groups:
        assert f"\n## `{group}` {{#{group}}}\n" in page, group
        assert f"](#{group})" in page, group
    simulator = page.split("{#simulator}", 1)[1].split("\n## ", 1)[0]
    assert "| `simulator.tls.secret` |" in simulator


def test_the_navigation_is_grouped_with_previous_and_next_links() -> None:
    config = yaml.load((PROJECT_ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert [next(iter(group)) for group in config["nav"]] == [
        "Get started", "Operate", "Reference", "Evidence",
    ]  # fmt: skip
    assert "navigation.footer" in config["theme"]["features"]
    listed = {page for group in config["nav"] for item in next(iter(group.values()))
              for page in item.values()}  # fmt: skip
    assert listed == {p.name for p in DOCS.glob("*.md")}


def test_no_page_tells_the_reader_to_use_a_path_outside_the_clone() -> None:
    outside = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}"
        for path in doc_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "../shared" in line
    ]
    assert outside == []


def test_the_home_page_and_quick_start_say_how_to_get_the_code() -> None:
    for path in (DOCS / "index.md", DOCS / "quick-start.md", PROJECT_ROOT / "README.md"):
        text = path.read_text()
        assert f"git clone {REPOSITORY} && cd uerl" in text, path.name
        assert f"]({REPOSITORY})" in text, path.name
    assert (
        yaml.load((PROJECT_ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["repo_url"]
        == REPOSITORY
    )


def test_history_and_test_reports_stay_on_the_evidence_page() -> None:
    history = ["earlier version of this page", "versions ago", "last version", "this version",
               "What is proven on real pods", "the run before it"]  # fmt: skip
    found = [
        f"{path.relative_to(PROJECT_ROOT)}: {phrase!r}"
        for path in doc_files()
        if path.name != "evidence.md"
        for phrase in history
        if phrase.lower() in path.read_text().lower()
    ]
    assert found == []
    assert (DOCS / "evidence.md").read_text().startswith("# Test evidence and history, as of ")
