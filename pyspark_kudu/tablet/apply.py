"""Applying one decoded write batch to a replica's in-memory state, vectorized.

Semantics (Kudu's, per row, in batch order; every replica computes the same outcome):

===============  ===========================  ===============================
op               key live                      key absent / deleted
===============  ===========================  ===============================
INSERT           error ``AlreadyPresent``      new version
INSERT_IGNORE    nothing                       new version
UPSERT           new version (update path)     new version (insert path)
UPDATE           new version                   error ``NotFound``
UPDATE_IGNORE    new version                   nothing
DELETE           end the live version          error ``NotFound``
DELETE_IGNORE    end the live version          nothing
===============  ===========================  ===============================

A new version is a full row image: supplied columns from the batch, missing columns from the
old version on the update path and from the column default (or null) on the insert path.

The batch is processed with whole-array operations: the MemRowSet's sorted key runs
(:mod:`.memrowset`) and each candidate rowset are searched for all keys at once, and masks
select per op type; no Python object is made per row. A rowset is a candidate if the
batch's first-key range overlaps its own and its bloom filter (:mod:`.bloom`) admits some of
the keys; only those keys are looked up, and a rowset whose filter rules out every key is not
read at all -- inserting fresh keys then reads no key index.

A candidate rowset answers, for each of its keys, the row of the key's newest version there,
its ``ts`` and its ``end`` (deltas applied; ``LIVE`` = the key's current row), in one of two
ways (Kudu reads the key index blocks it needs from disk; this is the same idea over Parquet
row groups):

- **key index**: ``searchsorted`` in the rowset's :class:`~.keys.KeyIndex`, loaded whole
  (key columns, ``ts`` and ``end`` of every row) if not in memory, and kept until the key
  index budget (:mod:`.memory`) drops it;
- **point lookup**: read only the row groups whose key-column statistics may hold one of the
  keys (:mod:`.lookup`) -- their key, ``ts``, ``end`` and row-number columns -- find each
  key's newest version there, and keep nothing (:meth:`.DiskRowSet.point_lookup`).

The rule: a point lookup when the rowset's index is *not* in memory (neither loaded nor kept
from the flush that wrote it) and the row groups to read are at most
``TabletOptions.point_lookup_max_fraction`` (default 1/4) of the rowset's row groups; the key
index otherwise. A small write on a large tablet then reads a row group or two per rowset
and holds no index, while a write touching much of a rowset pays little more to load the
index, which later writes reuse. Both give the same answer, and the rest of the write (ending
old versions by row number, reading old rows for partial updates) is the same for both.

Rows whose key occurs more than once in the batch must see each other's effects, so a batch
with repeated keys is split into *rounds* (round r = the r-th occurrence of every key), applied
in order; within a round all keys are distinct and the vectorized path is exact.

Thread-safety: call under the tablet lock (mutates the MemRowSet and rowset deltas).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.bloom import bloom_hashes
from pyspark_kudu.tablet.keys import LIVE, key_probe, probe_hashes, python_keys
from pyspark_kudu.tablet.memrowset import MemRowSet, Probe
from pyspark_kudu.tablet.ops import OpType, RowError, WriteBatch, WriteResult
from pyspark_kudu.tablet.rowset import DiskRowSet

__all__ = ["ApplyStats", "apply_batch"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_ALREADY_PRESENT = ("AlreadyPresent", "key already present")
_NOT_FOUND = ("NotFound", "key not found")


@dataclass
class ApplyStats:
    """Counters the write path bumps (the tablet aggregates them into its metrics)."""

    index_loads: int = 0
    point_lookups: int = 0  # rowsets probed by reading only some row groups (no index loaded)
    bloom_checks: int = 0  # rowsets whose bloom filter was consulted
    bloom_skips: int = 0  # ... and ruled out every key, so the key index was not needed
    rows_fetched_for_update: int = 0


def apply_batch(schema: Schema, mrs: MemRowSet, rowsets: Sequence[DiskRowSet], index: int,
                wb: WriteBatch, stats: ApplyStats, point_fraction: float) -> WriteResult:
    """Apply ``wb`` at timestamp ``index``; returns the per-row outcome.

    ``point_fraction`` is the point lookups' threshold
    (:attr:`~pyspark_kudu.tablet.TabletOptions.point_lookup_max_fraction`; module docstring).
    """
    n = wb.num_rows
    if n == 0:
        return WriteResult(index, 0)
    problem = _check_batch(schema, wb.rows)
    if problem:
        return WriteResult(index, n, tuple(RowError(i, "InvalidArgument", problem)
                                           for i in range(n)))
    probe = key_probe(wb.rows, schema)
    errors: list[RowError] = []
    # One sort of the batch's probes serves the repeated-key check, the MemRowSet lookup
    # (searched in probe order) and its index's new run. Not a stable sort: it is used only
    # when the probes are distinct (keys.stable_order says why that is faster).
    order = np.argsort(probe)
    ordered = probe[order]  # (np.unique hashes: several times slower on numpy 2.4)
    if not (ordered[1:] == ordered[:-1]).any():  # distinct probes: distinct keys
        _Round(schema, mrs, rowsets, index, stats, point_fraction).run(
            wb.rows, wb.ops, probe, None, errors, order)
    else:  # repeated keys (or, for hashed keys, a collision): exact Python keys decide
        for idx in _rounds(python_keys(wb.rows, schema)):
            sub = wb.rows.take(pa.array(idx))
            _Round(schema, mrs, rowsets, index, stats, point_fraction).run(
                sub, wb.ops[idx], probe[idx], idx, errors)
    errors.sort(key=lambda e: e.row)
    if errors:
        key_rows = wb.rows.select(list(schema.primary_key))
        errors = [replace(e, key=key_rows.slice(e.row, 1).to_pylist()[0]) for e in errors]
    return WriteResult(index, n, tuple(errors))


def _check_batch(schema: Schema, rows: pa.RecordBatch) -> str | None:
    """Why a decoded batch does not fit the tablet's schema (``None`` if it does)."""
    for f in rows.schema:
        if not schema.has_column(f.name):
            return f"column {f.name!r} is not in the tablet schema"
        if f.type != schema.column(f.name).type:
            want = schema.column(f.name).type
            return f"column {f.name!r} has type {f.type}, the tablet has {want}"
    for k in schema.primary_key:
        if k not in rows.schema.names:
            return f"key column {k!r} is missing"
        if rows.column(k).null_count:
            return f"key column {k!r} has nulls"
    return None


