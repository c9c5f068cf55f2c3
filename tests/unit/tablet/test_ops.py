"""The replicated byte form of write batches and its client-side validation."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from pyspark_kudu.consensus.messages import ConfChange, ConfChangeType, encode_conf_change
from pyspark_kudu.errors import CorruptionError, InvalidArgumentError
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import OpType, decode_write_batch, encode_write_batch, is_write_batch

SCHEMA = Schema(
    (
        ColumnSchema("id", "int64", nullable=False),
        ColumnSchema("name", "string", nullable=False),
        ColumnSchema("score", "double", nullable=False, default=0.0),
        ColumnSchema("note", "string"),
    ),
    ("id",),
)


def test_round_trip_keeps_rows_ops_and_schema_types() -> None:
    rows = pa.table({"name": ["a", "b"], "id": pa.array([1, 2], pa.int32())})
    data = encode_write_batch(SCHEMA, [OpType.INSERT, OpType.UPSERT], rows)
    wb = decode_write_batch(data)
    assert wb is not None
    assert wb.ops.tolist() == [OpType.INSERT, OpType.UPSERT]
    assert wb.rows.schema.names == ["id", "name"]  # schema order, cast to schema types
    assert wb.rows.schema.field("id").type == pa.int64()
    assert wb.rows.column("name").to_pylist() == ["a", "b"]


def test_encoding_is_deterministic_and_compressed() -> None:
    rows = pa.table({"id": np.arange(20_000), "name": ["same text"] * 20_000})
    a = encode_write_batch(SCHEMA, OpType.UPSERT, rows)
    assert a == encode_write_batch(SCHEMA, OpType.UPSERT, rows)
    assert len(a) < rows.nbytes / 2  # LZ4: the repeated strings shrink, the ids barely
    assert is_write_batch(a)


def test_entries_encoded_with_zstd_before_lz4_still_decode() -> None:
    # Entries in WALs written before the codec became LZ4 hold zstd buffers.
    rows = pa.table({"id": np.arange(1000), "name": [f"n{i}" for i in range(1000)]})
    lz4 = encode_write_batch(SCHEMA, OpType.INSERT, rows)
    wb = decode_write_batch(lz4)
    assert wb is not None
    batch = pa.RecordBatch.from_arrays(
        [pa.array(wb.ops, pa.int8()), *wb.rows.columns],
        schema=pa.schema([pa.field("__kudu_op", pa.int8(), nullable=False),
                          *wb.rows.schema]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema,
                           options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(batch)
    zstd = lz4[:4] + sink.getvalue().to_pybytes()
    assert zstd != lz4
    old = decode_write_batch(zstd)
    assert old is not None
    assert old.ops.tolist() == wb.ops.tolist()
    assert old.rows.equals(wb.rows)


@pytest.mark.parametrize("data", [
    b"",
    encode_conf_change(ConfChange(ConfChangeType.ADD_VOTER, "n2")),
    json.dumps({"anything": 1}).encode(),
])
def test_non_write_entries_decode_to_none(data: bytes) -> None:
    assert decode_write_batch(data) is None


def test_damaged_write_entry_is_corruption() -> None:
    data = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [1], "name": ["a"]}))
    with pytest.raises(CorruptionError):
        decode_write_batch(data[:-10])


def test_empty_batch_round_trips() -> None:
    rows = pa.table({"id": pa.array([], pa.int64()), "name": pa.array([], pa.string())})
    wb = decode_write_batch(encode_write_batch(SCHEMA, OpType.INSERT, rows))
    assert wb is not None and wb.num_rows == 0


@pytest.mark.parametrize("ops, rows, message", [
    (OpType.INSERT, {"id": [1], "name": ["a"], "bogus": [1]}, "'bogus' is not in the table"),
    (OpType.INSERT, {"name": ["a"]}, "No value provided for key column: id"),
    (OpType.INSERT, {"id": [None], "name": ["a"]}, "'id' is NOT NULL"),
    (OpType.INSERT, {"id": [1]}, "No value provided for required column: name[string NOT NULL]"),
    (OpType.UPSERT, {"id": [1]}, "required column: name"),
    (OpType.INSERT, {"id": [1], "name": [None]}, "row 0: column 'name' is NOT NULL"),
    (OpType.INSERT, {"id": ["x"], "name": ["a"]}, "cannot convert string values to int64"),
    ([1, 2], {"id": [1], "name": ["a"]}, "got 2 operation types for 1 rows"),
    ([9], {"id": [1], "name": ["a"]}, "unknown operation type 9"),
])
def test_invalid_batches_are_rejected_on_the_client(ops: object, rows: dict[str, list[object]],
                                                    message: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        encode_write_batch(SCHEMA, ops, pa.table(rows))  # type: ignore[arg-type]
    assert message in str(e.value)


def test_update_and_delete_need_only_the_key() -> None:
    rows = pa.table({"id": [1, 2]})
    wb = decode_write_batch(encode_write_batch(SCHEMA, [OpType.UPDATE, OpType.DELETE], rows))
    assert wb is not None and wb.rows.schema.names == ["id"]


def test_null_in_not_null_column_is_allowed_on_delete_rows() -> None:
    rows = pa.table({"id": [1, 2], "name": ["a", None]})
    encode_write_batch(SCHEMA, [OpType.INSERT, OpType.DELETE], rows)
    with pytest.raises(InvalidArgumentError):
        encode_write_batch(SCHEMA, [OpType.INSERT, OpType.UPDATE], rows)


def test_record_batch_input_and_per_row_op_arrays_are_accepted() -> None:
    batch = pa.record_batch({"id": [1, 2], "name": ["a", "b"]})
    ops = pa.array([OpType.INSERT, OpType.DELETE_IGNORE], pa.int8())
    wb = decode_write_batch(encode_write_batch(SCHEMA, ops, batch))
    assert wb is not None and wb.ops.tolist() == [1, 7]


def test_package_usage_example_runs(tmp_path: object) -> None:
    import pyspark_kudu.tablet as pkg

    doc = pkg.__doc__ or ""
    block = doc.split("Usage::", 1)[1].split("\n\n", 1)[1].split("\n\nThe package", 1)[0]
    code = "\n".join(line[4:] for line in block.splitlines())
    exec(code.replace('"/data/ts1"', repr(str(tmp_path))), {})


def test_key_order_sorts_rows_stably_by_key_and_keeps_each_rows_op() -> None:
    """What a writer encodes: rows in primary-key order, the operations on one key in their
    original order (an insert then a delete of one key stays that), each row with its op."""
    composite = Schema((ColumnSchema("h", "string", nullable=False),
                        ColumnSchema("n", "int32", nullable=False),
                        ColumnSchema("v", "int64")), ("h", "n"))
    h = ["b", "a", "b", "a", "a", "c"]
    n = [2, 9, 1, 9, 3, 0]
    v = [0, 1, 2, 3, 4, 5]
    ops = [OpType.UPSERT, OpType.INSERT, OpType.UPSERT, OpType.DELETE, OpType.UPSERT,
           OpType.UPSERT]
    wb = decode_write_batch(encode_write_batch(
        composite, ops, pa.table({"h": h, "n": pa.array(n, pa.int32()), "v": v}),
        key_order=True))
    assert wb is not None
    got = list(zip(wb.rows.column("h").to_pylist(), wb.rows.column("n").to_pylist(),
                   wb.rows.column("v").to_pylist(), wb.ops.tolist(), strict=True))
    assert got == [("a", 3, 4, OpType.UPSERT), ("a", 9, 1, OpType.INSERT),
                   ("a", 9, 3, OpType.DELETE), ("b", 1, 2, OpType.UPSERT),
                   ("b", 2, 0, OpType.UPSERT), ("c", 0, 5, OpType.UPSERT)]
    # One integer key: sorted by value (stably); rows in order already are left as they are.
    ids = np.array([5, 3, 5, 1], dtype=np.int64)
    wb = decode_write_batch(encode_write_batch(
        SCHEMA, OpType.UPSERT, pa.table({"id": ids, "name": ["p", "q", "r", "s"]}),
        key_order=True))
    assert wb is not None
    assert wb.rows.column("id").to_pylist() == [1, 3, 5, 5]
    assert wb.rows.column("name").to_pylist() == ["s", "q", "p", "r"]
    ordered = pa.table({"id": np.arange(10), "name": [str(i) for i in range(10)]})
    assert (encode_write_batch(SCHEMA, OpType.UPSERT, ordered, key_order=True)
            == encode_write_batch(SCHEMA, OpType.UPSERT, ordered))


def test_key_order_validates_before_sorting() -> None:
    """A null key is named at the row the caller gave, not where a sort would put it."""
    with pytest.raises(InvalidArgumentError, match="row 1: column 'id' is NOT NULL"):
        encode_write_batch(SCHEMA, OpType.UPSERT,
                           pa.table({"id": [7, None, 3], "name": ["a", "b", "c"]}),
                           key_order=True)
