"""Bootstrap and crash safety: reopen from superblock + rowsets + log, after real crashes.

The crash tests run the workload in a child process that ``os._exit``s at an injected point
inside a flush or compaction (``PYSPARK_KUDU_CRASH_AT``), then reopen the tablet here and
compare it with the same workload run without a crash: same applied index, same rows at every
snapshot, no leftover files, and the recovered tablet keeps working.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import AlreadyPresentError, CorruptionError, NotFoundError
from pyspark_kudu.tablet import (
    CRASH_EXIT_CODE,
    CRASH_POINTS,
    LogRecord,
    MemoryLog,
    OpType,
    Superblock,
    Tablet,
    encode_write_batch,
)

from .filelog import FileLog
from .workload import OPTIONS, PHASES, SCHEMA, TABLET_ID, open_or_create, run_phases

CHILD = Path(__file__).with_name("crash_child.py")


def snapshot_rows(tablet: Tablet, snap: int) -> list[dict[str, object]]:
    return sorted(tablet.scan_table(snapshot=snap).to_pylist(), key=lambda r: r["id"])  # type: ignore[arg-type,return-value]


def assert_same(a: Tablet, b: Tablet) -> None:
    assert a.applied_index == b.applied_index
    low = max(a.ancient_history_mark, b.ancient_history_mark)
    for snap in range(low, a.applied_index + 1):
        rows = snapshot_rows(a, snap)
        assert rows == snapshot_rows(b, snap), f"snapshot {snap} differs"
        assert len({r["id"] for r in rows}) == len(rows), "a key appears twice"


def assert_no_leftovers(tablet: Tablet) -> None:
    listed = {f.split("/", 1)[1] for f in tablet.superblock.files()}
    assert set(tablet.directory.listdir("rowsets")) == listed
    assert tablet.directory.listdir() == ["rowsets", "superblock"]


# (point, phase): phases 1 and 3 are flushes (3 writes delta files), 5 is a compaction.
CRASHES = [
    ("flush.start", 1), ("flush.after_rowset", 1), ("flush.after_deltas", 3),
    ("flush.after_superblock", 3), ("flush.after_deltas", 5), ("compact.start", 5),
    ("compact.after_outputs", 5), ("compact.after_superblock", 5),
    ("compact.during_delete", 5),
]


LEAVES_FILES = {"flush.after_rowset", "flush.after_deltas", "compact.after_outputs",
                "compact.after_superblock", "compact.during_delete"}


def _unlisted_files(tablet_path: Path) -> set[str]:
    """Files in rowsets/ that the on-disk superblock does not list (what the crash left)."""
    sb = Superblock.from_bytes((tablet_path / "superblock").read_bytes())
    listed = {f.split("/", 1)[1] for f in sb.files()}
    return {p.name for p in (tablet_path / "rowsets").iterdir()} - listed


def test_every_crash_point_is_exercised() -> None:
    assert {p for p, _ in CRASHES} == set(CRASH_POINTS)


@pytest.mark.parametrize("point, phase", CRASHES, ids=[f"{p}@{n}" for p, n in CRASHES])
def test_crash_during_flush_or_compaction_loses_and_duplicates_nothing(
        tmp_path: Path, point: str, phase: int) -> None:
    root, log_path = str(tmp_path / "crashed"), str(tmp_path / "crashed.log")
    proc = subprocess.run([sys.executable, str(CHILD), root, log_path, str(phase), point],
                          capture_output=True, timeout=120)
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr.decode()[-2000:]
    left = _unlisted_files(Path(root) / "tablets" / TABLET_ID)
    assert bool(left) == (point in LEAVES_FILES), left

    log = FileLog(log_path)
    recovered = Tablet.open(root, TABLET_ID, log=log, options=OPTIONS)
    assert_no_leftovers(recovered)
    ref_log = FileLog(str(tmp_path / "ref.log"))
    reference = open_or_create(str(tmp_path / "ref"), ref_log)
    run_phases(reference, ref_log, range(phase + 1))
    assert_same(recovered, reference)

    # The recovered replica carries on like the reference: finish the workload on both.
    run_phases(recovered, log, range(phase + 1, len(PHASES)))
    run_phases(reference, ref_log, range(phase + 1, len(PHASES)))
    assert_same(recovered, reference)
    reopened = Tablet.open(root, TABLET_ID, log=log, options=OPTIONS)
    assert_same(reopened, reference)


class RecordingLog(MemoryLog):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    def read_from(self, index: int) -> Iterator[LogRecord]:
        self.reads.append(index)
        return super().read_from(index)


def _write(tablet: Tablet, log: MemoryLog, index: int, ids: list[int]) -> None:
    data = encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({"id": ids, "v": ids}))
    log.append((index, data))
    tablet.apply(index, data)


def test_bootstrap_replays_the_log_after_the_flushed_index(tmp_path: Path,
                                                           no_fsync: None) -> None:
    log = RecordingLog()
    t = Tablet.create(str(tmp_path), "t", SCHEMA, log=log, options=OPTIONS)
    _write(t, log, 1, [1, 2])
    _write(t, log, 2, [3])
    t.flush()
    _write(t, log, 3, [4])
    log.append((4, b""))
    t2 = Tablet.open(str(tmp_path), "t", log=log, options=OPTIONS)
    assert log.reads[-1] == 3
    assert t2.applied_index == 4 and t2.last_flushed_index == 2
    assert sorted(r["id"] for r in t2.scan_table().to_pylist()) == [1, 2, 3, 4]


def test_without_a_log_a_replica_reopens_at_its_flushed_index(tmp_path: Path,
                                                              no_fsync: None) -> None:
    t = Tablet.create(str(tmp_path), "t", SCHEMA, options=OPTIONS)
    _write(t, MemoryLog(), 1, [1])
    t.flush()
    _write(t, MemoryLog(), 2, [2])
    t2 = Tablet.open(str(tmp_path), "t", options=OPTIONS)
    assert t2.applied_index == 1
    assert [r["id"] for r in t2.scan_table().to_pylist()] == [1]


def test_deltas_written_by_a_flush_are_read_back_on_open(tmp_path: Path, no_fsync: None) -> None:
    log = MemoryLog()
    t = Tablet.create(str(tmp_path), "t", SCHEMA, log=log, options=OPTIONS)
    _write(t, log, 1, list(range(10)))
    t.flush()
    data = encode_write_batch(SCHEMA, OpType.DELETE, pa.table({"id": [3, 4]}))
    log.append((2, data))
    t.apply(2, data)
    t.flush()
    assert [d.rows for d in t.rowsets[0].deltas] == [2]
    t2 = Tablet.open(str(tmp_path), "t", log=log, options=OPTIONS)
    assert t2.metrics.delta_files_read == 1
    assert sorted(r["id"] for r in t2.scan_table().to_pylist()) == [0, 1, 2, 5, 6, 7, 8, 9]
    assert len(t2.scan_table(snapshot=1)) == 10


def test_leftover_files_of_an_interrupted_write_are_removed_on_open(
        tmp_path: Path, no_fsync: None) -> None:
    t = Tablet.create(str(tmp_path), "t", SCHEMA, options=OPTIONS)
    _write(t, MemoryLog(), 1, [1])
    t.flush()
    d = t.directory
    for name in ("rowsets/00000099.parquet", "superblock.tmp-abc"):
        with d.open(name, mode="wb") as f:
            f.write(b"partial")
    t2 = Tablet.open(str(tmp_path), "t", options=OPTIONS)
    assert_no_leftovers(t2)


def test_damaged_superblock_is_reported_as_corruption(tmp_path: Path, no_fsync: None) -> None:
    t = Tablet.create(str(tmp_path), "t", SCHEMA, options=OPTIONS)
    raw = bytearray(t.directory.read_bytes("superblock"))
    raw[-20] ^= 0x55
    t.directory.atomic_write(bytes(raw), "superblock")
    with pytest.raises(CorruptionError, match="re-copied"):
        Tablet.open(str(tmp_path), "t", options=OPTIONS)


def test_create_and_open_name_the_tablet_and_the_fix(tmp_path: Path, no_fsync: None) -> None:
    Tablet.create(str(tmp_path), "t", SCHEMA)
    with pytest.raises(AlreadyPresentError, match="open it instead"):
        Tablet.create(str(tmp_path), "t", SCHEMA)
    with pytest.raises(NotFoundError, match="create the tablet or install a copy"):
        Tablet.open(str(tmp_path), "other")


def test_auto_flush_keeps_the_memrowset_bounded(tmp_path: Path, no_fsync: None) -> None:
    from pyspark_kudu.tablet import TabletOptions

    t = Tablet.create(str(tmp_path), "t", SCHEMA,
                      options=TabletOptions(flush_threshold_bytes=8_000))
    log = MemoryLog()
    for i in range(1, 21):
        _write(t, log, i, list(range(i * 100, i * 100 + 100)))
    assert t.metrics.flushes >= 5
    assert t.memrowset_rows < 1000
    assert len(t.scan_table()) == 2000
