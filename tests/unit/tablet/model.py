"""A trivial in-memory reference model of a tablet replica, and random inputs for it.

The model applies operations row by row with plain dicts: ``history[key]`` is the list of
``(ts, row_or_None)`` versions. It is deliberately naive so it can be trusted; the property
tests check that the real replica (vectorized apply, rowsets, deltas, compaction, recovery)
returns exactly what the model returns.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from pyspark_kudu.schema import ColumnSchema, Predicate, PredicateOp, Schema
from pyspark_kudu.tablet import OpType, Tablet

SCHEMA = Schema(
    (
        ColumnSchema("k1", "int32", nullable=False),
        ColumnSchema("k2", "string", nullable=False),
        ColumnSchema("a", "int64"),
        ColumnSchema("b", "string"),
        ColumnSchema("c", "double", nullable=False, default=1.5),
        ColumnSchema("d", pa.timestamp("us", tz="UTC")),
        ColumnSchema("e", pa.decimal128(10, 2)),
    ),
    ("k1", "k2"),
)
SCHEMA_INT_KEY = Schema(
    (ColumnSchema("k1", "int32", nullable=False),
     ColumnSchema("k2", "string", nullable=False, default="x"),
     *SCHEMA.columns[2:]),
    ("k1",),
)
"""Same columns with a one-integer key: the key index takes its exact, hash-free path."""
VALUE_COLUMNS = ["a", "b", "c", "d", "e"]
K1 = [0, 1, 2, 3, 4, 5]
K2 = ["x", "y", "long-key-value-over-eight-bytes"]
_UTC = dt.timezone.utc
DOMAINS: dict[str, list[Any]] = {
    "k1": K1,
    "k2": K2,
    "a": [None, -3, 0, 7, 2**40],
    "b": [None, "", "p", "q", "a longer string value"],
    "c": [0.5, 1.5, 2.25],
    "d": [None, dt.datetime(2024, 1, 1, tzinfo=_UTC), dt.datetime(2025, 6, 30, 12, tzinfo=_UTC)],
    "e": [None, Decimal("1.25"), Decimal("-7.00"), Decimal("12345678.99")],
}

Key = tuple[Any, ...]
Row = dict[str, Any]


class Model:
    def __init__(self, schema: Schema = SCHEMA) -> None:
        self.schema = schema
        self.history: dict[Key, list[tuple[int, Row | None]]] = {}

    def _latest(self, key: Key) -> Row | None:
        h = self.history.get(key)
        return h[-1][1] if h else None

    def _put(self, key: Key, ts: int, row: Row | None) -> None:
        h = self.history.setdefault(key, [])
        if h and h[-1][0] == ts:
            h[-1] = (ts, row)  # same entry: the later op wins at this timestamp
        else:
            h.append((ts, row))

    def _fill(self, row: Row) -> Row:
        return {c.name: row.get(c.name, c.default) for c in self.schema.columns}

    def apply(self, index: int, ops: list[OpType], rows: list[Row]) -> list[tuple[int, str]]:
        errors = []
        for i, (op, row) in enumerate(zip(ops, rows, strict=True)):
            key = tuple(row[k] for k in self.schema.primary_key)
            cur = self._latest(key)
            if op in (OpType.INSERT, OpType.INSERT_IGNORE):
                if cur is not None:
                    if op is OpType.INSERT:
                        errors.append((i, "AlreadyPresent"))
                    continue
                self._put(key, index, self._fill(row))
            elif op is OpType.UPSERT:
                self._put(key, index, {**cur, **row} if cur is not None else self._fill(row))
            elif op in (OpType.UPDATE, OpType.UPDATE_IGNORE):
                if cur is None:
                    if op is OpType.UPDATE:
                        errors.append((i, "NotFound"))
                    continue
                self._put(key, index, {**cur, **row})
            else:
                if cur is None:
                    if op is OpType.DELETE:
                        errors.append((i, "NotFound"))
                    continue
                self._put(key, index, None)
        return errors

    def read(self, snapshot: int) -> dict[Key, Row]:
        out = {}
        for key, h in self.history.items():
            visible = [r for ts, r in h if ts <= snapshot]
            if visible and visible[-1] is not None:
                out[key] = visible[-1]
        return out


def matches(row: Row, p: Predicate) -> bool:
    v = row[p.column]
    if p.op is PredicateOp.IS_NULL:
        return v is None
    if p.op is PredicateOp.IS_NOT_NULL:
        return v is not None
    if v is None:
        return False
    if p.op is PredicateOp.IN:
        return v in p.value
    return {
        PredicateOp.EQ: v == p.value, PredicateOp.NE: v != p.value,
        PredicateOp.LT: v < p.value, PredicateOp.LE: v <= p.value,
        PredicateOp.GT: v > p.value, PredicateOp.GE: v >= p.value,
    }[p.op]


def expected(model: Model, snapshot: int, columns: list[str] | None,
             preds: list[Predicate]) -> list[Row]:
    rows = [r for r in model.read(snapshot).values() if all(matches(r, p) for p in preds)]
    cols = columns or model.schema.names
    return sorted(({c: r[c] for c in cols} for r in rows), key=_sort_key)


def actual(tablet: Tablet, snapshot: int, columns: list[str] | None,
           preds: list[Predicate], batch_rows: int | None = None) -> list[Row]:
    batches = list(tablet.scan(columns, preds, snapshot, batch_rows))
    for b in batches:
        assert b.schema == tablet.schema.project(columns), "scan output schema must be exact"
        if batch_rows:
            assert b.num_rows <= batch_rows
    rows = [r for b in batches for r in b.to_pylist()]
    return sorted(rows, key=_sort_key)


def _sort_key(r: Row) -> tuple[Any, ...]:
    return tuple((v is None, "" if v is None else repr(v)) for v in r.values())


@st.composite
def write_batches(draw: st.DrawFn, schema: Schema = SCHEMA
                  ) -> tuple[list[OpType], pa.Table, list[Row]]:
    """Random ops on a small key space (repeats within a batch included)."""
    n = draw(st.integers(0, 8))
    present = sorted(draw(st.sets(st.sampled_from(VALUE_COLUMNS))),
                     key=VALUE_COLUMNS.index)
    ops = [draw(st.sampled_from(list(OpType))) for _ in range(n)]
    rows: list[Row] = []
    for _ in range(n):
        row: Row = {"k1": draw(st.sampled_from(K1)), "k2": draw(st.sampled_from(K2))}
        for c in present:
            row[c] = draw(st.sampled_from(DOMAINS[c]))
        rows.append(row)
    cols = ["k1", "k2", *present]
    table = pa.table({c: pa.array([r[c] for r in rows], type=schema.column(c).type)
                      for c in cols})
    return ops, table, rows


@st.composite
def predicates(draw: st.DrawFn) -> list[Predicate]:
    out = []
    for _ in range(draw(st.integers(0, 2))):
        col = draw(st.sampled_from(SCHEMA.names))
        op = draw(st.sampled_from(list(PredicateOp)))
        values = [v for v in DOMAINS[col] if v is not None]
        if op is PredicateOp.IN:
            out.append(Predicate.in_(col, draw(st.lists(st.sampled_from(values), max_size=3))))
        elif op in (PredicateOp.IS_NULL, PredicateOp.IS_NOT_NULL):
            out.append(Predicate(col, op))
        else:
            out.append(Predicate(col, op, draw(st.sampled_from(values))))
    return out
