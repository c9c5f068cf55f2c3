"""Property tests: the replica equals a trivial in-memory model under random histories.

Random sequences of write batches (all seven op types, repeated keys, partial columns),
flushes, compactions with random history retention, crashes (the tablet object is dropped
without flushing and reopened from superblock + log) and snapshot reads with random
projections and predicates. Every read, and every per-row error, must match the model.
"""

from __future__ import annotations

import tempfile
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kudu.fileio import FileIO
from pyspark_kudu.tablet import (
    MemoryLog,
    Tablet,
    TabletCopySource,
    TabletOptions,
    encode_write_batch,
    install_tablet_copy,
    keys,
)

from .model import SCHEMA, SCHEMA_INT_KEY, Model, actual, expected, predicates, write_batches

# The real hash, taken once: the monkeypatch of one hypothesis test lasts for all its
# examples, so a wrapper of "the current" key_hash would wrap the last example's wrapper.
_REAL_KEY_HASH = keys.key_hash

ACTIONS = ["write"] * 6 + ["flush", "flush", "compact", "reopen", "read", "read"]


def _options(data: st.DataObject) -> TabletOptions:
    return TabletOptions(
        flush_threshold_bytes=data.draw(st.sampled_from([0, 0, 2000])),
        row_group_rows=data.draw(st.sampled_from([2, 4, 1000])),
        compaction_target_rows=data.draw(st.sampled_from([3, 1000])),
    )


def run_history(data: st.DataObject, root: str, steps: int) -> None:
    options = _options(data)
    schema = data.draw(st.sampled_from([SCHEMA, SCHEMA_INT_KEY]))
    log = MemoryLog()
    tablet = Tablet.create(root, "t", schema, log=log, options=options)
    model = Model(schema)
    mark = 0
    index = 0
    for _ in range(steps):
        action = data.draw(st.sampled_from(ACTIONS))
        if action == "write":
            ops, table, rows = data.draw(write_batches(schema))
            index += data.draw(st.sampled_from([1, 1, 2]))  # gaps: skipped non-write entries
            payload = encode_write_batch(schema, ops, table)
            log.append((index, payload))
            result = tablet.apply(index, payload)
            want = model.apply(index, ops, rows)
            assert [(e.row, e.status) for e in result.errors] == want
        elif action == "flush":
            tablet.flush()
        elif action == "compact":
            retain = data.draw(st.integers(0, max(index, 0)))
            tablet.compact(history_retention_index=retain)
            mark = max(mark, min(retain, tablet.applied_index))
            assert tablet.ancient_history_mark == mark
        elif action == "reopen":
            tablet = Tablet.open(root, "t", log=log, options=options)
            assert tablet.applied_index == index
        else:
            snap = data.draw(st.integers(mark, max(mark, tablet.applied_index)))
            cols = data.draw(st.sampled_from([None, ["k2", "a"], ["e", "k1", "d"]]))
            preds = data.draw(predicates())
            rows = data.draw(st.sampled_from([None, 1, 3]))
            assert actual(tablet, snap, cols, preds, rows) == expected(model, snap, cols, preds)
    for snap in range(mark, tablet.applied_index + 1):
        assert actual(tablet, snap, None, []) == expected(model, snap, None, [])
    copy_log = MemoryLog()
    with TabletCopySource(tablet, chunk_bytes=700) as src:
        copy_root = FileIO(root).child("copy")
        install_tablet_copy(copy_root, src.chunks(), copy_log.append)
    copied = Tablet.open(copy_root, "t", log=copy_log)
    assert copied.applied_index == tablet.applied_index
    for snap in range(mark, tablet.applied_index + 1):
        assert actual(copied, snap, None, []) == expected(model, snap, None, [])


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.function_scoped_fixture])


@settings(max_examples=25, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_replica_matches_model_over_random_histories(data: st.DataObject,
                                                    no_fsync: None) -> None:
    with tempfile.TemporaryDirectory() as root:
        run_history(data, root, steps=data.draw(st.integers(5, 25)))


@settings(max_examples=8, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_replica_matches_model_on_an_fsspec_memory_root(data: st.DataObject) -> None:
    root = f"memory://model-{uuid.uuid4().hex}"
    try:
        run_history(data, root, steps=data.draw(st.integers(5, 15)))
    finally:
        FileIO(root).delete(recursive=True)


@settings(max_examples=15, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_replica_matches_model_when_key_hashes_collide(data: st.DataObject, no_fsync: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashed keys (the composite-key schema) whose 64-bit hashes take only four values:
    the MemRowSet's and the key index's collision paths, and batches whose probes repeat
    although their keys do not, must still answer exactly."""
    def four_values(data: Any, schema: Any, seed: int = keys.INDEX_SEED) -> Any:
        return _REAL_KEY_HASH(data, schema, seed) % np.uint64(4)

    monkeypatch.setattr(keys, "key_hash", four_values)
    with tempfile.TemporaryDirectory() as root:
        run_history(data, root, steps=data.draw(st.integers(5, 25)))


@pytest.mark.slow
@settings(max_examples=50, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_replica_matches_model_over_long_random_histories(data: st.DataObject,
                                                         no_fsync: None) -> None:
    with tempfile.TemporaryDirectory() as root:
        run_history(data, root, steps=data.draw(st.integers(20, 50)))


@settings(max_examples=15, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_replicas_with_different_flush_schedules_report_identical_results(
        data: st.DataObject, no_fsync: None) -> None:
    with tempfile.TemporaryDirectory() as root:
        a = Tablet.create(root + "/a", "t", SCHEMA, options=TabletOptions(flush_threshold_bytes=0))
        b = Tablet.create(root + "/b", "t", SCHEMA, options=TabletOptions(flush_threshold_bytes=1))
        for index in range(1, data.draw(st.integers(2, 10))):
            ops, table, _ = data.draw(write_batches())
            payload = encode_write_batch(SCHEMA, ops, table)
            ra, rb = a.apply(index, payload), b.apply(index, payload)
            assert ra == rb
            if data.draw(st.booleans()):
                a.compact()
        assert actual(a, a.applied_index, None, []) == actual(b, b.applied_index, None, [])
