"""MkDocs hook: the topology reference table, generated from `infra/topology.py`."""

from __future__ import annotations

from typing import Any

PLACEHOLDER = "<!-- topology-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if PLACEHOLDER not in markdown:
        return markdown
    from infra.topology_reference import markdown_table

    return markdown.replace(PLACEHOLDER, markdown_table())
