"""Flush and compaction: what is written, what is dropped, what stays readable."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.tablet import (
    MemoryLog,
    OpType,
    Tablet,
    TabletEvent,
    TabletOptions,
    TabletState,
    encode_write_batch,
)
from pyspark_kudu.tablet.state import TRANSITIONS, next_state

from .workload import SCHEMA, write

OPTIONS = TabletOptions(flush_threshold_bytes=0, row_group_rows=16, compaction_target_rows=25)


@pytest.fixture
def tablet(tmp_path: Path, no_fsync: None) -> Tablet:
    return Tablet.create(str(tmp_path), "t", SCHEMA, log=MemoryLog(), options=OPTIONS)


def ids_at(t: Tablet, snap: int | None = None) -> list[int]:
    return sorted(t.scan_table(["id"], snapshot=snap).column("id").to_pylist())


def test_flush_persists_the_applied_index_and_empties_the_memrowset(tablet: Tablet) -> None:
    assert tablet.flush() is False
    write(tablet, OpType.INSERT, [3, 1, 2])
    assert tablet.flush() is True
    assert tablet.memrowset_rows == 0
    assert tablet.superblock.last_flushed_index == 1
    (meta,) = tablet.rowsets
    assert (meta.num_rows, meta.min_key, meta.max_key, meta.min_ts, meta.max_ts) == (
        3, (1,), (3,), 1, 1)


def test_later_versions_and_deletes_shadow_flushed_rows(tablet: Tablet) -> None:
    write(tablet, OpType.INSERT, list(range(10)), v=1)
    tablet.flush()
    write(tablet, OpType.UPDATE, [1, 2], v=2)
    write(tablet, OpType.DELETE, [3])
    tablet.flush()
    write(tablet, OpType.UPDATE, [2], v=3)
    now = tablet.scan_table().to_pylist()
    assert {r["id"]: r["v"] for r in now if r["id"] < 4} == {0: 1, 1: 2, 2: 3}
    assert len(now) == 9
    old = tablet.scan_table(snapshot=1).to_pylist()
    assert len(old) == 10 and all(r["v"] == 1 for r in old)


def test_compaction_merges_into_sorted_non_overlapping_rowsets(tablet: Tablet) -> None:
    for lo in (0, 20, 10, 40):
        write(tablet, OpType.UPSERT, list(range(lo, lo + 15)))
        tablet.flush()
    before = ids_at(tablet)
    assert tablet.compact() is True
    metas = tablet.rowsets
    assert len(metas) == 3  # 55 versions, target 25 rows per output
    for a, b in itertools.pairwise(metas):
        assert a.max_key < b.min_key
    assert ids_at(tablet) == before
    for snap in range(1, tablet.applied_index + 1):  # history kept without a retention index
        assert ids_at(tablet, snap) == sorted(
            {i for lo in (0, 20, 10, 40)[:snap] for i in range(lo, lo + 15)})


def test_compaction_drops_history_older_than_the_retention_index(tablet: Tablet) -> None:
    write(tablet, OpType.INSERT, list(range(20)), v=1)
    write(tablet, OpType.UPDATE, list(range(10)), v=2)
    i3 = write(tablet, OpType.DELETE, list(range(5)))
    i4 = write(tablet, OpType.UPDATE, list(range(5, 20)), v=4)
    tablet.flush()
    assert tablet.debug_versions() == 20 + 10 + 15
    tablet.compact(history_retention_index=i3)
    # Kept: versions visible at snapshot 3 (15 rows) plus the versions written at 4.
    assert tablet.debug_versions() == 15 + 15
    assert tablet.ancient_history_mark == i3
    assert len(ids_at(tablet, i3)) == 15
    tablet.compact(history_retention_index=i4)
    assert tablet.debug_versions() == 15
    assert ids_at(tablet) == list(range(5, 20))


def test_compacting_a_subset_leaves_other_rowsets_alone(tablet: Tablet) -> None:
    for lo in (0, 100, 200):
        write(tablet, OpType.INSERT, list(range(lo, lo + 5)))
        tablet.flush()
    first, second, third = (m.id for m in tablet.rowsets)
    tablet.compact(rowset_ids=[first, second])
    ids = [m.id for m in tablet.rowsets]
    assert third in ids and first not in ids and second not in ids
    assert ids_at(tablet) == [*range(5), *range(100, 105), *range(200, 205)]


def test_compaction_resolves_deltas_into_the_output(tablet: Tablet) -> None:
    write(tablet, OpType.INSERT, list(range(30)))
    tablet.flush()
    write(tablet, OpType.DELETE, list(range(0, 30, 2)))
    tablet.flush()
    assert tablet.rowsets[0].deltas
    tablet.compact(history_retention_index=tablet.applied_index)
    (meta,) = tablet.rowsets
    assert meta.deltas == () and meta.num_rows == 15
    assert meta.bloom is not None
    assert tablet.directory.listdir("rowsets") == sorted(f.split("/")[1] for f in meta.files())


def test_lifecycle_transitions_come_from_one_table() -> None:
    assert next_state(TabletState.INITIALIZED, TabletEvent.BOOTSTRAP) is TabletState.BOOTSTRAPPING
    assert TRANSITIONS[(TabletState.BOOTSTRAPPING, TabletEvent.BOOTSTRAPPED)] is (
        TabletState.RUNNING)
    with pytest.raises(IllegalStateError, match="tablet t9 is shutdown; it cannot bootstrap"):
        next_state(TabletState.SHUTDOWN, TabletEvent.BOOTSTRAP, "t9")


def test_closed_tablet_refuses_writes(tablet: Tablet) -> None:
    tablet.close()
    assert tablet.state is TabletState.SHUTDOWN
    with pytest.raises(IllegalStateError, match="is shutdown"):
        tablet.flush()


def test_a_deferred_flush_waits_for_its_caller_up_to_the_deferred_bound(
        tmp_path: Path, no_fsync: None) -> None:
    """``apply(defer_flush=True)`` leaves a due flush to a later ``flush_if_due`` (the
    background applier's), and flushes anyway once the MemRowSet passes the bound."""
    options = TabletOptions(flush_threshold_bytes=1, deferred_flush_max_bytes=4096)
    log = MemoryLog()
    t = Tablet.create(str(tmp_path), "t", SCHEMA, log=log, options=options)
    first = write(t, OpType.INSERT, [1, 2, 3])  # not deferred: flushed at once
    assert t.superblock.last_flushed_index == first and not t.flush_due()
    index = t.applied_index + 1
    data = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [4, 5], "v": [0, 0]}))
    log.append((index, data))
    assert t.apply(index, data, defer_flush=True).ok
    assert t.superblock.last_flushed_index == first, "the deferred flush ran inline"
    assert t.flush_due() and t.memrowset_rows == 2
    assert t.flush_if_due() is True
    assert t.superblock.last_flushed_index == index and not t.flush_due()
    assert t.flush_if_due() is False
    # Past the bound the apply flushes after all: memory stays bounded.
    big = list(range(100, 1100))
    index += 1
    data = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": big, "v": [0] * 1000}))
    log.append((index, data))
    assert t.apply(index, data, defer_flush=True).ok
    assert t.superblock.last_flushed_index == index and t.memrowset_rows == 0
    assert ids_at(t) == [1, 2, 3, 4, 5, *big]
    t.close()
    assert ids_at(Tablet.open(str(tmp_path), "t", log=log, options=options)) == [
        1, 2, 3, 4, 5, *big]


