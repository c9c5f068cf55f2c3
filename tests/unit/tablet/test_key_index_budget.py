"""The process-wide key index budget: LRU tablets' indexes are dropped, and rebuilt when needed."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host.replica_cache import clear_cache
from pyspark_kudu.tablet import OpType, Tablet, TabletOptions, encode_write_batch
from pyspark_kudu.tablet.memory import KEY_INDEXES

SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "int64")),
                ("id",))
NO_FLUSH = TabletOptions(flush_threshold_bytes=0)


@pytest.fixture
def budget() -> Iterator[None]:
    # The budget is process-wide: tablets earlier tests left open (the replica cache, or
    # garbage not yet collected) hold registered indexes too. Close what can be closed; the
    # tests below assert about their own tablets, whatever else is still registered.
    clear_cache()
    gc.collect()
    before = KEY_INDEXES.budget
    yield
    KEY_INDEXES.set_budget(before)


def _write(t: Tablet, op: OpType, ids: list[int]) -> list[str]:
    index = t.applied_index + 1
    data = encode_write_batch(SCHEMA, op, pa.table({"id": ids, "v": ids}))
    return [e.status for e in t.apply(index, data).errors]


def _tablet_with_index(root: Path, name: str, n: int) -> Tablet:
    t = Tablet.create(str(root), name, SCHEMA, options=NO_FLUSH)
    _write(t, OpType.INSERT, list(range(n)))
    t.flush()  # keeps the key columns it wrote: the index source
    _write(t, OpType.UPSERT, [0])  # builds the index
    return t


def _index_bytes(t: Tablet) -> int:
    return t.memory_bytes()[1]


def test_least_recently_used_tablets_lose_their_key_index_first(
        tmp_path: Path, budget: None) -> None:
    a = _tablet_with_index(tmp_path, "a", 20_000)
    b = _tablet_with_index(tmp_path, "b", 20_000)
    size = _index_bytes(a)
    assert size > 0 and _index_bytes(b) > 0
    KEY_INDEXES.set_budget(size + size // 2)  # room for one tablet's index, not two
    dropped = KEY_INDEXES.dropped
    _write(b, OpType.UPSERT, [1])  # b is the most recently used: a's index goes
    assert _index_bytes(a) == 0 and _index_bytes(b) > 0
    # a's, and any older tablet's still registered by an earlier test of this process
    assert KEY_INDEXES.dropped >= dropped + 1
    assert KEY_INDEXES.total_bytes() <= KEY_INDEXES.budget_bytes
    # a's next write rebuilds its index from the file and still sees every key.
    loads = a.metrics.key_index_loads
    assert _write(a, OpType.INSERT, [5, 20_001]) == ["AlreadyPresent"]
    assert a.metrics.key_index_loads == loads + 1
    assert _index_bytes(b) == 0 and _index_bytes(a) > 0


def test_an_index_in_use_by_another_thread_is_not_dropped(
        tmp_path: Path, budget: None) -> None:
    a = _tablet_with_index(tmp_path, "a", 20_000)
    b = _tablet_with_index(tmp_path, "b", 20_000)
    KEY_INDEXES.set_budget(1)
    held, release = threading.Event(), threading.Event()

    def hold_a() -> None:
        with a._lock:  # a write on a is in progress
            held.set()
            release.wait(10)

    th = threading.Thread(target=hold_a)
    th.start()
    try:
        held.wait(10)
        _write(b, OpType.UPSERT, [1])
        assert _index_bytes(a) > 0  # skipped: its tablet is busy
        assert _index_bytes(b) == 0  # the reporting tablet drops its own between entries
    finally:
        release.set()
        th.join()
    _write(b, OpType.UPSERT, [2])
    assert _index_bytes(a) == 0
