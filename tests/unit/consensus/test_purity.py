"""STYLE habit 1: ``consensus/`` is sans-IO. No socket, thread, clock, file or Spark code.

Parsed with ``ast`` (nothing is imported), so a forbidden import anywhere in a module, even
inside a function, fails the test; so does calling the builtin ``open``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pyspark_kudu.consensus

CONSENSUS = Path(pyspark_kudu.consensus.__file__).parent
MODULES = sorted(CONSENSUS.glob("*.py"))

FORBIDDEN = {
    "socket", "socketserver", "ssl", "select", "selectors", "asyncio", "http", "urllib",
    "threading", "_thread", "multiprocessing", "concurrent", "queue", "signal", "subprocess",
    "time", "datetime", "sched",
    "os", "io", "pathlib", "shutil", "tempfile", "glob", "fcntl", "mmap", "sqlite3",
    "pyspark", "py4j", "fsspec", "pyarrow",
    "pyspark_kudu.fileio", "pyspark_kudu.wal", "pyspark_kudu.spark", "pyspark_kudu.tablet",
    "pyspark_kudu.master",
}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_the_consensus_package_has_modules_to_check() -> None:
    names = {p.name for p in MODULES}
    assert {"raft.py", "messages.py", "raft_storage.py", "sim.py", "sim_checks.py",
            "sim_run.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_imports_no_io_thread_clock_or_spark_code(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = sorted(n for n in _imports(tree) if _forbidden(n))
    assert bad == [], f"{path.name} imports {bad}; consensus/ must stay sans-IO (STYLE habit 1)"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_opens_no_files(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    calls = [
        n.lineno for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"
    ]
    assert calls == [], f"{path.name} calls open() at lines {calls}"


def test_the_checker_catches_a_forbidden_import() -> None:
    tree = ast.parse("import os.path\nfrom time import monotonic\nimport random\n")
    assert sorted(n for n in _imports(tree) if _forbidden(n)) == ["os.path", "time"]
