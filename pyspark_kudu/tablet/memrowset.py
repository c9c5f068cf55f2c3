"""The MemRowSet: row versions applied since the last flush, in memory, in apply order.

Versions are appended as Arrow record batches (full row images, schema columns) with their
begin timestamps in a parallel array; ending a version writes its end timestamp in place.
A dict maps each key to the position of its newest version here, which is all the write path
needs: every MemRowSet version is newer than any flushed version, so a key found here needs no
disk lookup.

A :class:`MemRowSetView` is what a scan keeps: the batches and arrays as of the moment it was
taken. Later appends do not show up in it, and later end timestamps are above any snapshot a
scan may read (a scan never reads above the applied index), so the view stays exact.

Thread-safety: not thread-safe for writers; the tablet applies entries under its lock.
Views are safe to read from other threads while the writer continues.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.keys import LIVE

__all__ = ["MemRowSet", "MemRowSetView"]

I64 = npt.NDArray[np.int64]


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


def _object_bytes(key: Hashable) -> int:
    if isinstance(key, tuple):
        return sys.getsizeof(key) + sum(sys.getsizeof(k) for k in key)
    return sys.getsizeof(key)


class MemRowSet:
    """Versions in apply order plus a key -> newest-position dict."""

    def __init__(self, schema: Schema) -> None:
        self._schema = schema
        self._arrow_schema = schema.arrow_schema
        self._batches: list[pa.RecordBatch] = []
        self._begin = np.empty(1024, dtype=np.int64)
        self._end = np.empty(1024, dtype=np.int64)
        self._n = 0
        self._nbytes = 0
        self._index: dict[Hashable, int] = {}
        # Bytes per key in the dict: its slot, the position int and the key object (a
        # tuple of a composite key costs several times an int); sized on the first key.
        self._entry_bytes = 100

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Approximate memory held (row data plus index), used for flush thresholds."""
        return self._nbytes + self._entry_bytes * len(self._index)

    def lookup(self, keys: Sequence[Hashable]) -> I64:
        """Position of each key's newest version here, ``-1`` if the key has none."""
        get = self._index.get
        return np.fromiter(map(get, keys, repeat(-1)), dtype=np.int64, count=len(keys))

    def is_live(self, positions: I64) -> npt.NDArray[np.bool_]:
        return np.asarray(self._end[positions] == LIVE)

    def begin_of(self, positions: I64) -> I64:
        return np.asarray(self._begin[positions])

    def end_versions(self, positions: I64, ts: int) -> None:
        """Mark the versions at ``positions`` as replaced or deleted at ``ts``."""
        self._end[positions] = ts

    def append(self, rows: pa.RecordBatch, keys: Sequence[Hashable], ts: int) -> None:
        """Append new versions (full schema columns, schema order) written at ``ts``."""
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
        if not self._index:
            self._entry_bytes = 72 + _object_bytes(keys[0])
        self._index.update(zip(keys, range(self._n, need), strict=True))
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