def _rounds(keys: list[Hashable]) -> list[I64]:
    """Row indices of the r-th occurrence of each key, for r = 0, 1, ... (batch order kept)."""
    seen: dict[Hashable, int] = {}
    occ = np.empty(len(keys), dtype=np.int64)
    for i, k in enumerate(keys):  # only batches with repeated keys take this path
        c = seen.get(k, 0)
        occ[i] = c
        seen[k] = c + 1
    return [np.nonzero(occ == r)[0] for r in range(int(occ.max()) + 1)]


class _Round:
    """One round: rows with pairwise distinct keys."""

    def __init__(self, schema: Schema, mrs: MemRowSet, rowsets: Sequence[DiskRowSet],
                 index: int, stats: ApplyStats, point_fraction: float) -> None:
        self.schema = schema
        self.mrs = mrs
        self.rowsets = rowsets
        self.index = index
        self.stats = stats
        self.point_fraction = point_fraction

    def run(self, rows: pa.RecordBatch, ops: npt.NDArray[np.int8], probe: Probe,
            orig: I64 | None, errors: list[RowError], order: I64 | None = None) -> None:
        """Apply ``rows`` (pairwise distinct keys; ``probe``: their key probes, ``order``
        its stable argsort if known)."""
        m = rows.num_rows
        pos = (self.mrs.lookup(rows, probe, order) if len(self.mrs)
               else np.full(m, -1, np.int64))
        in_mrs = pos >= 0
        live = np.zeros(m, dtype=bool)
        live[in_mrs] = self.mrs.is_live(pos[in_mrs])
        rs_of, rs_row, rs_end = self._disk_lookup(rows, np.nonzero(~in_mrs)[0], probe)
        on_disk = rs_of >= 0
        live[on_disk] = rs_end[on_disk] == LIVE

        ins = (ops == OpType.INSERT) | (ops == OpType.INSERT_IGNORE)
        ups = ops == OpType.UPSERT
        upd = (ops == OpType.UPDATE) | (ops == OpType.UPDATE_IGNORE)
        dele = (ops == OpType.DELETE) | (ops == OpType.DELETE_IGNORE)
        write_new = (ins & ~live) | ups | (upd & live)
        end_old = live & (ups | upd | dele)

        self._record(errors, orig, (ops == OpType.INSERT) & live, _ALREADY_PRESENT)
        self._record(errors, orig,
                     ((ops == OpType.UPDATE) | (ops == OpType.DELETE)) & ~live, _NOT_FOUND)

        sel = end_old & in_mrs
        if sel.any():
            self.mrs.end_versions(pos[sel], self.index)
        sel_disk = end_old & on_disk
        for j in np.unique(rs_of[sel_disk]):
            self.rowsets[int(j)].end_versions(rs_row[sel_disk & (rs_of == j)], self.index)

        w = np.nonzero(write_new)[0]
        if len(w):
            new_rows = self._new_versions(rows, w, live[w], pos, rs_of, rs_row)
            if len(w) == m:
                self.mrs.append(new_rows, probe, self.index, order)
            else:
                self.mrs.append(new_rows, probe[w], self.index)

    @staticmethod
    def _record(errors: list[RowError], orig: I64 | None, mask: Mask,
                status: tuple[str, str]) -> None:
        for i in np.nonzero(mask)[0]:
            errors.append(RowError(int(i if orig is None else orig[i]), *status))

    def _disk_lookup(self, rows: pa.RecordBatch, need: I64, probe: Probe
                     ) -> tuple[I64, I64, I64]:
        """For rows ``need``: which rowset holds the key's newest version (``rs_of``, -1 for
        none), at which row (``rs_row``), and that version's end (``rs_end``, with every
        delta applied: :data:`LIVE` if it is the key's current row)."""
        m = rows.num_rows
        rs_of = np.full(m, -1, dtype=np.int64)
        rs_row = np.full(m, -1, dtype=np.int64)
        rs_end = np.full(m, -1, dtype=np.int64)
        if len(need) == 0 or not self.rowsets:
            return rs_of, rs_row, rs_end
        qkeys = pa.Table.from_batches([rows]).select(list(self.schema.primary_key))
        if len(need) != m:
            qkeys = qkeys.take(pa.array(need))
        first = qkeys.column(0)
        bounds = pc.min_max(first)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        need_probe = probe[need]
        hashes: dict[int, npt.NDArray[np.uint64]] = {}  # bloom hashes of qkeys, by seed
        best_ts = np.full(len(need), -1, dtype=np.int64)
        for j, rs in enumerate(self.rowsets):
            if hi < rs.meta.min_key[0] or lo > rs.meta.max_key[0]:
                continue
            q: I64 | None = None  # the qkeys the rowset may hold (None: all of them)
            bloom = rs.bloom()
            if bloom is not None:
                self.stats.bloom_checks += 1
                if bloom.seed not in hashes:
                    known = probe_hashes(need_probe, self.schema, bloom.seed)
                    hashes[bloom.seed] = (bloom_hashes(qkeys, self.schema, bloom.seed)
                                          if known is None else known)
                maybe = bloom.may_contain(hashes[bloom.seed])
                if not maybe.any():
                    self.stats.bloom_skips += 1
                    continue
                if not maybe.all():
                    q = np.nonzero(maybe)[0]
            q_keys = qkeys if q is None else qkeys.take(pa.array(q))
            if q is None:
                q = np.arange(len(need))
            groups = self._point_groups(rs, q_keys)
            if groups is not None:
                self.stats.point_lookups += 1
                found_rows, ts, end = rs.point_lookup(q_keys, groups)
            else:
                if rs.index_needs_io():
                    self.stats.index_loads += 1
                index = rs.load_index()
                found_rows = index.latest(q_keys, need_probe[q])
                at = np.maximum(found_rows, 0)
                ts = np.where(found_rows >= 0, index.ts[at], -1)
                end = index.end[at]
            better = (found_rows >= 0) & (ts > best_ts[q])
            best_ts[q[better]] = ts[better]
            rs_of[need[q[better]]] = j
            rs_row[need[q[better]]] = found_rows[better]
            rs_end[need[q[better]]] = end[better]
        return rs_of, rs_row, rs_end

    def _point_groups(self, rs: DiskRowSet, q_keys: pa.Table) -> I64 | None:
        """The row groups a point lookup of ``q_keys`` in ``rs`` reads, or ``None`` to use
        the key index instead (the rule is in the module docstring)."""
        if self.point_fraction <= 0 or not rs.index_needs_io():
            return None
        ranges = rs.key_ranges()
        groups = ranges.groups_for(q_keys)
        return groups if len(groups) <= self.point_fraction * ranges.num_groups else None

    def _new_versions(self, rows: pa.RecordBatch, w: I64, has_old: Mask, pos: I64,
                      rs_of: I64, rs_row: I64) -> pa.RecordBatch:
        present = set(rows.schema.names)
        missing = [c.name for c in self.schema.columns if c.name not in present]
        old = None
        if missing and has_old.any():
            old = self._fetch_old(missing, w[has_old], pos, rs_of, rs_row)
            # Row i of the new versions takes old row old_idx[i] (null index = insert path).
            old_idx = pa.array(np.cumsum(has_old) - 1, type=pa.int64(), mask=~has_old)
        take = pa.array(w) if len(w) != rows.num_rows else None
        arrays = []
        for col in self.schema.columns:
            if col.name in present:
                arr = rows.column(col.name)
                arrays.append(arr if take is None else arr.take(take))
            elif old is None:
                arrays.append(col.default_array(len(w)))
            else:
                prev = old.column(col.name).combine_chunks().take(old_idx)
                arrays.append(pc.if_else(pa.array(has_old), prev, col.default_array(len(w))))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema.arrow_schema)

    def _fetch_old(self, columns: list[str], rows_w: I64, pos: I64, rs_of: I64,
                   rs_row: I64) -> pa.Table:
        """Old values of ``columns`` for rows ``rows_w`` (all have a live old version)."""
        self.stats.rows_fetched_for_update += len(rows_w)
        parts: list[pa.Table] = []
        order: list[I64] = []
        from_mrs = pos[rows_w] >= 0
        if from_mrs.any():
            parts.append(self.mrs.take(pos[rows_w[from_mrs]], columns))
            order.append(np.nonzero(from_mrs)[0])
        where = rs_of[rows_w]
        for j in np.unique(where[~from_mrs]):
            sel = np.nonzero(~from_mrs & (where == j))[0]
            parts.append(self.rowsets[int(j)].read_rows(rs_row[rows_w[sel]], columns))
            order.append(sel)
        table = pa.concat_tables([p.select(columns) for p in parts])
        inverse = np.empty(len(rows_w), dtype=np.int64)
        inverse[np.concatenate(order)] = np.arange(len(rows_w))
        return table.take(pa.array(inverse))
