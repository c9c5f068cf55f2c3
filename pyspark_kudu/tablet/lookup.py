"""Which row groups of a rowset file may hold given keys: what a point lookup reads.

A rowset file is sorted by primary key (then ``ts``), so each Parquet row group covers a key
range, and its footer records every column chunk's min/max. A row of key ``k`` can be in row
group ``g`` only if, for *every* key column ``c``, ``min_g(c) <= k[c] <= max_g(c)``: a
necessary condition that holds whatever the column's position in the key, so it needs no
reasoning about lexicographic order. It matters beyond the first column: with a composite
key whose first column has few values (a host name, then a timestamp), most row groups hold
one first-column value, and only the later columns' ranges tell them apart.

The answer is a superset of the groups holding the key -- never fewer -- so every version of
a key is read even where its versions span a row-group boundary; missing statistics (a
chunk written without them, or a value too long to record) count as "may hold anything".

Two steps keep it cheap for large batches: the first key column is sorted across the file,
so its ranges give each key a contiguous run of groups by binary search; the other columns
then filter those (key, group) pairs, unless there are more than :data:`MAX_PAIRS` of them
(the runs alone are then the answer, still a superset).

Thread-safety: :class:`KeyRanges` is immutable after construction.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_kudu.schema import Schema

__all__ = ["MAX_PAIRS", "KeyRanges"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

MAX_PAIRS = 1 << 20
"""Most (key, row group) pairs the later key columns are checked on (module docstring)."""


class KeyRanges:
    """Per row group of one rowset file: its first row and each key column's min/max."""

    def __init__(self, md: pq.FileMetaData, schema: Schema) -> None:
        g = md.num_row_groups
        sizes = np.array([md.row_group(i).num_rows for i in range(g)], dtype=np.int64)
        self.starts: I64 = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        index = {md.schema.column(i).name: i for i in range(md.num_columns)}
        self._bounds: list[tuple[Any, Any, Mask] | None] = []
        for col in schema.key_columns:
            i = index.get(col.name)
            self._bounds.append(None if i is None else _column_bounds(md, i, col.type))
        first = self._bounds[0]
        # The first column's ranges, if every group has them and they are in file order.
        self._runs = (first[0], first[1]) if (
            first is not None and first[2].all() and _sorted(first[0]) and _sorted(first[1])
        ) else None

    @property
    def num_groups(self) -> int:
        return len(self.starts) - 1

    def groups_for(self, qkeys: pa.Table) -> I64:
        """Sorted row groups that may hold a row of any of ``qkeys`` (key columns)."""
        n_groups, q = self.num_groups, qkeys.num_rows
        if n_groups == 0 or q == 0:
            return np.empty(0, dtype=np.int64)
        values = [_numpy(qkeys.column(i)) for i in range(qkeys.num_columns)]
        if self._runs is not None:
            mins, maxs = self._runs
            lo = np.searchsorted(maxs, values[0], side="left")  # first group with max >= k
            hi = np.searchsorted(mins, values[0], side="right")  # groups with min <= k
            hi = np.maximum(hi, lo)
        else:
            lo = np.zeros(q, dtype=np.int64)
            hi = np.full(q, n_groups, dtype=np.int64)
        counts = hi - lo
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, dtype=np.int64)
        if total > MAX_PAIRS:
            cover = np.zeros(n_groups + 1, dtype=np.int64)
            np.add.at(cover, lo, 1)
            np.add.at(cover, hi, -1)
            return np.nonzero(np.cumsum(cover[:-1]) > 0)[0].astype(np.int64)
        # Every (key, group) pair of the runs, then filtered by each column's ranges.
        q_idx = np.repeat(np.arange(q), counts)
        run_start = np.cumsum(counts) - counts
        g_idx = np.arange(total) - np.repeat(run_start - lo, counts)
        keep = np.ones(total, dtype=bool)
        for bounds, v in zip(self._bounds, values, strict=True):
            if bounds is None:
                continue
            mins, maxs, known = bounds
            k = v[q_idx]
            keep &= ~known[g_idx] | ((mins[g_idx] <= k) & (k <= maxs[g_idx]))
        return np.unique(g_idx[keep]).astype(np.int64)


def _numpy(col: pa.ChunkedArray | pa.Array) -> Any:
    """Values comparable with ``<=`` in numpy: numbers, datetime64, or objects (str, bytes,
    Decimal). The statistics are converted the same way from the same Arrow type."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr.to_numpy(zero_copy_only=False)


def _sorted(a: Any) -> bool:
    """Whether ``a`` is non-decreasing: true of the first key column's ranges in a sorted file;
    checked because the binary search depends on it."""
    return bool(np.all(a[1:] >= a[:-1]))


def _column_bounds(md: pq.FileMetaData, i: int, t: pa.DataType) -> tuple[Any, Any, Mask] | None:
    """(mins, maxs, known) of parquet column ``i`` per row group, as numpy arrays of type
    ``t``'s values; ``None`` if no group records them (or they do not convert to ``t``)."""
    mins: list[Any] = []
    maxs: list[Any] = []
    known: list[bool] = []
    for g in range(md.num_row_groups):
        s = md.row_group(g).column(i).statistics
        ok = s is not None and s.has_min_max
        known.append(ok)
        mins.append(s.min if ok else None)
        maxs.append(s.max if ok else None)
    mask = np.array(known, dtype=bool)
    if not mask.any():
        return None
    # Groups without statistics get a real value (any): they are masked out anyway, and
    # object arrays cannot compare None with str.
    fill = next(j for j, k in enumerate(known) if k)
    mins = [v if k else mins[fill] for v, k in zip(mins, known, strict=True)]
    maxs = [v if k else maxs[fill] for v, k in zip(maxs, known, strict=True)]
    try:
        return _numpy(pa.array(mins, type=t)), _numpy(pa.array(maxs, type=t)), mask
    except (pa.ArrowException, TypeError, ValueError):
        return None
