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
key columns its run keeps (one chunk per run, so a batch's checks are one ``take`` per run);
on a 64-bit collision every position with that probe is compared. A dict
of Python keys (a tuple per composite key) cost ~1.3 s per million keys to build and look up
and ~200 bytes per key; the runs cost 16 bytes per key (plus a copy of hashed keys' columns)
and stay vectorized.

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
from pyspark_kudu.tablet.keys import LIVE, is_exact_probe, stable_order

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


@dataclass
class _Run:
    """Index entries of the consecutive positions ``lo .. lo + len(probes) - 1``."""

    probes: Probe  # sorted
    positions: I64  # of each sorted probe; equal probes in ascending position order
    lo: int
    keys: pa.Table | None  # key columns of the run's positions, in position order (one chunk)


class _Runs:
    """Sorted runs of (probe, position): the MemRowSet's key index (module docstring). A
    run covers consecutive positions; every position in a newer run is above every
    position in an older one. With ``keep_keys`` (hashed probes), each run also keeps its
    key columns as one chunk, so that a hit is verified with one ``take`` per run."""

    def __init__(self, keep_keys: bool) -> None:
        self.runs: list[_Run] = []  # oldest first
        self.entries = 0
        self._keep_keys = keep_keys

    def add(self, probe: Probe, start: int, keys: pa.Table, order: I64 | None = None) -> None:
        """Index positions ``start ..`` with their probes; ``order``: ``probe``'s stable
        argsort, if the caller has it."""
        if order is None:
            order = stable_order(probe)
        self.runs.append(_Run(probe[order], order.astype(np.int64) + start, start,
                              keys.combine_chunks() if self._keep_keys else None))
        self.entries += len(probe)
        # Keep run lengths falling geometrically: O(log n) runs, O(n log n) merging.
        while len(self.runs) >= 2 and len(self.runs[-2].probes) <= 2 * len(self.runs[-1].probes):
            a, b = self.runs[-2], self.runs.pop()
            p = np.concatenate([a.probes, b.probes])
            # Stable: equal probes keep the older run's (lower) positions first.
            order = np.argsort(p, kind="stable")
            keys_ab = (None if a.keys is None or b.keys is None
                       else pa.concat_tables([a.keys, b.keys]).combine_chunks())
            self.runs[-1] = _Run(p[order], np.concatenate([a.positions, b.positions])[order],
                                 a.lo, keys_ab)

    def newest(self, probe: Probe, order: I64 | None = None) -> tuple[I64, I64]:
        """The highest position stored with each probe (``-1`` for none), and the index in
        ``runs`` of the run it is in. ``order``: ``probe``'s argsort, if the caller has it."""
        out = np.full(len(probe), -1, dtype=np.int64)
        run_of = np.full(len(probe), -1, dtype=np.int64)
        # Searched in probe order: neighbouring queries touch neighbouring parts of a run,
        # several times faster than random order on a run that does not fit the caches.
        todo = np.argsort(probe) if order is None else order
        for r in range(len(self.runs) - 1, -1, -1):
            if not len(todo):
                break
            run = self.runs[r]
            q = probe[todo]
            at = np.searchsorted(run.probes, q, side="right") - 1
            hit = at >= 0
            hit[hit] = run.probes[at[hit]] == q[hit]
            out[todo[hit]] = run.positions[at[hit]]
            run_of[todo[hit]] = r
            todo = todo[~hit]
        return out, run_of

    def order(self) -> I64:
        """Every position, sorted by (probe, position): the runs are sorted already, so
        this is a merge (numpy's stable sort finds and merges the runs)."""
        if len(self.runs) == 1:
            return np.array(self.runs[0].positions, dtype=np.int64)
        p = np.concatenate([r.probes for r in self.runs])  # oldest run first: stable ties
        positions = np.concatenate([r.positions for r in self.runs])
        return np.asarray(positions[np.argsort(p, kind="stable")], dtype=np.int64)

    def with_probe(self, probe: int) -> list[tuple[int, I64]]:
        """Every (run index, positions) stored with ``probe`` (collision handling)."""
        found = []
        for r, run in enumerate(self.runs):
            lo = np.searchsorted(run.probes, probe, side="left")
            hi = np.searchsorted(run.probes, probe, side="right")
            if hi > lo:
                found.append((r, run.positions[lo:hi]))
        return found


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
        self._runs = _Runs(keep_keys=not self._exact)

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Approximate memory held (row data plus index), used for flush thresholds."""
        keys = sum(int(r.keys.nbytes) for r in self._runs.runs if r.keys is not None)
        return self._nbytes + _INDEX_ENTRY_BYTES * self._runs.entries + keys

    def lookup(self, keys: pa.Table | pa.RecordBatch, probe: Probe,
               order: I64 | None = None) -> I64:
        """Position of each key's newest version here, ``-1`` if the key has none.
        ``keys`` holds the key columns (others are ignored); ``probe`` is their
        :func:`~.keys.key_probe`, ``order`` its stable argsort if the caller has it."""
        pos, run_of = self._runs.newest(probe, order)
        if self._exact or not (pos >= 0).any():
            return pos
        q_idx = np.nonzero(pos >= 0)[0]
        same = np.zeros(len(q_idx), dtype=bool)
        for r in np.unique(run_of[q_idx]):
            sel = np.nonzero(run_of[q_idx] == r)[0]
            same[sel] = self._equal(keys, q_idx[sel], int(r), pos[q_idx[sel]])
        for qi in q_idx[~same]:  # a 64-bit hash collision: compare every candidate
            best = -1
            for r, cand in self._runs.with_probe(probe[qi]):
                hits = cand[self._equal(keys, np.full(len(cand), qi, dtype=np.int64), r, cand)]
                best = max(best, int(hits.max()) if len(hits) else -1)
            pos[qi] = best
        return pos

    def _equal(self, keys: pa.Table | pa.RecordBatch, q_idx: I64, run: int, positions: I64
               ) -> npt.NDArray[np.bool_]:
        """Whether query rows ``q_idx`` hold the keys stored at ``positions`` of ``run``."""
        stored = self._runs.runs[run]
        assert stored.keys is not None
        eq = np.ones(len(q_idx), dtype=bool)
        q_take = pa.array(q_idx, pa.int64())
        r_take = pa.array(positions - stored.lo, pa.int64())
        for name in self._schema.primary_key:
            a = keys.column(name).take(q_take)
            b = stored.keys.column(name).take(r_take)
            eq &= np.asarray(pc.equal(a, b).to_numpy(zero_copy_only=False), dtype=bool)
        return eq

    def key_order(self) -> I64 | None:
        """Every position in (key, apply) order when the probe is the key itself
        (:func:`~.keys.is_exact_probe`), else ``None``: what a flush sorts by, from the
        index's sorted runs instead of a sort of the whole MemRowSet."""
        return self._runs.order() if self._exact and self._n else None

    def key_hashes(self) -> npt.NDArray[np.uint64] | None:
        """Every position's :func:`~.keys.key_hash` (at ``keys.INDEX_SEED``) when the index
        probes by hash, else ``None``: a flush builds the rowset's bloom filter from these
        instead of hashing every key again."""
        if self._exact or not self._n:
            return None
        out = np.empty(self._n, dtype=np.uint64)
        for run in self._runs.runs:
            out[run.positions] = run.probes
        return out

    def is_live(self, positions: I64) -> npt.NDArray[np.bool_]:
        return np.asarray(self._end[positions] == LIVE)

    def begin_of(self, positions: I64) -> I64:
        return np.asarray(self._begin[positions])

    def end_versions(self, positions: I64, ts: int) -> None:
        """Mark the versions at ``positions`` as replaced or deleted at ``ts``."""
        self._end[positions] = ts

    def append(self, rows: pa.RecordBatch, probe: Probe, ts: int,
               order: I64 | None = None) -> None:
        """Append new versions (full schema columns, schema order, pairwise distinct keys)
        written at ``ts``; ``probe`` is :func:`~.keys.key_probe` of ``rows``, ``order`` its
        stable argsort if the caller has it."""
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
        self._runs.add(probe, self._n, pa.Table.from_batches([rows]).select(
            list(self._schema.primary_key)), order)
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
