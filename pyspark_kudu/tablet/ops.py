"""Row operations: the replicated byte form of a write batch, and per-row results.

A write batch is one Arrow record batch plus an operation per row. The client encodes it
**once** (:func:`encode_write_batch`) and that exact byte string is the data of the Raft log
entry every replica applies (DESIGN §3). Layout::

    b"KWB1" + Arrow IPC stream (LZ4-frame-compressed buffers) of one record batch whose
    first column is ``__kudu_op`` (int8, an :class:`OpType`) followed by the supplied table
    columns in schema order, already cast to the schema's types.

LZ4, as Kudu's WAL (``--log_compression_codec``): a batch is encoded once but decoded by
every replica, and at 65,536 rows of the benchmarks' 5-column table LZ4 encodes in ~6 ms and
decodes in ~3 ms where zstd took ~30-60 ms and ~12-20 ms, for 2.9x the bytes (1.1 MB instead
of 0.38 MB; the disk and loopback move those in well under a millisecond). Entries written
with zstd still decode: Arrow IPC names the codec in every message.

Anything not starting with the magic (an empty no-op entry, a JSON configuration change) is
not a write: :func:`decode_write_batch` returns ``None`` and replicas skip the entry.

Column rules are Kudu's and are checked at encode time, on the client, so replicas never
disagree about validity: key columns must be present and non-null; a column absent from the
batch takes its default (or null) on INSERT, and keeps its old value on UPDATE and on the update
path of UPSERT; a non-null column without a default must be supplied when the batch has
INSERT or UPSERT rows; DELETE rows only need the key. Nulls in a present column *set* null.

Values are converted to the column's type only within a family, with overflow and precision
checks (``safe`` casts): numbers (integers, floats, decimals) to numbers, strings to strings,
binaries to binaries, dates to dates, timestamps to timestamps (any unit or time zone), and
an all-null column to anything. A string is never parsed into a number or a date, nor a
number formatted into a string: a DataFrame whose column has the wrong type is refused,
naming the column, instead of being accepted or refused depending on its values.

Thread-safety: all functions are pure; the dataclasses are immutable.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.schema import (
    ARROW_CAST_ERRORS,
    RESERVED_PREFIX,
    Schema,
    type_family,
    type_to_str,
)
from pyspark_kudu.tablet.keys import is_exact_probe, key_probe, sort_order, stable_order

__all__ = [
    "MAGIC",
    "OP_COLUMN",
    "OpType",
    "RowError",
    "WriteBatch",
    "WriteResult",
    "decode_write_batch",
    "encode_write_batch",
    "is_write_batch",
]

MAGIC = b"KWB1"
OP_COLUMN = RESERVED_PREFIX + "op"


class OpType(enum.IntEnum):
    """Kudu's write operation types (``kudu.operation`` names in lower case)."""

    INSERT = 1
    INSERT_IGNORE = 2
    UPSERT = 3
    UPDATE = 4
    UPDATE_IGNORE = 5
    DELETE = 6
    DELETE_IGNORE = 7


_WRITES_VALUES = (OpType.INSERT, OpType.INSERT_IGNORE, OpType.UPSERT, OpType.UPDATE,
                  OpType.UPDATE_IGNORE)
_MAY_INSERT = (OpType.INSERT, OpType.INSERT_IGNORE, OpType.UPSERT)


@dataclass(frozen=True)
class WriteBatch:
    """A decoded batch: ``ops[i]`` (int8 codes of :class:`OpType`) applies to row ``i``."""

    ops: npt.NDArray[np.int8]
    rows: pa.RecordBatch

    @property
    def num_rows(self) -> int:
        return int(self.rows.num_rows)


@dataclass(frozen=True)
class RowError:
    """A row the replica rejected. ``status`` is Kudu's status name, ``row`` the batch row
    (``-1`` when the whole entry was rejected because it could not be decoded) and ``key``
    its primary key columns, so a client that never held the rows can name them."""

    row: int
    status: str
    message: str
    key: dict[str, Any] | None = None


@dataclass(frozen=True)
class WriteResult:
    """Outcome of applying one log entry; identical on every replica applying that entry.

    ``index`` is the entry's Raft index, which is also the MVCC timestamp of its rows: a scan
    at ``snapshot >= index`` sees them (read-your-writes). ``skipped`` is true for entries that
    are not writes or were already applied; ``errors`` are sorted by row.
    """

    index: int
    num_rows: int = 0
    errors: tuple[RowError, ...] = ()
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors


def is_write_batch(data: bytes) -> bool:
    return data[: len(MAGIC)] == MAGIC


def _ops_array(ops: OpType | int | Sequence[int] | npt.NDArray[np.integer] | pa.Array,
               n: int) -> npt.NDArray[np.int8]:
    if isinstance(ops, (OpType, int)):
        arr = np.full(n, int(ops), dtype=np.int64)
    elif isinstance(ops, pa.Array):
        if ops.null_count:
            raise InvalidArgumentError("operation types may not be null; give one per row")
        arr = np.asarray(ops.to_numpy(zero_copy_only=False), dtype=np.int64)
    else:
        arr = np.asarray([int(o) for o in ops] if not isinstance(ops, np.ndarray) else ops,
                         dtype=np.int64)
    if arr.shape != (n,):
        raise InvalidArgumentError(
            f"got {arr.size} operation types for {n} rows; give one per row or a single type"
        )
    bad = (arr < OpType.INSERT) | (arr > OpType.DELETE_IGNORE)
    if bad.any():
        raise InvalidArgumentError(
            f"unknown operation type {int(arr[bad][0])} at row {int(np.argmax(bad))}; use"
            " pyspark_kudu.tablet.OpType"
        )
    return arr.astype(np.int8)


