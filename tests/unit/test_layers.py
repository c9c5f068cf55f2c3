"""The house (DESIGN §2): the Spark side split by role, dependencies pointing one way.

- ``spark/host`` (what runs on an executor host) imports nothing of the driver side;
- ``spark/replication`` (the driver's replication machinery) never imports what users call
  (``spark/api``) or healing;
- ``spark/healing`` never imports ``spark/api``;
- nothing in the library imports the test-cluster launcher (``pyspark_kudu.testing``)
  except the tools that run clusters;
- the consensus invariants (``consensus/sim_checks``) never import the simulator that feeds
  them (``consensus/sim``) or the seeded runs that drive it (``consensus/sim_run``);
- no module of ``pyspark_kudu.spark`` or ``pyspark_kudu.consensus`` is part of an import
  cycle (type-checking-only imports included: they are cycles for a reader too).

Imports are read from the source (every ``import`` statement, wherever it appears).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "pyspark_kudu"


def _graph() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


GRAPH = _graph()


def _violations(src: str, forbidden: tuple[str, ...]) -> list[tuple[str, str]]:
    return sorted((m, d) for m, ds in GRAPH.items() if m.startswith(src)
                  for d in ds if d.startswith(forbidden))


@pytest.mark.parametrize("src, forbidden", [
    ("pyspark_kudu.spark.host", ("pyspark_kudu.spark.api", "pyspark_kudu.spark.replication",
                                 "pyspark_kudu.spark.healing", "pyspark_kudu.testing")),
    ("pyspark_kudu.spark.replication", ("pyspark_kudu.spark.api",
                                        "pyspark_kudu.spark.healing", "pyspark_kudu.testing")),
    ("pyspark_kudu.spark.healing", ("pyspark_kudu.spark.api", "pyspark_kudu.testing")),
    ("pyspark_kudu.spark.api", ("pyspark_kudu.testing",)),
    ("pyspark_kudu.master", ("pyspark_kudu.spark", "pyspark_kudu.testing")),
    ("pyspark_kudu.consensus.sim_checks", ("pyspark_kudu.consensus.sim",)),  # sim, sim_run
])
def test_dependencies_point_one_way(src: str, forbidden: tuple[str, ...]) -> None:
    assert _violations(src, forbidden) == []


CYCLE_FREE = ("pyspark_kudu.spark", "pyspark_kudu.consensus")


@pytest.mark.parametrize("package", CYCLE_FREE)
def test_no_module_of_the_package_is_in_an_import_cycle(package: str) -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert [c for c in cycles if any(m.startswith(package) for m in c)] == []


def test_the_graph_is_read_from_the_source() -> None:
    """Guards the two tests above against an empty or wrong graph."""
    assert "pyspark_kudu.spark.host.handlers" in GRAPH["pyspark_kudu.spark.host.round_tasks"]
    assert "pyspark_kudu.spark.api.reads" in GRAPH["pyspark_kudu.spark.api.context"]
    assert {"pyspark_kudu.consensus.sim", "pyspark_kudu.consensus.sim_checks"} <= GRAPH[
        "pyspark_kudu.consensus.sim_run"]
    assert "pyspark_kudu.consensus.sim_checks" in GRAPH["pyspark_kudu.consensus.sim"]
