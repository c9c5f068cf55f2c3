"""Compaction as a stream: a k-way merge of rowsets written straight into new rowset files.

:func:`merge_rowsets` reads every input rowset in batches of ``batch_rows`` rows (file
order: key, then ``ts``), folds the rowset's deltas into ``__kudu_end`` and drops the
versions no permitted snapshot can see (see :mod:`.compaction`). Each input keeps a buffer;
the *frontier* is the smallest last key buffered by an input that is not exhausted. Every
buffered row with a key below the frontier is complete -- no unread row of any input can
hold that key, since inputs are sorted -- so those rows are sorted and emitted as one
chunk, and the inputs whose buffer ends at the frontier read their next batch. A buffer
therefore holds at most its last key's versions plus one batch: the merge holds about
``2 * len(inputs) * batch_rows`` rows at once, whatever the rowsets' sizes.

:func:`write_merged` writes the chunks into files of about ``target_rows`` rows, cutting only
between keys (all versions of a key stay in one file, key ranges do not overlap) at the
same places a cut of the whole sorted output would take: the first key boundary at or after
``target_rows`` rows into each file. Files are written row group by row group
(:class:`~pyspark_kudu.tablet.parquet_files.ParquetSink`). Each file keeps its keys' bloom hashes
as its rows go by (8 bytes per row, not the keys) and fills its bloom filter (:mod:`.bloom`)
once, when it is done, sized for the rows it got: one dense pass over the filter instead of
a scattered OR per piece, which cost ~130 ns per key and hash function (20 at the default
false-positive rate) and was a third of a busy server's time during a composite-key ingest.

Thread-safety: functions over their arguments. :func:`merge_rowsets` reads the input
rowsets' deltas when it starts unless it is given a snapshot of them: without one, iterate it
under the tablet lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.bloom import DEFAULT_FP_RATE, BloomFilter, bloom_hashes, write_bloom
from pyspark_kudu.tablet.compaction import ROWSET_ENCODINGS, sort_versions
from pyspark_kudu.tablet.keys import (
    END_COLUMN,
    LIVE,
    ROW_COLUMN,
    TS_COLUMN,
    is_exact_probe,
    key_probe,
)
from pyspark_kudu.tablet.parquet_files import ParquetSink, physical_schema
from pyspark_kudu.tablet.rowset import (
    DiskRowSet,
    RowSetMeta,
    bloom_check,
    bloom_file,
    rowset_file,
)

__all__ = ["MergeStats", "merge_rowsets", "write_merged"]

I64 = npt.NDArray[np.int64]


@dataclass
class MergeStats:
    """What one merge held at most: rows in its input buffers, and bytes allocated by
    Arrow's default pool (sampled once per merge step)."""

    peak_buffered_rows: int = 0
    peak_arrow_bytes: int = 0
    chunks: int = 0


class _Order:
    """Key order of sorted version tables: ``int64`` probes for one integer-like key column,
    Python tuples otherwise (same order as Arrow's sort for the key-capable types)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.exact = is_exact_probe(schema)
        self.pk = list(schema.primary_key)

    def key_at(self, table: pa.Table, i: int) -> Any:
        row = table.slice(i, 1)
        if self.exact:
            return int(key_probe(row, self.schema)[0])
        return tuple(_comparable(row.column(k))[0].as_py() for k in self.pk)

    def count_below(self, table: pa.Table, key: Any) -> int:
        """Rows of the sorted ``table`` whose key is below ``key``."""
        if self.exact:
            return int(np.searchsorted(key_probe(table, self.schema), key, side="left"))
        return bisect.bisect_left(range(table.num_rows), key,
                                  key=lambda i: self.key_at(table, i))

    def boundaries(self, table: pa.Table) -> npt.NDArray[np.bool_]:
        """``b[i]``: row ``i`` holds a different key than row ``i - 1`` (``b[0]`` is True)."""
        n = table.num_rows
        out = np.ones(n, dtype=bool)
        if n < 2:
            return out
        if self.exact:
            probe = key_probe(table, self.schema)
            out[1:] = probe[1:] != probe[:-1]
            return out
        diff = np.zeros(n - 1, dtype=bool)
        for k in self.pk:
            col = table.column(k)
            ne = pc.not_equal(col.slice(1), col.slice(0, n - 1))
            diff |= np.asarray(ne.to_numpy(zero_copy_only=False), dtype=bool)
        out[1:] = diff
        return out


def _comparable(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Timestamps and dates as integers (exact, and free of time-zone objects)."""
    t = col.type
    if pa.types.is_date32(t):
        return col.cast(pa.int32())
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        return col.cast(pa.int64())
    return col


