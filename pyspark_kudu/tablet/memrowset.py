"""The MemRowSet: row versions applied since the last flush, in memory, in apply order.

Versions are appended as Arrow record batches (full row images, schema columns) with their
begin timestamps in a parallel array; ending a version writes its end timestamp in place.
An index finds the position of each key's newest version here, which is all the write path
needs: every MemRowSet version is newer than any flushed version, so a key found here needs no
disk lookup.

The index holds no Python object per row. It is a few sorted numpy runs of (probe, position)
pairs, where the probe is :func:`~.keys.key_probe` of the key: the ``int64`` key itself for
one integer-like key column, else its 64-bit hash. Each append adds a run; runs of similar
length are merged (a stable sort of two sorted runs), so there are O(log n) runs and a lookup
is a ``searchsorted`` per run, newest run first. A hash probe's hit is checked against the
stored key columns; on a 64-bit collision every position with that probe is compared. A dict
of Python keys (a tuple per composite key) cost ~1.3 s per million keys to build and look up
and ~200 bytes per key; the runs cost 16 bytes per key and stay vectorized.

A :class:`MemRowSetView` is what a scan keeps: the batches and arrays as of the moment it was
taken. Later appends do not show up in it, and later end timestamps are above any snapshot a
scan may read (a scan never reads above the applied index), so the view stays exact.

Thread-safety: not thread-safe for writers; the tablet applies entries under its lock.
Views are safe to read from other threads while the writer continues.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.keys import LIVE, is_exact_probe

__all__ = ["MemRowSet", "MemRowSetView"]

I64 = npt.NDArray[np.int64]
Probe = npt.NDArray[np.int64] | npt.NDArray[np.uint64]
_INDEX_ENTRY_BYTES = 16  # a probe and a position


@dataclass(frozen=True)
class MemRowSetView:
    """An immutable snapshot of a MemRowSet's versions for scans and flushes."""

    batches: tuple[pa.RecordBatch, ...]
    begin: I64
    end: I64
    schema: pa.Schema

    @property
    def num_rows(self) -> int:
        return len(self.begin)

    def table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches), schema=self.schema)


class _Runs:
    """Sorted runs of (probe, position): the MemRowSet's key index (module docstring).
    Within a run, pairs are sorted by probe, then position; every position in a newer run
    is above every position in an older one."""

    def __init__(self) -> None:
        self.runs: list[tuple[Probe, I64]] = []  # oldest first
        self.entries = 0

    def add(self, probe: Probe, start: int) -> None:
        order = np.argsort(probe, kind="stable")
        self.runs.append((probe[order], order.astype(np.int64) + start))
        self.entries += len(probe)
        # Keep run lengths falling geometrically: O(log n) runs, O(n log n) merging.
        while len(self.runs) >= 2 and len(self.runs[-2][0]) <= 2 * len(self.runs[-1][0]):
            (p1, q1), (p2, q2) = self.runs[-2], self.runs.pop()
            p = np.concatenate([p1, p2])
            # Stable: equal probes keep the older run's (lower) positions first.
            order = np.argsort(p, kind="stable")
            self.runs[-1] = (p[order], np.concatenate([q1, q2])[order])

    def newest(self, probe: Probe) -> I64:
        """The highest position stored with each probe, ``-1`` for none."""
        out = np.full(len(probe), -1, dtype=np.int64)
        todo = np.arange(len(probe))
        for keys, pos in reversed(self.runs):
            if not len(todo):
                break
            q = probe[todo]
            at = np.searchsorted(keys, q, side="right") - 1
            hit = at >= 0
            hit[hit] = keys[at[hit]] == q[hit]
            out[todo[hit]] = pos[at[hit]]
            todo = todo[~hit]
        return out

    def all_positions(self, probe: int) -> I64:
        """Every position stored with ``probe`` (collision handling)."""
        found = []
        for keys, pos in self.runs:
            lo = np.searchsorted(keys, probe, side="left")
            hi = np.searchsorted(keys, probe, side="right")
            found.append(pos[lo:hi])
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


