"""MkDocs hook: the topology reference table, generated from `infra/topology.py`."""

from __future__ import annotations

from typing import Any

PLACEHOLDER = "<!-- topology-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if PLACEHOLDER not in markdown:
        return markdown
    from infra.topology_reference import markdown_table

    # A class for docs/stylesheets/extra.css: its field names never break inside a word.
    table = f'<div class="topology-reference" markdown>\n\n{markdown_table()}\n\n</div>'
    return markdown.replace(PLACEHOLDER, table)
