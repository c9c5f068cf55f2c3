"""Tablet copy as a chunk stream, installation on an empty root, and log GC."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import CorruptionError, IllegalStateError, InvalidArgumentError
from pyspark_kudu.tablet import (
    CopyChunk,
    LogRecord,
    MemoryLog,
    OpType,
    Tablet,
    TabletCopySource,
    TabletOptions,
    encode_write_batch,
    install_tablet_copy,
)

from .workload import SCHEMA

OPTIONS = TabletOptions(flush_threshold_bytes=0, row_group_rows=16)


def _write(tablet: Tablet, log: MemoryLog, index: int, op: OpType, ids: list[int]) -> None:
    data = encode_write_batch(SCHEMA, op, pa.table({"id": ids, "v": [i * index for i in ids]}))
    log.append((index, data, 3))
    assert tablet.apply(index, data).ok


@pytest.fixture
def source(tmp_path: Path, no_fsync: None) -> tuple[Tablet, MemoryLog]:
    log = MemoryLog()
    t = Tablet.create(str(tmp_path / "src"), "tab", SCHEMA, log=log, options=OPTIONS)
    _write(t, log, 1, OpType.INSERT, list(range(100)))
    t.flush()
    _write(t, log, 2, OpType.UPSERT, list(range(50, 150)))
    _write(t, log, 3, OpType.DELETE, list(range(0, 100, 3)))
    t.flush()
    _write(t, log, 4, OpType.UPDATE, list(range(1, 100, 3)))  # stays in the MemRowSet
    conf = b'{"ctx":"","node":"n4","type":"add_learner"}'
    log.append(LogRecord(5, conf, 3, "conf_change"))
    t.apply(5, conf)
    return t, log


def rows_at(t: Tablet, snap: int) -> list[dict[str, object]]:
    return sorted(t.scan_table(snapshot=snap).to_pylist(), key=lambda r: r["id"])  # type: ignore[arg-type,return-value]


def test_installed_copy_is_indistinguishable_from_the_source(
        tmp_path: Path, source: tuple[Tablet, MemoryLog]) -> None:
    src, _ = source
    target_log = MemoryLog()
    with TabletCopySource(src, chunk_bytes=1000) as copy:
        chunks = [CopyChunk.from_bytes(c.to_bytes()) for c in copy.chunks()]  # over the wire
        assert copy.index == 5
    sb = install_tablet_copy(str(tmp_path / "dst"), chunks, target_log.append)
    assert sb.last_flushed_index == 3
    assert [(r.index, r.term, r.entry_type) for r in target_log.read_from(1)] == [
        (4, 3, "normal"), (5, 3, "conf_change")]
    dst = Tablet.open(str(tmp_path / "dst"), "tab", log=target_log)
    assert dst.applied_index == src.applied_index
    assert dst.rowsets == src.rowsets
    for snap in range(0, 6):
        assert rows_at(dst, snap) == rows_at(src, snap)


def test_copy_stays_consistent_while_the_source_writes_and_compacts(
        tmp_path: Path, source: tuple[Tablet, MemoryLog]) -> None:
    src, log = source
    with TabletCopySource(src, chunk_bytes=512) as copy:
        stream = copy.chunks()
        head = [next(stream) for _ in range(3)]
        expected = {snap: rows_at(src, snap) for snap in range(0, 6)}
        _write(src, log, 6, OpType.UPSERT, [7, 8])
        src.compact(history_retention_index=6)
        assert src.gc_log() <= 3  # the copy's anchor keeps the tail it still has to send
        chunks = head + list(stream)
    target_log = MemoryLog()
    install_tablet_copy(str(tmp_path / "dst"), chunks, target_log.append)
    dst = Tablet.open(str(tmp_path / "dst"), "tab", log=target_log)
    assert dst.applied_index == 5
    for snap, rows in expected.items():
        assert rows_at(dst, snap) == rows
    assert src.gc_log() == 6  # anchor released with the copy


def test_install_refuses_a_root_that_already_has_the_tablet(
        tmp_path: Path, source: tuple[Tablet, MemoryLog]) -> None:
    src, _ = source
    with TabletCopySource(src) as copy, pytest.raises(IllegalStateError, match="delete them"):
        install_tablet_copy(str(tmp_path / "src"), copy.chunks(), MemoryLog().append)


def test_truncated_or_damaged_streams_are_rejected(
        tmp_path: Path, source: tuple[Tablet, MemoryLog]) -> None:
    src, _ = source
    with TabletCopySource(src, chunk_bytes=4096) as copy:
        chunks = list(copy.chunks())
    with pytest.raises(CorruptionError, match="ended before its superblock"):
        install_tablet_copy(str(tmp_path / "a"), chunks[:-1], MemoryLog().append)
    assert not (tmp_path / "a" / "tablets" / "tab" / "superblock").exists()
    bad = list(chunks)
    c = bad[1]
    bad[1] = CopyChunk(c.kind, c.name, c.offset, c.data[:-1] + b"\0", c.size, c.crc)
    with pytest.raises(CorruptionError, match="CRC"):
        install_tablet_copy(str(tmp_path / "b"), bad, MemoryLog().append)
    with pytest.raises(InvalidArgumentError, match="pass a log_sink"):
        install_tablet_copy(str(tmp_path / "c"), chunks)


def test_chunks_pickle_for_spark_task_results(source: tuple[Tablet, MemoryLog]) -> None:
    src, _ = source
    with TabletCopySource(src) as copy:
        for c in copy.chunks():
            assert pickle.loads(pickle.dumps(c)) == c


def test_log_gc_keeps_unflushed_and_retained_entries(
        source: tuple[Tablet, MemoryLog]) -> None:
    src, log = source
    assert src.log_gc_index() == 3  # flushed up to 3
    assert src.gc_log(retention_index=2) == 1  # the Raft layer still needs index 2
    assert [r.index for r in log.read_from(2)] == [2, 3, 4, 5]
    assert src.gc_log() == 3
    assert [r.index for r in log.read_from(4)] == [4, 5]
    src.flush()
    assert src.gc_log() == 5 and len(log) == 0
