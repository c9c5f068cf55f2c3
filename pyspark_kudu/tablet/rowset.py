"""Disk rowsets: immutable, PK-sorted Parquet files of row versions, plus their delta files.

A rowset file ``rowsets/<id>.parquet`` holds the schema columns and three internal ones:
``__kudu_ts`` (version begin), ``__kudu_end`` (version end known when the file was written,
:data:`~pyspark_kudu.tablet.keys.LIVE` otherwise) and ``__kudu_row`` (the row's position,
delta-encoded so it costs almost nothing). Rows are sorted by primary key, then ``ts``.
Row groups carry min/max statistics, which scans use for row-group pruning; the superblock
keeps each rowset's min/max key and ts range, which scans and writes use to skip whole files.

Next to it, ``rowsets/<id>.bloom`` holds a bloom filter of the file's keys (:mod:`.bloom`),
which the write path consults before looking keys up. Rowsets written before filters
existed have none (``RowSetMeta.bloom`` is ``None``) and are never pruned that way.

The write path looks keys up in the whole-file key index (:meth:`DiskRowSet.load_index`) or,
for a few keys, in just the row groups whose statistics may hold them
(:meth:`DiskRowSet.point_lookup`, :mod:`.lookup`); both take version ends from the same
place (the file's ``__kudu_end`` with the deltas applied).

Later operations that end a version stored here are **deltas** ``(row, end)``. They are kept in
memory and written at the next flush as ``rowsets/<id>.delta.<flush_index>.parquet``, listed
under the rowset in the superblock (Kudu's REDO delta files, reduced to end timestamps).

Thread-safety: a :class:`DiskRowSet` is shared by the tablet's writer (under the tablet lock)
and by concurrent scans. Scans only read immutable files and arrays copied under the tablet
lock; pin counts are guarded by the rowset's own lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema, values_from_json, values_to_json
from pyspark_kudu.tablet.bloom import BloomFilter, bloom_hashes, read_bloom
from pyspark_kudu.tablet.keys import END_COLUMN, ROW_COLUMN, TS_COLUMN, KeyIndex, key_probe
from pyspark_kudu.tablet.lookup import KeyRanges
from pyspark_kudu.tablet.parquet_files import arrow_filesystem, physical_schema, read_delta_file

__all__ = [
    "DeltaFileMeta",
    "DiskRowSet",
    "RowSetMeta",
    "bloom_check",
    "bloom_file",
    "delta_file",
    "rowset_file",
]

_log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class DeltaFileMeta:
    file: str
    rows: int
    min_end: int

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "rows": self.rows, "min_end": self.min_end}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeltaFileMeta:
        return cls(str(d["file"]), int(d["rows"]), int(d["min_end"]))


@dataclass(frozen=True)
class RowSetMeta:
    """A rowset as recorded in the superblock; enough to prune without opening the file."""

    id: int
    file: str
    num_rows: int
    size_bytes: int
    min_key: tuple[Any, ...]
    max_key: tuple[Any, ...]
    min_ts: int
    max_ts: int
    min_end: int | None  # smallest non-LIVE end stored in the file; None if all were live
    deltas: tuple[DeltaFileMeta, ...] = field(default=())
    bloom: str | None = None  # the bloom filter file; None for rowsets written without one

    def files(self) -> list[str]:
        """Every file of the rowset: what a copy carries and a retirement deletes."""
        blooms = [] if self.bloom is None else [self.bloom]
        return [self.file, *blooms] + [d.file for d in self.deltas]

    def to_dict(self, schema: Schema) -> dict[str, Any]:
        return {
            "id": self.id, "file": self.file, "rows": self.num_rows, "bytes": self.size_bytes,
            "min_key": _key_to_json(schema, self.min_key),
            "max_key": _key_to_json(schema, self.max_key),
            "min_ts": self.min_ts, "max_ts": self.max_ts, "min_end": self.min_end,
            "deltas": [d.to_dict() for d in self.deltas],
            # Absent rather than null without a filter: such a rowset's entry stays as old
            # builds wrote it (and old builds ignore the field; they delete the file as an
            # orphan on open, and then run without filters).
            **({} if self.bloom is None else {"bloom": self.bloom}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], schema: Schema) -> RowSetMeta:
        return cls(int(d["id"]), str(d["file"]), int(d["rows"]), int(d["bytes"]),
                   _key_from_json(schema, d["min_key"]), _key_from_json(schema, d["max_key"]),
                   int(d["min_ts"]), int(d["max_ts"]),
                   None if d.get("min_end") is None else int(d["min_end"]),
                   tuple(DeltaFileMeta.from_dict(x) for x in d.get("deltas", ())),
                   None if d.get("bloom") is None else str(d["bloom"]))


def _key_to_json(schema: Schema, key: tuple[Any, ...]) -> list[Any]:
    return [values_to_json(c.type, [v])[0] for c, v in zip(schema.key_columns, key, strict=True)]


def _key_from_json(schema: Schema, values: list[Any]) -> tuple[Any, ...]:
    return tuple(values_from_json(c.type, [v])[0].as_py()
                 for c, v in zip(schema.key_columns, values, strict=True))


def bloom_check(schema: Schema, key: tuple[Any, ...], seed: int) -> int:
    """The ``check`` value of a rowset's bloom filter file: the filter's hash of ``key``, the
    rowset's first key, taken as the superblock stores it (:mod:`.bloom`)."""
    key = _key_from_json(schema, _key_to_json(schema, key))
    table = pa.table({c.name: pa.array([v], type=c.type)
                      for c, v in zip(schema.key_columns, key, strict=True)})
    return int(bloom_hashes(table, schema, seed)[0])


