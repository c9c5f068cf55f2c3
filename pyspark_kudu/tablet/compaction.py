"""Turning versions into rowset files: the data side of flush and compaction.

Both produce PK-sorted rowsets from a set of versions and drop what no permitted snapshot can
see:

- a version with ``end <= begin`` was replaced within the same log entry (an INSERT and an
  UPDATE of one key in one batch) and is visible at no snapshot;
- a version with ``end <= H`` is invisible at every snapshot ``>= H``, where ``H`` is the
  history-retention index (the tablet's ancient history mark). Live versions are always kept.

A flush drops only what the current mark allows; a compaction may raise the mark first and
then merges its input rowsets, resolving their deltas into the ``__kudu_end`` column of the
output, so the output needs no delta files. Splitting a large output happens at key
boundaries, so all versions of one key stay in one file and key ranges do not overlap.

Compaction streams (:mod:`.merge`): a k-way merge holds about two batches per input, and
outputs are written row group by row group, so its memory is bounded by the batch size and
the number of inputs, not by the rowsets' sizes.

Thread-safety: pure functions over their arguments; file writes go to new names only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.bloom import DEFAULT_FP_RATE, BloomFilter, bloom_hashes, write_bloom
from pyspark_kudu.tablet.keys import (
    END_COLUMN,
    LIVE,
    ROW_COLUMN,
    TS_COLUMN,
    is_exact_probe,
    key_probe,
    probe_hashes,
    sort_order,
    stable_order,
)
from pyspark_kudu.tablet.parquet_files import write_parquet
from pyspark_kudu.tablet.rowset import (
    DiskRowSet,
    RowSetMeta,
    bloom_check,
    bloom_file,
    rowset_file,
)

__all__ = [
    "ROWSET_ENCODINGS",
    "kept_versions",
    "prepare_versions",
    "sort_versions",
    "take_rows",
    "write_rowset",
]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
#: Column encodings of every rowset file (flush and compaction outputs alike).
ROWSET_ENCODINGS = {ROW_COLUMN: "DELTA_BINARY_PACKED"}


def sort_versions(table: pa.Table, schema: Schema) -> pa.Table:
    """Sort by key, then ts. Inputs list the versions of one key in ts order (apply order,
    or an already sorted rowset), so a stable sort by key alone suffices for integer keys."""
    if is_exact_probe(schema) and table.num_rows:
        key = key_probe(table, schema)
        if bool(np.all(key[1:] > key[:-1])):
            return table  # strictly increasing keys (sequential inserts): already sorted
        if bool(np.all(np.diff(table.column(TS_COLUMN).to_numpy()) >= 0)):
            return take_rows(table, stable_order(key))
    return take_rows(table, sort_order(table, [*schema.primary_key, TS_COLUMN]))


def take_rows(table: pa.Table, rows: I64) -> pa.Table:
    """``table.take(rows)`` column by column, which on a table of many chunks (a
    MemRowSet's batches) is faster than the table's own ``take``."""
    idx = pa.array(rows, type=pa.int64())
    return pa.Table.from_arrays([c.take(idx) for c in table.columns], schema=table.schema)


def kept_versions(begin: I64, end: I64, history_mark: int) -> npt.NDArray[np.bool_]:
    """Which MemRowSet versions a flush writes: ended after they began (not replaced within
    their own entry) and after the ancient history mark."""
    return np.asarray((end > begin) & (end > history_mark))


def prepare_versions(schema: Schema, table: pa.Table, begin: I64, end: I64,
                     history_mark: int, order: I64 | None = None) -> pa.Table:
    """MemRowSet versions (schema columns) -> sorted table with ``ts``/``end`` columns.
    ``order``: the versions' (key, ts) order if known (:meth:`.MemRowSet.key_order`)."""
    keep = kept_versions(begin, end, history_mark)
    table = table.select(schema.names)
    if order is not None:
        order = order[keep[order]]
        if len(order) != table.num_rows or bool(np.any(order[1:] < order[:-1])):
            table = take_rows(table, order)  # (else in order already: sequential keys)
        table = table.append_column(pa.field(TS_COLUMN, pa.int64(), nullable=False),
                                    pa.array(begin[order], type=pa.int64()))
        return table.append_column(pa.field(END_COLUMN, pa.int64(), nullable=False),
                                   pa.array(end[order], type=pa.int64()))
    if not keep.all():
        table = table.filter(pa.array(keep))
    table = table.append_column(pa.field(TS_COLUMN, pa.int64(), nullable=False),
                                pa.array(begin[keep], type=pa.int64()))
    table = table.append_column(pa.field(END_COLUMN, pa.int64(), nullable=False),
                                pa.array(end[keep], type=pa.int64()))
    return sort_versions(table, schema)


def write_rowset(fileio: FileIO, rowset_id: int, table: pa.Table, schema: Schema,
                 row_group_rows: int, bloom_fp_rate: float = DEFAULT_FP_RATE,
                 key_hashes: U64 | None = None) -> DiskRowSet:
    """Write a sorted ``(schema columns, ts, end)`` table as rowset ``rowset_id``: its
    Parquet file and its bloom filter. ``key_hashes``: the rows' ``keys.key_hash`` (at
    ``keys.INDEX_SEED``), in any order (a filter is a set), if the caller has them (a
    MemRowSet's index probes): the filter is built from them instead of hashing again."""
    n = table.num_rows
    table = table.append_column(pa.field(ROW_COLUMN, pa.int64(), nullable=False),
                                pa.array(np.arange(n, dtype=np.int64)))
    name = rowset_file(rowset_id)
    size = write_parquet(fileio, name, table, row_group_rows, ROWSET_ENCODINGS)
    ts = np.asarray(table.column(TS_COLUMN).to_numpy(), dtype=np.int64)
    end = np.array(table.column(END_COLUMN).to_numpy(), dtype=np.int64)
    pk = list(schema.primary_key)
    first = table.slice(0, 1).select(pk).to_pylist()[0]
    last = table.slice(n - 1, 1).select(pk).to_pylist()[0]
    ended = end[end != LIVE]
    min_key = tuple(first[k] for k in pk)
    bloom = BloomFilter.sized(n, bloom_fp_rate)
    hashes = None if key_hashes is None else probe_hashes(key_hashes, schema, bloom.seed)
    bloom.add(bloom_hashes(table, schema, bloom.seed) if hashes is None else hashes)
    bloom_name = bloom_file(rowset_id)
    write_bloom(fileio, bloom_name, bloom, bloom_check(schema, min_key, bloom.seed))
    meta = RowSetMeta(
        id=rowset_id, file=name, num_rows=n, size_bytes=size,
        min_key=min_key, max_key=tuple(last[k] for k in pk),
        min_ts=int(ts.min()), max_ts=int(ts.max()),
        min_end=int(ended.min()) if len(ended) else None, bloom=bloom_name,
    )
    rowset = DiskRowSet(meta, fileio, schema)
    rowset.keep_index_source(table.select(pk), ts, end)
    rowset.keep_bloom(bloom)
    return rowset
