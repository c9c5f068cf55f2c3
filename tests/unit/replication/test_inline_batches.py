"""The small-write path's staging: a task whose encoded batches fit ``small_write_bytes``
returns them inline and writes no file; past that size every batch is staged as a file
(pyspark_kudu.spark.host.dataplane.stage_batches)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host.dataplane import (
    InlineBatch,
    StagedRef,
    decode_staged,
    read_staged,
    stage_batches,
)
from pyspark_kudu.tablet import OpType, decode_write_batch

SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
HASHED = Partitioner(SCHEMA, PartitionSchema((HashDimension(("id",), 3),)))


def _stage(root: Path, n: int, small_write_bytes: int, max_rows: int = 1000
           ) -> list[StagedRef | InlineBatch]:
    fn = stage_batches(SCHEMA, HASHED, OpType.UPSERT, "w", str(root), max_rows,
                       small_write_bytes)
    batch = pa.RecordBatch.from_pydict({"id": list(range(n)),
                                        "v": [f"value-{i:08d}" for i in range(n)]})
    out = []
    for rb in fn(iter([batch])):
        for raw in rb.column(0).to_pylist():
            item = decode_staged(raw)
            assert item is not None, raw[:16]
            out.append(item)
    return out


def _files(root: Path) -> list[Path]:
    return [p for p in (root / "staging").rglob("*") if p.is_file()] \
        if (root / "staging").exists() else []


def _ids(items: list[StagedRef | InlineBatch]) -> list[int]:
    ids: list[int] = []
    for item in items:
        data = item.data if isinstance(item, InlineBatch) else read_staged(item)
        assert data is not None
        wb = decode_write_batch(data)
        assert wb is not None
        ids.extend(wb.rows.column("id").to_pylist())
    return sorted(ids)


def test_a_task_under_the_threshold_returns_its_batches_inline_and_writes_no_file(
        tmp_path: Path) -> None:
    items = _stage(tmp_path, 300, small_write_bytes=1 << 20, max_rows=50)
    assert items and all(isinstance(i, InlineBatch) for i in items)
    assert {i.tablet for i in items} == {0, 1, 2}
    assert all(i.op == int(OpType.UPSERT) and 0 < i.rows <= 50 for i in items)
    assert sum(i.rows for i in items) == 300
    assert _ids(items) == list(range(300))
    assert _files(tmp_path) == []


def test_a_task_over_the_threshold_stages_every_batch_held_ones_too(tmp_path: Path) -> None:
    one_batch = len(_stage(tmp_path / "probe", 50, 1 << 20, max_rows=50)[0].data)
    # Room for about two batches: the first ones are held, then the task turns to files.
    items = _stage(tmp_path, 3000, small_write_bytes=2 * one_batch + 10, max_rows=50)
    assert items and all(isinstance(i, StagedRef) for i in items)
    assert len(_files(tmp_path)) == len(items)
    assert _ids(items) == list(range(3000))


def test_zero_always_stages(tmp_path: Path) -> None:
    items = _stage(tmp_path, 3, small_write_bytes=0)
    assert items and all(isinstance(i, StagedRef) for i in items)


@pytest.mark.parametrize("data", [b"", b"\x00" * 40, b"batch-bytes" * 1000])
def test_inline_batches_round_trip_and_are_told_apart_from_refs(data: bytes) -> None:
    b = InlineBatch(data, 7, 2, int(OpType.INSERT))
    assert decode_staged(b.encode()) == b
    assert b.entry_data() == data
    assert StagedRef.decode(b.encode()) is None
    ref = StagedRef("h", "/r", "staging/w/x.bin", 3, 4, 5, 1, int(OpType.INSERT))
    assert decode_staged(ref.encode()) == ref and InlineBatch.decode(ref.encode()) is None
    assert decode_staged(b"not staged") is None


@pytest.mark.parametrize("small_write_bytes", [1 << 20, 0], ids=["inline", "staged"])
def test_every_batch_a_task_encodes_is_in_key_order(tmp_path: Path,
                                                    small_write_bytes: int) -> None:
    """Writers encode each batch sorted by primary key (``encode_write_batch(key_order=
    True)``): the replicas' flush sorts then merge sorted runs instead of sorting rows in
    input order, once per replica."""
    composite = Schema((ColumnSchema("h", "string", nullable=False),
                        ColumnSchema("n", "int64", nullable=False),
                        ColumnSchema("v", "int64")), ("h", "n"))
    fn = stage_batches(composite, Partitioner(composite, PartitionSchema(
        (HashDimension(("n",), 2),))), OpType.UPSERT, "w", str(tmp_path), 100,
        small_write_bytes)
    n = list(range(900, 0, -1))  # descending: the input is not in key order
    batch = pa.RecordBatch.from_pydict({"h": [f"h{i % 5}" for i in n], "n": n, "v": n})
    seen = 0
    for rb in fn(iter([batch])):
        for raw in rb.column(0).to_pylist():
            item = decode_staged(raw)
            assert item is not None
            data = item.data if isinstance(item, InlineBatch) else read_staged(item)
            assert data is not None
            wb = decode_write_batch(data)
            assert wb is not None
            keys = list(zip(wb.rows.column("h").to_pylist(), wb.rows.column("n").to_pylist(),
                            strict=True))
            assert keys == sorted(keys), f"batch of tablet {item.tablet} is not in key order"
            assert wb.rows.column("v").to_pylist() == [k for _, k in keys]  # rows kept whole
            seen += len(keys)
    assert seen == 900