class _Input:
    """One input rowset read in batches, its deltas folded in, invisible versions dropped."""

    def __init__(self, rs: DiskRowSet, history_mark: int, batch_rows: int,
                 deltas: tuple[I64, I64] | None = None) -> None:
        rows, ends = rs.deltas() if deltas is None else deltas
        order = np.argsort(rows, kind="stable")
        self._drows, self._dends = rows[order], ends[order]
        self._mark = history_mark
        self._batches = rs.iter_batches(batch_rows)
        self.buf: pa.Table | None = None
        self.done = False

    def fill(self) -> None:
        """Append the next batch that keeps any row (or mark the input done)."""
        while not self.done:
            batch = next(self._batches, None)
            if batch is None:
                self.done = True
                return
            t = self._fold(pa.Table.from_batches([batch]))
            if t.num_rows:
                self.buf = t if self.buf is None or not self.buf.num_rows else (
                    pa.concat_tables([self.buf.combine_chunks(), t]))
                return

    def _fold(self, t: pa.Table) -> pa.Table:
        end = np.array(t.column(END_COLUMN).to_numpy(), dtype=np.int64)
        if len(self._drows):
            row = np.asarray(t.column(ROW_COLUMN).to_numpy(), dtype=np.int64)
            at = np.minimum(np.searchsorted(self._drows, row), len(self._drows) - 1)
            hit = self._drows[at] == row
            end[hit] = self._dends[at[hit]]
        ts = np.asarray(t.column(TS_COLUMN).to_numpy(), dtype=np.int64)
        keep = (end > ts) & (end > self._mark)
        t = t.drop_columns([END_COLUMN, ROW_COLUMN]).append_column(
            pa.field(END_COLUMN, pa.int64(), nullable=False), pa.array(end, type=pa.int64()))
        return t if keep.all() else t.filter(pa.array(keep))


def merge_rowsets(schema: Schema, rowsets: Sequence[DiskRowSet], history_mark: int,
                  batch_rows: int, stats: MergeStats | None = None,
                  deltas: Sequence[tuple[I64, I64]] | None = None) -> Iterator[pa.Table]:
    """Sorted chunks of complete keys: together, every version of ``rowsets`` visible at
    some snapshot ``>= history_mark``, in key then ``ts`` order (module docstring).

    ``deltas``: each rowset's ``(rows, ends)`` as the caller took them under the tablet
    lock, for a merge that runs without it (default: read from the rowsets when the merge
    starts, which needs the lock)."""
    order = _Order(schema)
    stats = stats if stats is not None else MergeStats()
    snap = list(deltas) if deltas is not None else [None] * len(rowsets)
    inputs = [_Input(rs, history_mark, max(1, batch_rows), d)
              for rs, d in zip(rowsets, snap, strict=True)]
    for inp in inputs:
        inp.fill()
    while True:
        live = [i for i in inputs if i.buf is not None and i.buf.num_rows]
        if not live:
            return
        stats.peak_buffered_rows = max(stats.peak_buffered_rows,
                                       sum(i.buf.num_rows for i in live if i.buf is not None))
        stats.peak_arrow_bytes = max(stats.peak_arrow_bytes, pa.total_allocated_bytes())
        bounding = [i for i in live if not i.done]
        frontier = None
        if bounding:
            frontier = min(order.key_at(b, b.num_rows - 1)
                           for b in (i.buf for i in bounding) if b is not None)
        parts = []
        for i in live:
            assert i.buf is not None
            n = i.buf.num_rows if frontier is None else order.count_below(i.buf, frontier)
            if n:
                parts.append(i.buf.slice(0, n))
                i.buf = i.buf.slice(n)
        if parts:
            stats.chunks += 1
            yield sort_versions(pa.concat_tables(parts), schema)
        for i in bounding:
            assert i.buf is not None
            if not i.buf.num_rows or order.key_at(i.buf, i.buf.num_rows - 1) == frontier:
                i.fill()


class _Output:
    """One output rowset file being written, with the metadata gathered on the way."""

    def __init__(self, fileio: FileIO, rowset_id: int, schema: Schema,
                 row_group_rows: int, bloom_fp_rate: float) -> None:
        self._fileio = fileio
        self._schema = schema
        self._physical = physical_schema(schema)
        self.id = rowset_id
        self.name = rowset_file(rowset_id)
        self._sink = ParquetSink(fileio, self.name, self._physical, row_group_rows,
                                 ROWSET_ENCODINGS)
        self.n = 0
        self._first: tuple[Any, ...] = ()
        self._last: tuple[Any, ...] = ()
        self._ts = (int(LIVE), -1)
        self._min_end: int | None = None
        self._fp_rate = bloom_fp_rate
        self._hashes: list[npt.NDArray[np.uint64]] = []

    def _key(self, piece: pa.Table, i: int) -> tuple[Any, ...]:
        pk = list(self._schema.primary_key)
        row = piece.slice(i, 1).select(pk).to_pylist()[0]
        return tuple(row[k] for k in pk)

    def write(self, piece: pa.Table) -> None:
        m = piece.num_rows
        if not self.n:
            self._first = self._key(piece, 0)
        self._last = self._key(piece, m - 1)
        ts = np.asarray(piece.column(TS_COLUMN).to_numpy(), dtype=np.int64)
        end = np.asarray(piece.column(END_COLUMN).to_numpy(), dtype=np.int64)
        self._ts = (min(self._ts[0], int(ts.min())), max(self._ts[1], int(ts.max())))
        ended = end[end != LIVE]
        if len(ended):
            low = int(ended.min())
            self._min_end = low if self._min_end is None else min(self._min_end, low)
        self._hashes.append(bloom_hashes(piece, self._schema))
        row = pa.array(np.arange(self.n, self.n + m, dtype=np.int64))
        names = self._physical.names[:-1]
        self._sink.write(pa.Table.from_arrays([*(piece.column(c) for c in names), row],
                                              schema=self._physical))
        self.n += m

    def finish(self) -> DiskRowSet:
        size = self._sink.close()
        bloom = BloomFilter.sized(self.n, self._fp_rate)
        bloom.add(np.concatenate(self._hashes) if self._hashes
                  else np.zeros(0, dtype=np.uint64))
        self._hashes = []
        name = bloom_file(self.id)
        write_bloom(self._fileio, name, bloom, bloom_check(self._schema, self._first, bloom.seed))
        meta = RowSetMeta(id=self.id, file=self.name, num_rows=self.n, size_bytes=size,
                          min_key=self._first, max_key=self._last, min_ts=self._ts[0],
                          max_ts=self._ts[1], min_end=self._min_end, bloom=name)
        rowset = DiskRowSet(meta, self._fileio, self._schema)
        rowset.keep_bloom(bloom)
        return rowset

    def abort(self) -> None:
        self._sink.abort()


def write_merged(fileio: FileIO, first_id: int, chunks: Iterable[pa.Table], schema: Schema,
                 row_group_rows: int, target_rows: int,
                 bloom_fp_rate: float = DEFAULT_FP_RATE,
                 id_limit: int | None = None) -> list[DiskRowSet]:
    """Write the sorted ``chunks`` (each of complete keys) as rowsets ``first_id``, ... of
    about ``target_rows`` rows each, cut between keys (module docstring). With
    ``id_limit``, an output that would need id ``id_limit`` or above raises
    :class:`~pyspark_kudu.errors.IllegalStateError` before any file of it is written (the
    ids above were not reserved for this merge)."""
    order = _Order(schema)
    outputs: list[DiskRowSet] = []
    out: _Output | None = None
    next_id = first_id
    try:
        for chunk in chunks:
            while chunk.num_rows:
                if out is None:
                    if id_limit is not None and next_id >= id_limit:
                        raise IllegalStateError(
                            f"a merge needs more than the {id_limit - first_id} rowset ids "
                            f"reserved for it (from {first_id})")
                    out = _Output(fileio, next_id, schema, row_group_rows, bloom_fp_rate)
                    next_id += 1
                need = max(target_rows - out.n, 0)
                cuts = order.boundaries(chunk)
                cuts[0] = out.n > 0  # a chunk starts a key: a cut there if the file has rows
                after = np.nonzero(cuts[need:])[0]
                if not len(after):
                    out.write(chunk)
                    break
                p = need + int(after[0])
                if p:
                    out.write(chunk.slice(0, p))
                outputs.append(out.finish())
                out = None
                chunk = chunk.slice(p)
        if out is not None:
            outputs.append(out.finish())
            out = None
    finally:
        if out is not None:
            out.abort()
    return outputs
