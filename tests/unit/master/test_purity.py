"""Placement and rebalancing are pure functions over a snapshot (STYLE 8): no I/O imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pyspark_kudu.master as master_pkg

FORBIDDEN = {"subprocess", "socket", "threading", "os", "time", "pyspark", "fsspec", "pathlib"}
PURE = ["topology.py", "placement.py", "rebalancer.py"]


@pytest.mark.parametrize("name", PURE)
def test_module_imports_no_io_clock_or_spark(name: str) -> None:
    tree = ast.parse((Path(master_pkg.__file__).parent / name).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN
