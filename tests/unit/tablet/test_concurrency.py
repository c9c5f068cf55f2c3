"""Scans running in other threads while the writer applies, flushes and compacts."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pyarrow as pa

from pyspark_kudu.tablet import OpType, Tablet, TabletOptions, encode_write_batch

from .workload import SCHEMA, entry


def test_concurrent_snapshot_scans_see_stable_results(tmp_path: Path, no_fsync: None) -> None:
    # Expected rows per snapshot, from a replica nobody else touches.
    ref = Tablet.create(str(tmp_path / "ref"), "t", SCHEMA,
                        options=TabletOptions(flush_threshold_bytes=0))
    records = [entry(i) for i in range(1, 41)]
    expected = {}
    for rec in records:
        ref.apply(rec.index, rec.data)
        expected[rec.index] = sorted(r["id"] for r in ref.scan_table(["id"]).to_pylist())

    t = Tablet.create(str(tmp_path / "t"), "t", SCHEMA,
                      options=TabletOptions(flush_threshold_bytes=0, row_group_rows=4))
    errors: list[BaseException] = []
    done = threading.Event()

    def reader(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not done.is_set():
                applied = t.applied_index
                if applied == 0:
                    continue
                snap = rnd.randint(1, applied)
                got = sorted(i for b in t.scan(["id"], snapshot=snap, batch_rows=3)
                             for i in b.column(0).to_pylist())
                assert got == expected[snap], f"snapshot {snap}"
        except BaseException as e:  # surfaced in the main thread below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(2)]
    for th in threads:
        th.start()
    try:
        for rec in records:
            t.apply(rec.index, rec.data)
            if rec.index % 5 == 0:
                t.flush()
            if rec.index % 12 == 0:
                t.compact()
    finally:
        done.set()
        for th in threads:
            th.join()
    assert not errors, errors[0]
    assert sorted(r["id"] for r in t.scan_table(["id"]).to_pylist()) == expected[40]
    assert len(t.directory.listdir("rowsets")) == len(
        {f for m in t.rowsets for f in m.files()})


def test_write_result_order_does_not_depend_on_thread_interleaving(
        tmp_path: Path, no_fsync: None) -> None:
    t = Tablet.create(str(tmp_path), "t", SCHEMA)
    data = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [1, 1, 2]}))
    results = [t.apply(1, data), t.apply(1, data)]
    assert [(e.row, e.status) for e in results[0].errors] == [(1, "AlreadyPresent")]
    assert results[1].skipped
