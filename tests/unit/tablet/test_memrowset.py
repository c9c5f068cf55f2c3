"""The MemRowSet's key index: the newest position of every key, through many appends."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import keys as keys_module
from pyspark_kudu.tablet.compaction import prepare_versions
from pyspark_kudu.tablet.keys import key_probe
from pyspark_kudu.tablet.memrowset import MemRowSet

HASHED = Schema((ColumnSchema("r", "string", nullable=False),
                 ColumnSchema("n", "int64", nullable=False), ColumnSchema("v", "int64")),
                ("r", "n"))
EXACT = Schema((ColumnSchema("n", "int64", nullable=False), ColumnSchema("v", "int64")),
               ("n",))


def _rows(schema: Schema, ns: list[int], v: int) -> pa.RecordBatch:
    cols = {"r": [f"r{n % 7}" for n in ns], "n": ns, "v": [v] * len(ns)}
    return pa.RecordBatch.from_pydict({c.name: cols[c.name] for c in schema.columns},
                                      schema=schema.arrow_schema)


@pytest.mark.parametrize("schema", [HASHED, EXACT], ids=["hashed", "exact"])
@pytest.mark.parametrize("collide", [False, True], ids=["real-hash", "4-valued-hash"])
def test_lookup_finds_the_newest_version_after_many_appends(
        schema: Schema, collide: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if collide:
        real = keys_module.key_hash
        monkeypatch.setattr(keys_module, "key_hash",
                            lambda d, s, seed=0: real(d, s, seed) % np.uint64(4))
    rng = np.random.default_rng(7)
    mrs = MemRowSet(schema)
    newest: dict[int, int] = {}
    for step in range(300):  # batches of 1..40 distinct keys out of 500: many merges
        ns = sorted(set(rng.integers(0, 500, size=int(rng.integers(1, 40))).tolist()))
        batch = _rows(schema, ns, step)
        start = len(mrs)
        mrs.append(batch, key_probe(batch, schema), step)
        newest.update({n: start + k for k, n in enumerate(ns)})
    assert len(mrs._runs.runs) <= 2 * int(np.log2(len(mrs))) + 2  # O(log n) runs
    query = _rows(schema, list(range(-50, 550)), 0)
    got = mrs.lookup(query, key_probe(query, schema))
    want = [newest.get(n, -1) for n in range(-50, 550)]
    assert got.tolist() == want
    # Positions hold the rows of those keys.
    table = pa.Table.from_batches(mrs.view().batches)
    hit = [p for p in got.tolist() if p >= 0]
    assert table.column("n").take(pa.array(hit)).to_pylist() == [
        n for n in range(-50, 550) if newest.get(n, -1) >= 0]
    # Queries in any order get the same answers (the index searches them in probe order).
    shuffled = rng.permutation(np.arange(-50, 550))
    query = _rows(schema, shuffled.tolist(), 0)
    got = mrs.lookup(query, key_probe(query, schema))
    assert got.tolist() == [newest.get(int(n), -1) for n in shuffled]


def test_the_key_order_of_an_exact_key_index_is_the_order_a_flush_sorts_to() -> None:
    """What a flush writes from the index's runs equals sorting the versions by key and ts:
    keys repeated across appends (upserts) come out in apply order, and the versions the
    flush drops (ended below the history mark) are left out in either case."""
    rng = np.random.default_rng(11)
    mrs = MemRowSet(EXACT)
    for step in range(1, 200):
        ns = rng.choice(1000, size=int(rng.integers(1, 60)), replace=False).tolist()
        batch = _rows(EXACT, ns, step)
        found = mrs.lookup(batch, key_probe(batch, EXACT))
        mrs.end_versions(found[found >= 0], step)  # each write ends the key's older version
        mrs.append(batch, key_probe(batch, EXACT), step)
    order = mrs.key_order()
    assert order is not None and sorted(order.tolist()) == list(range(len(mrs)))
    view = mrs.view()
    for mark in (0, 50, 150):
        fast = prepare_versions(EXACT, view.table(), view.begin, view.end, mark, order)
        sort = prepare_versions(EXACT, view.table(), view.begin, view.end, mark)
        assert fast.equals(sort), mark
        assert fast.num_rows < len(mrs) or mark == 0
    assert MemRowSet(HASHED).key_order() is None