class DiskRowSet:
    """Runtime state of one rowset: its metadata, deltas, lazy key index and bloom filter,
    and scan pins."""

    def __init__(self, meta: RowSetMeta, fileio: FileIO, schema: Schema) -> None:
        self.meta = meta
        self._fileio = fileio
        self._schema = schema
        self._delta_rows: list[I64] = []
        self._delta_ends: list[I64] = []
        self._pending_rows: list[I64] = []
        self._pending_ends: list[I64] = []
        self.index: KeyIndex | None = None
        self._index_source: tuple[pa.Table, I64, I64] | None = None
        self._bloom: BloomFilter | None = None
        self.bloom_error: str | None = None  # why the bloom file was refused, if it was
        self._fragment: ds.ParquetFileFragment | None = None
        self._key_ranges: KeyRanges | None = None
        self._footer: pq.FileMetaData | None = None  # read with the key ranges, then kept
        self._pins = 0
        self._retired: Callable[[], None] | None = None
        #: How many times a write ended versions here (tablet lock held): a compaction merged
        #: without the lock commits only if this did not move meanwhile.
        self.changes = 0
        self._pin_lock = threading.Lock()

    # -- deltas -------------------------------------------------------------------------
    def load_deltas(self) -> int:
        """Read the delta files listed in the metadata; returns how many were read."""
        for d in self.meta.deltas:
            rows, ends = read_delta_file(self._fileio, d.file)
            self._delta_rows.append(rows)
            self._delta_ends.append(ends)
        return len(self.meta.deltas)

    def end_versions(self, rows: I64, ts: int) -> None:
        """Record that the versions at ``rows`` were replaced or deleted at ``ts``."""
        self.changes += 1
        if self.index is not None:
            self.index.set_end(rows, ts)
        ends = np.full(len(rows), ts, dtype=np.int64)
        rows = np.array(rows, dtype=np.int64)
        self._delta_rows.append(rows)
        self._delta_ends.append(ends)
        self._pending_rows.append(rows)
        self._pending_ends.append(ends)

    def has_pending(self) -> bool:
        return bool(self._pending_rows)

    def pending(self) -> tuple[I64, I64]:
        return np.concatenate(self._pending_rows), np.concatenate(self._pending_ends)

    def persisted(self, delta: DeltaFileMeta) -> None:
        """The pending deltas were written as ``delta`` and the superblock lists it."""
        self.meta = replace(self.meta, deltas=(*self.meta.deltas, delta))
        self._pending_rows.clear()
        self._pending_ends.clear()

    def deltas(self) -> tuple[I64, I64]:
        if not self._delta_rows:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        if len(self._delta_rows) > 1:
            self._delta_rows = [np.concatenate(self._delta_rows)]
            self._delta_ends = [np.concatenate(self._delta_ends)]
        return self._delta_rows[0], self._delta_ends[0]

    def _with_deltas(self, file_end: I64, rows: I64 | None = None) -> I64:
        """The ``end`` of versions: ``file_end`` (their ``__kudu_end`` column) with every
        delta recorded since applied, pending ones included. ``file_end`` is of every row in
        order (``rows=None``), or of the rows at positions ``rows`` (``-1`` for none).

        Both the key index and point lookups take their ends from here, so a version ended
        while the index was not in memory is ended in the index built later."""
        end = np.array(file_end, dtype=np.int64)  # private copy: the index updates it in place
        d_rows, d_ends = self.deltas()
        if rows is None:
            end[d_rows] = d_ends
        elif len(d_rows) and len(rows):
            sel = np.isin(d_rows, rows)
            order = np.argsort(rows, kind="stable")
            at = order[np.searchsorted(rows[order], d_rows[sel])]
            end[at] = d_ends[sel]  # in delta order, as above: a later delta wins
        return end

    def dead_rows(self, snapshot: int) -> I64:
        """Rows whose version a delta ended at or before ``snapshot``."""
        rows, ends = self.deltas()
        return rows[ends <= snapshot]

    # -- reading ------------------------------------------------------------------------
    def fragment(self) -> ds.ParquetFileFragment:
        if self._fragment is None:
            fs, path = arrow_filesystem(self._fileio, self.meta.file)
            self._fragment = ds.ParquetFileFormat().make_fragment(
                path, filesystem=fs, file_size=self.meta.size_bytes)
        return self._fragment

    def open_fragment(self) -> tuple[ds.ParquetFileFragment, pa.NativeFile | None]:
        """A fragment over the file opened *now*, and the open file (close it when done).

        A local file stays readable through its descriptor after another process deleted it
        (a compaction there), so a scan planned under the replica's lock can stream after
        releasing it. Non-local roots give the path-based fragment and no file."""
        if not self._fileio.is_local:
            return self.fragment(), None
        f = pa.OSFile(self._fileio.local_path(self.meta.file))
        try:
            return ds.ParquetFileFormat().make_fragment(f), f
        except BaseException:
            f.close()
            raise

    def read_all(self, columns: Sequence[str] | None = None) -> pa.Table:
        fs, path = arrow_filesystem(self._fileio, self.meta.file)
        return pq.read_table(path, filesystem=fs, columns=None if columns is None
                             else list(columns), schema=physical_schema(self._schema))

    def iter_batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Every column of the file (physical schema), in file order, ``batch_rows`` rows at
        a time: what a streaming compaction reads."""
        fs, path = arrow_filesystem(self._fileio, self.meta.file)
        with fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            yield from pf.iter_batches(batch_size=batch_rows,
                                       columns=physical_schema(self._schema).names,
                                       use_threads=False)

    def read_rows(self, rows: I64, columns: Sequence[str]) -> pa.Table:
        """The given columns of the rows at positions ``rows`` (in that order).

        Reads only the row groups that contain them.
        """
        fs, path = arrow_filesystem(self._fileio, self.meta.file)
        pf = pq.ParquetFile(path, filesystem=fs)
        md = pf.metadata
        sizes = np.array([md.row_group(i).num_rows for i in range(md.num_row_groups)])
        starts = np.concatenate([[0], np.cumsum(sizes)])
        groups = np.unique(np.searchsorted(starts, rows, side="right") - 1)
        table = pf.read_row_groups([int(g) for g in groups], columns=list(columns))
        # Position of each wanted row inside the concatenation of the groups read.
        group_offsets = np.concatenate([[0], np.cumsum(sizes[groups])])
        g_of_row = np.searchsorted(groups, np.searchsorted(starts, rows, side="right") - 1)
        local = rows - starts[groups[g_of_row]] + group_offsets[g_of_row]
        return table.take(pa.array(local, type=pa.int64()))

    def memory_bytes(self) -> int:
        """Memory of this rowset's loaded key index (or of the key columns kept to build it)
        and of its bloom filter: what :meth:`drop_index` releases."""
        size = 0 if self._bloom is None else self._bloom.nbytes
        if self.index is not None:
            return size + self.index.nbytes()
        if self._index_source is not None:
            keys, ts, end = self._index_source
            return size + int(keys.nbytes + ts.nbytes + end.nbytes)
        return size

    def keep_index_source(self, keys: pa.Table, ts: I64, end: I64) -> None:
        """Remember the just-written key columns so the index is built without reading the file
        (lazily: a rowset no later write touches never pays for it)."""
        self._index_source = (keys, ts, end)

    def drop_index(self) -> int:
        """(Under the tablet lock, between entries.) Forget the key index, any kept index
        source and the bloom filter; the next :meth:`load_index` and :meth:`bloom` read
        their files. Returns the bytes released."""
        size = self.memory_bytes()
        self.index = None
        self._index_source = None
        self._bloom = None
        return size

    def keep_bloom(self, bloom: BloomFilter) -> None:
        """Remember the bloom filter just written to :attr:`RowSetMeta.bloom`."""
        self._bloom = bloom

    def bloom(self) -> BloomFilter | None:
        """(Under the tablet lock.) The rowset's bloom filter, read from its file on first use.

        ``None`` when the rowset has none, or its file is damaged, missing or hashed
        differently: that is logged once, and the write path then probes the key index,
        which is exact (:attr:`bloom_error` says why)."""
        if self._bloom is not None or self.meta.bloom is None or self.bloom_error is not None:
            return self._bloom
        try:
            bloom, check = read_bloom(self._fileio, self.meta.bloom)
            if check != bloom_check(self._schema, self.meta.min_key, bloom.seed):
                raise CorruptionError(
                    f"bloom filter {self._fileio.path(self.meta.bloom)} does not hash the"
                    " rowset's first key as it was written (another hash function?)")
        except (CorruptionError, OSError) as e:
            self.bloom_error = str(e)
            _log.warning("rowset %s of %s: its bloom filter is unusable (%s); writes probe"
                         " its key index instead", self.meta.id, self._fileio.root, e)
            return None
        self._bloom = bloom
        return bloom

    def index_needs_io(self) -> bool:
        return self.index is None and self._index_source is None

    def load_index(self) -> KeyIndex:
        """The key index: key columns, ``ts`` and ``end`` (with the deltas applied)."""
        if self.index is None:
            if self._index_source is not None:
                keys, ts, file_end = self._index_source
                self._index_source = None
            else:
                t = self.read_all([*self._schema.primary_key, TS_COLUMN, END_COLUMN])
                keys = t.select(list(self._schema.primary_key))
                ts = np.asarray(t.column(TS_COLUMN).to_numpy(), dtype=np.int64)
                file_end = np.asarray(t.column(END_COLUMN).to_numpy(), dtype=np.int64)
            self.index = KeyIndex(keys, ts, self._with_deltas(file_end), self._schema)
        return self.index

    def key_ranges(self) -> KeyRanges:
        """(Under the tablet lock.) The key range of each row group, from the file's footer
        (read on first use, then kept: a few values per row group, never dropped)."""
        if self._key_ranges is None:
            fs, path = arrow_filesystem(self._fileio, self.meta.file)
            self._footer = pq.ParquetFile(path, filesystem=fs).metadata
            self._key_ranges = KeyRanges(self._footer, self._schema)
        return self._key_ranges

    def point_lookup(self, qkeys: pa.Table, groups: I64) -> tuple[I64, I64, I64]:
        """``(row, ts, end)`` of the newest version of each key of ``qkeys`` (``row = -1``,
        ``ts = end = -1`` where the rowset has none), reading only the key, ``ts``, ``end``
        and row-number columns of row ``groups``, which must include every group that may
        hold one of the keys (:meth:`KeyRanges.groups_for`). Nothing read is kept."""
        q = qkeys.num_rows
        rows = np.full(q, -1, dtype=np.int64)
        ts = np.full(q, -1, dtype=np.int64)
        if len(groups) == 0:
            return rows, ts, ts.copy()
        pk = list(self._schema.primary_key)
        fs, path = arrow_filesystem(self._fileio, self.meta.file)
        # The footer key_ranges() read (the groups come from it): not read again per lookup.
        t = pq.ParquetFile(path, filesystem=fs, metadata=self._footer).read_row_groups(
            [int(g) for g in groups], columns=[*pk, TS_COLUMN, END_COLUMN, ROW_COLUMN],
            use_threads=False)
        keys = t.select(pk)
        want = pa.schema([self._schema.arrow_schema.field(k) for k in pk])
        if keys.schema != want:
            keys = keys.cast(want)
        # Groups in file order are still sorted by key, then ts: a KeyIndex over them finds
        # the last, i.e. newest, version of each key among the rows read -- all of its rows.
        read_ts, read_end, read_row = (np.asarray(t.column(c).to_numpy(), dtype=np.int64)
                                       for c in (TS_COLUMN, END_COLUMN, ROW_COLUMN))
        local = KeyIndex(keys, read_ts, read_end, self._schema).latest(
            qkeys, key_probe(qkeys, self._schema))
        found = local >= 0
        rows[found] = read_row[local[found]]
        ts[found] = read_ts[local[found]]
        file_end = np.full(q, -1, dtype=np.int64)
        file_end[found] = read_end[local[found]]
        return rows, ts, self._with_deltas(file_end, rows)

    # -- pins ---------------------------------------------------------------------------
    def pin(self) -> None:
        with self._pin_lock:
            self._pins += 1

    def unpin(self) -> None:
        with self._pin_lock:
            self._pins -= 1
            run = self._retired if self._pins == 0 else None
            if run is not None:
                self._retired = None
        if run is not None:
            run()

    def retire(self, delete_files: Callable[[], None]) -> None:
        """The rowset left the superblock: delete its files now, or when the last scan ends."""
        with self._pin_lock:
            if self._pins > 0:
                self._retired = delete_files
                return
        delete_files()


def rowset_file(rowset_id: int) -> str:
    return f"rowsets/{rowset_id:08d}.parquet"


def bloom_file(rowset_id: int) -> str:
    return f"rowsets/{rowset_id:08d}.bloom"


def delta_file(rowset_id: int, flush_index: int) -> str:
    return f"rowsets/{rowset_id:08d}.delta.{flush_index:012d}.parquet"