def encode_write_batch(schema: Schema,
                       ops: OpType | int | Sequence[int] | npt.NDArray[np.integer] | pa.Array,
                       rows: pa.RecordBatch | pa.Table, *, key_order: bool = False) -> bytes:
    """Validate ``rows`` against ``schema`` and encode them with their operations.

    ``ops`` is one :class:`OpType` for all rows or one per row. ``key_order``: encode the
    rows sorted by primary key (stably: the operations on one key keep their order), which
    is what a writer asks for: every replica flushes its MemRowSet as a sorted rowset, and
    batches already in key order make that sort a merge of sorted runs (3-4x cheaper for
    composite keys, measured), so one sort in the writer saves one in each replica. Row
    errors name their row's key, so they stay exact.

    Raises:
        InvalidArgumentError: unknown or duplicate column, missing or null key column, a value
            that does not convert to the column's type, a null in a non-null column of a row
            that writes values, or a missing required column for INSERT/UPSERT rows.
    """
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    n = table.num_rows
    op_arr = _ops_array(ops, n)
    names = table.column_names
    if len(set(names)) != len(names):
        dup = next(c for c in names if names.count(c) > 1)
        raise InvalidArgumentError(f"column {dup!r} appears twice in the batch; keep one")
    for c in names:
        if not schema.has_column(c):
            raise InvalidArgumentError(
                f"batch column {c!r} is not in the table schema {schema.names}; drop or rename it"
            )
    writes_values = np.isin(op_arr, np.array(_WRITES_VALUES, dtype=np.int8))
    may_insert = bool(np.isin(op_arr, np.array(_MAY_INSERT, dtype=np.int8)).any())
    arrays: list[pa.Array] = [pa.array(op_arr, type=pa.int8())]
    fields: list[pa.Field] = [pa.field(OP_COLUMN, pa.int8(), nullable=False)]
    for col in schema.columns:
        if col.name not in names:
            if schema.is_key(col.name):
                raise InvalidArgumentError(
                    f"No value provided for key column: {col.name} — every row needs the full"
                    f" primary key {list(schema.primary_key)}"
                )
            if may_insert and not col.nullable and not col.has_default:
                raise InvalidArgumentError(
                    f"No value provided for required column: {col.name}[{type_to_str(col.type)}"
                    " NOT NULL]; supply it for INSERT/UPSERT rows or give the column a default"
                )
            continue
        arr = table.column(col.name).combine_chunks()
        if arr.type != col.type:
            if type_family(arr.type) != type_family(col.type) and not pa.types.is_null(arr.type):
                raise InvalidArgumentError(
                    f"column {col.name!r}: cannot convert {arr.type} values to"
                    f" {type_to_str(col.type)}: the table stores {type_family(col.type)} values"
                    f" here, the batch has {type_family(arr.type)} values; cast the data first"
                )
            try:
                arr = arr.cast(col.type, safe=True)
            except ARROW_CAST_ERRORS as e:
                raise InvalidArgumentError(
                    f"column {col.name!r}: cannot convert {arr.type} values to"
                    f" {type_to_str(col.type)} ({e}); cast the data first"
                ) from e
        if arr.null_count:
            nulls = ~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            bad = nulls if schema.is_key(col.name) else (nulls & writes_values)
            if not col.nullable and bad.any():
                row = int(np.argmax(bad))
                raise InvalidArgumentError(
                    f"row {row}: column {col.name!r} is NOT NULL but the value is null; supply"
                    " a value"
                )
        arrays.append(arr)
        fields.append(col.arrow_field())
    batch = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
    if key_order:
        batch = _in_key_order(batch, schema)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return MAGIC + bytes(sink.getvalue().to_pybytes())


def _in_key_order(batch: pa.RecordBatch, schema: Schema) -> pa.RecordBatch:
    """``batch`` stably sorted by its primary key columns (validated: present, not null)."""
    if batch.num_rows < 2:
        return batch
    if is_exact_probe(schema):
        key = key_probe(batch, schema)
        if bool(np.all(key[1:] >= key[:-1])):
            return batch  # in order already (e.g. sequential ids)
        return batch.take(pa.array(stable_order(key)))
    return batch.take(pa.array(sort_order(batch, schema.primary_key)))


def decode_write_batch(data: bytes) -> WriteBatch | None:
    """The batch encoded in ``data``, or ``None`` if the entry is not a write.

    Raises:
        CorruptionError: the data starts like a write batch but cannot be decoded.
    """
    if not is_write_batch(data):
        return None
    from pyspark_kudu.errors import CorruptionError

    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data)[len(MAGIC):])
        table = reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError) as e:
        raise CorruptionError(f"write batch entry of {len(data)} bytes is malformed: {e}") from e
    if table.num_columns == 0 or table.column_names[0] != OP_COLUMN:
        raise CorruptionError(f"write batch entry lacks its {OP_COLUMN} column")
    batches = table.combine_chunks().to_batches()
    batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    ops = np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.int8)
    rows = pa.RecordBatch.from_arrays(batch.columns[1:], schema=pa.schema(list(batch.schema)[1:]))
    return WriteBatch(ops, rows)
