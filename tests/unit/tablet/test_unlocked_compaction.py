"""Compactions that merge without the tablet lock: writes and scans go on during the merge, a
write that ends versions in an input makes the commit drop the merge (nothing lost, nothing
twice), and outputs another process removed are never published."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.tablet import MemoryLog, OpType, Tablet, TabletOptions
from pyspark_kudu.tablet import merge as merge_module
from pyspark_kudu.tablet import tablet_compaction as tablet_module

from .workload import SCHEMA, write

OPTIONS = TabletOptions(flush_threshold_bytes=0, row_group_rows=16, compaction_target_rows=25)


@pytest.fixture
def tablet(tmp_path: Path, no_fsync: None) -> Tablet:
    """Three overlapping rowsets of ids 0..89 (v = 0), an empty MemRowSet."""
    t = Tablet.create(str(tmp_path), "t", SCHEMA, log=MemoryLog(), options=OPTIONS)
    for part in (range(0, 90, 3), range(1, 90, 3), range(2, 90, 3)):
        write(t, OpType.INSERT, list(part))
        t.flush()
    assert len(t.rowsets) == 3
    return t


def rows(t: Tablet) -> dict[int, int]:
    return {r["id"]: r["v"] for r in t.scan_table(["id", "v"]).to_pylist()}


def rowset_files(t: Tablet) -> set[str]:
    return set(t.directory.listdir("rowsets"))


def listed_files(t: Tablet) -> set[str]:
    return {f.split("/", 1)[1] for m in t.rowsets for f in m.files()}


def test_writes_and_scans_between_prepare_and_commit_are_kept(tablet: Tablet,
                                                              tmp_path: Path) -> None:
    job = tablet.prepare_compaction()
    assert job is not None
    write(tablet, OpType.INSERT, [100, 101])  # fresh keys: the MemRowSet, no input touched
    assert len(rows(tablet)) == 92
    tablet.run_compaction(job)
    write(tablet, OpType.UPSERT, [102], v=7)
    assert tablet.commit_compaction(job)
    assert len(tablet.rowsets) == 4  # 90 rows in files of 25 (cut between keys)
    want = {i: 0 for i in range(90)} | {100: 0, 101: 0, 102: 7}
    assert rows(tablet) == want
    assert rowset_files(tablet) == listed_files(tablet)  # inputs deleted, nothing stray
    tablet.flush()
    again = Tablet.open(str(tmp_path), "t", log=tablet.log, options=OPTIONS)
    assert rows(again) == want


@pytest.mark.parametrize("when", ["before the merge", "after the merge"])
def test_a_write_that_ends_an_inputs_version_drops_the_merge(tablet: Tablet, when: str) -> None:
    before = list(tablet.rowsets)
    job = tablet.prepare_compaction()
    assert job is not None
    if when == "before the merge":
        write(tablet, OpType.UPSERT, [5], v=1)  # id 5 lives in an input rowset
    tablet.run_compaction(job)
    if when == "after the merge":
        write(tablet, OpType.DELETE, [6])
    assert not tablet.commit_compaction(job)
    assert tablet.metrics.compaction_conflicts == 1 and tablet.metrics.compactions == 0
    assert tablet.rowsets == before
    assert rowset_files(tablet) == listed_files(tablet)  # the outputs were deleted
    want = {i: 0 for i in range(90)}
    if when == "before the merge":
        want[5] = 1
    else:
        del want[6]
    assert rows(tablet) == want
    assert tablet.compact()  # nothing moves now: the next one commits
    assert tablet.metrics.compactions == 1 and rows(tablet) == want
    assert rowset_files(tablet) == listed_files(tablet)


def test_outputs_another_process_removed_are_not_published(tablet: Tablet,
                                                            tmp_path: Path) -> None:
    job = tablet.prepare_compaction()
    assert job is not None
    tablet.run_compaction(job)
    # Another process opens the replica meanwhile: the outputs are not in the superblock
    # yet, so its bootstrap removes them as leftovers of a crash.
    other = Tablet.open(str(tmp_path), "t", log=tablet.log, options=OPTIONS)
    assert len(other.rowsets) == 3
    assert not tablet.commit_compaction(job)
    assert rows(tablet) == {i: 0 for i in range(90)} == rows(other)
    assert rowset_files(tablet) == listed_files(tablet)


def test_the_reserved_ids_are_not_reused_by_a_flush_during_the_merge(tablet: Tablet) -> None:
    job = tablet.prepare_compaction()
    assert job is not None
    write(tablet, OpType.INSERT, [200, 201])
    tablet.flush()  # a new rowset while the merge is prepared: its id is past the reserve
    flushed = tablet.rowsets[-1].id
    assert flushed >= job.first_id + job.reserved
    tablet.run_compaction(job)
    assert tablet.commit_compaction(job)
    assert flushed in {m.id for m in tablet.rowsets}
    assert rows(tablet) == {i: 0 for i in range(90)} | {200: 0, 201: 0}


def test_one_compaction_at_a_time_and_abandoning_deletes_the_outputs(tablet: Tablet) -> None:
    job = tablet.prepare_compaction()
    assert job is not None
    with pytest.raises(IllegalStateError, match="already compacting"):
        tablet.prepare_compaction()
    tablet.run_compaction(job)
    tablet.abandon_compaction(job)
    assert rowset_files(tablet) == listed_files(tablet) and len(tablet.rowsets) == 3
    assert tablet.compact()  # the tablet compacts again afterwards


def test_a_merge_never_writes_past_its_reserved_ids(tablet: Tablet) -> None:
    job = tablet.prepare_compaction()
    assert job is not None
    job_reserved = job.reserved
    job.reserved = 1  # as if the reservation had been too small: 4 outputs are needed
    with pytest.raises(IllegalStateError, match="reserved"):
        tablet.run_compaction(job)
    assert job_reserved > 1
    assert rowset_files(tablet) == listed_files(tablet)  # what it wrote is gone


def test_the_merge_holds_no_lock_that_writes_or_scans_wait_for(
        tablet: Tablet, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge paused half-way (in another thread) does not stop writes or scan planning."""
    paused, resume = threading.Event(), threading.Event()
    real = merge_module.write_merged

    def slow_write_merged(*args: object, **kwargs: object) -> object:
        paused.set()
        assert resume.wait(60), "the test never resumed the merge"
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tablet_module, "write_merged", slow_write_merged)
    job = tablet.prepare_compaction()
    assert job is not None
    errors: list[BaseException] = []

    def merge() -> None:
        try:
            tablet.run_compaction(job)
        except BaseException as e:  # reported below
            errors.append(e)

    worker = threading.Thread(target=merge)
    worker.start()
    try:
        assert paused.wait(60), "the merge never started"
        done = threading.Event()

        def write_and_scan() -> None:
            write(tablet, OpType.INSERT, [300])
            assert rows(tablet)[300] == 0
            done.set()

        writer = threading.Thread(target=write_and_scan)
        writer.start()
        writer.join(60)
        assert done.is_set(), "a write and a scan waited for the paused merge"
    finally:
        resume.set()
        worker.join(60)
    assert not errors
    assert tablet.commit_compaction(job)
    assert rows(tablet) == {i: 0 for i in range(90)} | {300: 0}


def test_the_merge_calls_its_pacer_before_each_chunk_and_the_result_is_unchanged(
        tmp_path: Path, no_fsync: None) -> None:
    """``run_compaction(between=...)``: the maintenance manager pauses a merge there while a
    tablet copy is fetched; the merge's outputs are the same as without."""
    options = TabletOptions(flush_threshold_bytes=0, row_group_rows=16,
                            compaction_target_rows=25, compaction_batch_rows=4)
    t = Tablet.create(str(tmp_path), "t", SCHEMA, log=MemoryLog(), options=options)
    for part in (range(0, 90, 3), range(1, 90, 3), range(2, 90, 3)):
        write(t, OpType.INSERT, list(part))
        t.flush()
    before = rows(t)
    job = t.prepare_compaction()
    assert job is not None
    chunks = list(merge_module.merge_rowsets(job.schema, job.inputs, job.mark,
                                             options.compaction_batch_rows, deltas=job.deltas))
    calls: list[int] = []
    t.run_compaction(job, between=lambda: calls.append(1))
    assert len(chunks) >= 3 and len(calls) == len(chunks), (len(chunks), len(calls))
    assert t.commit_compaction(job)
    assert rows(t) == before and len(t.rowsets) == 4