def test_a_rowset_column_of_distinct_strings_falls_back_to_plain_pages(tmp_path: Path) -> None:
    """A string column whose values are all distinct stops building its dictionary at the
    limit (the default 1 MiB let a 65,536-row group build one as large as the column); a
    column of few values keeps its dictionary; both read back exactly."""
    import pyarrow.parquet as pq

    from pyspark_kudu.fileio import FileIO
    from pyspark_kudu.tablet.parquet_files import DICTIONARY_PAGE_LIMIT, write_parquet

    n = 65_536
    table = pa.table({"distinct": [f"name-{i}" for i in range(n)],
                      "few": [f"r{i % 17}" for i in range(n)]})
    write_parquet(FileIO(str(tmp_path)), "x.parquet", table, n)
    path = tmp_path / "x.parquet"
    group = pq.ParquetFile(path).metadata.row_group(0)
    distinct, few = group.column(0), group.column(1)
    dictionary_bytes = distinct.data_page_offset - distinct.dictionary_page_offset
    assert dictionary_bytes <= 2 * DICTIONARY_PAGE_LIMIT and (
        dictionary_bytes * 10 < distinct.total_compressed_size), (
        f"a {dictionary_bytes}-byte dictionary for {distinct.total_compressed_size} bytes "
        "of distinct strings")
    assert few.has_dictionary_page and few.total_compressed_size * 20 < (
        distinct.total_compressed_size), "the 17-value column lost its dictionary"
    assert pq.read_table(path).equals(table)
