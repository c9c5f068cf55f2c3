"""Output of the tools: Kudu's text tables and JSON.

The text layout is the ``kudu`` tool's ``DataTable``: centred headers, a ``-``/``+`` rule,
left-aligned cells, `` | `` between columns. JSON is a list of objects keyed by column
name (compact, or indented for ``json_pretty``), as ``kudu ... --format=json``.

Thread-safety: pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyspark_kudu.errors import InvalidArgumentError

__all__ = ["FORMATS", "check_format", "render_json", "render_table"]

FORMATS = ("text", "json", "json_pretty")


def check_format(fmt: str) -> None:
    """Raises InvalidArgumentError for an unknown ``--format`` value."""
    if fmt not in FORMATS:
        raise InvalidArgumentError(
            f"unknown format (--format): {fmt}; use one of {', '.join(FORMATS)}"
        )


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table as the ``kudu`` tool prints it (no trailing newline)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [
        max([len(h), *(len(r[k]) for r in cells)]) for k, h in enumerate(headers)
    ]
    last = len(headers) - 1
    head = []
    for k, h in enumerate(headers):
        pad = widths[k] - len(h)
        tail = "" if k == last else " " * ((pad + 1) // 2) + " |"
        head.append(" " * (pad // 2) + " " + h + tail)
    lines = ["".join(head), "+".join("-" * (w + 2) for w in widths)]
    for r in cells:
        lines.append(
            "".join(
                " " + v + ("" if k == last else " " * (widths[k] - len(v)) + " |")
                for k, v in enumerate(r)
            )
        )
    return "\n".join(lines)


def render_json(data: Any, fmt: str = "json") -> str:
    """``data`` as JSON; ``json_pretty`` indents it."""
    if fmt == "json_pretty":
        return json.dumps(data, indent=2, sort_keys=False)
    return json.dumps(data, separators=(",", ":"))
