"""Build ``quickstart.ipynb`` from ``quickstart.py`` so the two notebooks never drift.

    python notebooks/build_ipynb.py           # rewrite quickstart.ipynb
    python notebooks/build_ipynb.py --check   # exit 1 if quickstart.ipynb is stale

``quickstart.py`` is the source of truth, in Databricks source format: its first line is
``# Databricks notebook source``, cells are separated by ``# COMMAND ----------`` lines, and a
cell whose first line is ``# MAGIC %md`` is markdown (every line ``# MAGIC``-prefixed). The
``.ipynb`` gets no outputs and cell ids from the cell positions, so building is deterministic
and the test suite can compare the committed file with what this script produces.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "quickstart.py"
TARGET = HERE / "quickstart.ipynb"
HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"
MAGIC = "# MAGIC"


def parse_cells(source: str) -> list[tuple[str, str]]:
    """``(kind, text)`` per cell, kind ``markdown`` or ``code``.

    Raises:
        ValueError: not a Databricks notebook source, or a markdown cell with a line
            lacking the ``# MAGIC`` prefix.
    """
    lines = source.splitlines()
    if not lines or lines[0].strip() != HEADER:
        raise ValueError(f"not a Databricks notebook source: the first line must be {HEADER!r}")
    chunks: list[list[str]] = [[]]
    for line in lines[1:]:
        if line.strip() == SEPARATOR:
            chunks.append([])
        else:
            chunks[-1].append(line)
    cells = []
    for chunk in chunks:
        text = "\n".join(chunk).strip("\n")
        if not text:
            continue
        body = text.splitlines()
        if body[0].strip() == f"{MAGIC} %md":
            bad = [ln for ln in body if not ln.startswith(MAGIC)]
            if bad:
                raise ValueError(f"markdown cell line without the {MAGIC!r} prefix: {bad[0]!r}")
            text = "\n".join(ln[len(MAGIC):].removeprefix(" ") for ln in body[1:])
            cells.append(("markdown", text))
        else:
            cells.append(("code", text))
    return cells


def build(source: str) -> nbformat.NotebookNode:
    """The notebook of ``source``: its cells, no outputs, a python3 kernelspec."""
    nb: nbformat.NotebookNode = nbformat.v4.new_notebook(metadata={
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                       "name": "python3"},
        "language_info": {"name": "python"},
    })
    for i, (kind, text) in enumerate(parse_cells(source)):
        new = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(new(text, id=f"cell-{i:02d}"))
    nbformat.validate(nb)
    return nb


def render(source: str) -> str:
    """The ``.ipynb`` text of ``source``, exactly as :func:`main` writes it."""
    text: str = nbformat.writes(build(source))
    return text if text.endswith("\n") else text + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {TARGET.name} differs from what would be built")
    args = parser.parse_args(argv)
    text = render(SOURCE.read_text(encoding="utf-8"))
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