class MemRowSet:
    """Versions in apply order plus a key index (module docstring)."""

    def __init__(self, schema: Schema) -> None:
        self._schema = schema
        self._arrow_schema = schema.arrow_schema
        self._batches: list[pa.RecordBatch] = []
        self._begin = np.empty(1024, dtype=np.int64)
        self._end = np.empty(1024, dtype=np.int64)
        self._n = 0
        self._nbytes = 0
        self._exact = is_exact_probe(schema)
        self._runs = _Runs()
        self._keys: pa.Table | None = None  # key columns of every version, for verification

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Approximate memory held (row data plus index), used for flush thresholds."""
        return self._nbytes + _INDEX_ENTRY_BYTES * self._runs.entries

    def lookup(self, keys: pa.Table | pa.RecordBatch, probe: Probe) -> I64:
        """Position of each key's newest version here, ``-1`` if the key has none.
        ``keys`` holds the key columns (others are ignored); ``probe`` is their
        :func:`~.keys.key_probe`."""
        pos = self._runs.newest(probe)
        if self._exact or not (pos >= 0).any():
            return pos
        q_idx = np.nonzero(pos >= 0)[0]
        same = self._equal(keys, q_idx, pos[q_idx])
        for qi in q_idx[~same]:  # a 64-bit hash collision: compare every candidate
            cand = self._runs.all_positions(probe[qi])
            hits = cand[self._equal(keys, np.full(len(cand), qi, dtype=np.int64), cand)]
            pos[qi] = int(hits.max()) if len(hits) else -1
        return pos

    def _equal(self, keys: pa.Table | pa.RecordBatch, q_idx: I64, positions: I64
               ) -> npt.NDArray[np.bool_]:
        if self._keys is None or self._keys.num_rows != self._n:
            self._keys = pa.Table.from_batches(self._batches, schema=self._arrow_schema
                                               ).select(list(self._schema.primary_key))
        eq = np.ones(len(q_idx), dtype=bool)
        q_take, r_take = pa.array(q_idx, pa.int64()), pa.array(positions, pa.int64())
        for name in self._schema.primary_key:
            a = keys.column(name).take(q_take)
            b = self._keys.column(name).take(r_take)
            eq &= np.asarray(pc.equal(a, b).to_numpy(zero_copy_only=False), dtype=bool)
        return eq

    def is_live(self, positions: I64) -> npt.NDArray[np.bool_]:
        return np.asarray(self._end[positions] == LIVE)

    def begin_of(self, positions: I64) -> I64:
        return np.asarray(self._begin[positions])

    def end_versions(self, positions: I64, ts: int) -> None:
        """Mark the versions at ``positions`` as replaced or deleted at ``ts``."""
        self._end[positions] = ts

    def append(self, rows: pa.RecordBatch, probe: Probe, ts: int) -> None:
        """Append new versions (full schema columns, schema order, pairwise distinct keys)
        written at ``ts``; ``probe`` is :func:`~.keys.key_probe` of ``rows``."""
        k = rows.num_rows
        if k == 0:
            return
        need = self._n + k
        if need > len(self._begin):
            cap = max(need, 2 * len(self._begin))
            for name in ("_begin", "_end"):
                grown = np.empty(cap, dtype=np.int64)
                grown[: self._n] = getattr(self, name)[: self._n]
                setattr(self, name, grown)
        self._begin[self._n: need] = ts
        self._end[self._n: need] = LIVE
        self._runs.add(probe, self._n)
        self._batches.append(rows)
        self._nbytes += rows.nbytes
        self._n = need

    def take(self, positions: I64, columns: Sequence[str]) -> pa.Table:
        """The given columns of the versions at ``positions`` (in that order)."""
        table = pa.Table.from_batches(self._batches, schema=self._arrow_schema).select(
            list(columns))
        return table.take(pa.array(positions, type=pa.int64()))

    def view(self) -> MemRowSetView:
        return MemRowSetView(tuple(self._batches), self._begin[: self._n].copy(),
                             self._end[: self._n].copy(), self._arrow_schema)
