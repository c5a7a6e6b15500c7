"""MkDocs hook: the topology reference, generated from `infra/topology/`.

`infra.topology_reference.markdown_table()` is one table of every field; the page splits it
into one section per group of fields (`ray`, `learners`, `workers`, `simulator`, ...), each
under its own heading, so each has an anchor (`topology/#simulator`) and a line of links
at the top reaches it.
"""

from __future__ import annotations

from typing import Any

PLACEHOLDER = "<!-- topology-reference -->"
# The fields at the top of the spec that are not a group of their own.
STACK_WIDE = "stack-wide"


def _group(path: str) -> str:
    head = path.split(".")[0].split("[")[0]
    return head if "." in path or "[" in path else ""


def topology_sections() -> str:
    """The reference as Markdown: a line of links, then a heading and a table per group."""
    from infra.topology_reference import markdown_table, rows

    header, *lines = markdown_table().splitlines()
    rule, *lines = lines
    fields = rows()
    assert len(fields) == len(lines), "one table line per field"
    groups = {row.path: row for row in fields if "." not in row.path}
    is_group = {path for path in groups if any(_group(r.path) == path for r in fields)}

    sections: dict[str, list[str]] = {STACK_WIDE: []}
    for row, line in zip(fields, lines, strict=True):
        if row.path in is_group:
            sections[row.path] = []  # the group's own row becomes its heading and intro
        else:
            sections[_group(row.path) or STACK_WIDE].append(line)

    links = " · ".join(
        f"[{name}](#{name})" if name == STACK_WIDE else f"[`{name}`](#{name})" for name in sections
    )
    out = [f"Groups: {links}", ""]
    for name, table in sections.items():
        if name == STACK_WIDE:
            out += [
                f"## Stack-wide fields {{#{STACK_WIDE}}}",
                "",
                "The fields at the top of `topology`, outside any group.",
            ]
        else:
            out += [f"## `{name}` {{#{name}}}", "", groups[name].comment]
        # A class for docs/stylesheets/extra.css: stacked columns on a narrow screen.
        out += ["", '<div class="topology-reference" markdown>', "", header, rule, *table]
        out += ["", "</div>", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, topology_sections())
