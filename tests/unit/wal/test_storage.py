"""WalStorage: durability of each write, restart, snapshots, GC, failure modes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import ConfState, HardState, Snapshot, SnapshotMetadata
from pyspark_kudu.consensus.raft_storage import Storage
from pyspark_kudu.errors import (
    CompactedError,
    CorruptionError,
    IllegalStateError,
    InvalidArgumentError,
    NotSupportedError,
)
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import WAL_DIR, ConsensusMeta, SyncPolicy, WalOptions, WalStorage, load_meta
from pyspark_kudu.wal.format import segment_name

from .conftest import SMALL_SEGMENT, make_entries

OPTIONS = WalOptions(segment_size=SMALL_SEGMENT, sync_policy=SyncPolicy.FDATASYNC, cache_bytes=0)
CONF = ConfState.of(["a", "b", "c"])


@pytest.fixture
def tablet(tmp_path: Path) -> FileIO:
    return FileIO(str(tmp_path / "tablets" / "t1"))


def _open(tablet: FileIO) -> WalStorage:
    return WalStorage.open(tablet, OPTIONS, conf_state=CONF)


def test_wal_storage_satisfies_the_storage_protocol(tablet: FileIO) -> None:
    with _open(tablet) as s:
        assert isinstance(s, Storage)


def test_a_new_tablet_starts_empty_with_its_initial_configuration(tablet: FileIO) -> None:
    with _open(tablet) as s:
        assert (s.first_index(), s.last_index(), s.term(0)) == (1, 0, 0)
        assert s.initial_state() == (HardState(), CONF)
    with WalStorage.open(tablet, OPTIONS, conf_state=ConfState.of(["z"])) as s:
        assert s.initial_state()[1] == CONF  # only a new tablet takes conf_state


def test_appended_entries_survive_restart(tablet: FileIO) -> None:
    with _open(tablet) as s:
        s.append(make_entries(1, 10))
        s.append(make_entries(6, 8, term=2))
    with _open(tablet) as s:
        assert (s.first_index(), s.last_index()) == (1, 7)
        assert s.entries(1, 8) == make_entries(1, 6) + make_entries(6, 8, term=2)
        assert [s.term(i) for i in (5, 6)] == [1, 2]


def test_term_and_vote_are_durable_at_once_and_commit_by_close(tablet: FileIO) -> None:
    with _open(tablet) as s:
        s.set_hard_state(HardState(term=3, vote="b", commit=0))
        assert _durable(tablet).hard_state == HardState(3, "b", 0)
        s.set_hard_state(HardState(term=3, vote="b", commit=9))
        assert s.initial_state()[0].commit == 9
        assert _durable(tablet).hard_state.commit == 0  # lazily persisted
    assert _durable(tablet).hard_state == HardState(3, "b", 9)


def test_a_lazily_kept_commit_rides_along_with_the_next_meta_write(tablet: FileIO) -> None:
    with _open(tablet) as s:
        s.set_hard_state(HardState(term=1, vote="a", commit=0))
        s.set_hard_state(HardState(term=1, vote="a", commit=4))
        s.set_conf_state(ConfState.of(["a", "b"]))
        assert _durable(tablet).hard_state.commit == 4
        assert _durable(tablet).snapshot.metadata.conf_state == ConfState.of(["a", "b"])


def test_a_crash_keeps_every_acknowledged_write(tmp_path: Path, tablet: FileIO) -> None:
    s = _open(tablet)
    s.append(make_entries(1, 12))
    s.set_hard_state(HardState(term=2, vote="c", commit=11))
    s.create_snapshot(5, CONF, b"state@5")
    shutil.copytree(tablet.root, tmp_path / "crashed")  # the disk image a crash leaves
    s.close()
    with WalStorage.open(str(tmp_path / "crashed"), OPTIONS) as r:
        assert r.entries(1, 12) == make_entries(1, 12)
        assert r.snapshot().data == b"state@5"
        hs = r.initial_state()[0]
        assert (hs.term, hs.vote) == (2, "c")  # commit may lag: it is volatile in Raft


def test_an_installed_snapshot_replaces_the_log_and_its_segments(tablet: FileIO) -> None:
    snap = Snapshot(SnapshotMetadata(100, 5, ConfState.of(["a", "d"])), b"copy")
    with _open(tablet) as s:
        s.append(make_entries(1, 10))
        old = tablet.child(WAL_DIR).listdir()
        s.apply_snapshot(snap)
        assert (s.first_index(), s.last_index(), s.term(100)) == (101, 100, 5)
        assert not set(old) & set(tablet.child(WAL_DIR).listdir())
        s.append(make_entries(101, 103, term=6))
    with _open(tablet) as s:
        assert s.snapshot() == snap
        assert s.initial_state()[1] == ConfState.of(["a", "d"])
        assert s.entries(101, 103) == make_entries(101, 103, term=6)
        with pytest.raises(CompactedError):
            s.entries(100, 101)


def test_segments_of_a_replaced_log_left_by_a_crash_are_deleted_on_open(
        tablet: FileIO) -> None:
    wal = tablet.child(WAL_DIR)
    with _open(tablet) as s:
        s.append(make_entries(1, 6))
        stale = {name: wal.read_bytes(name) for name in wal.listdir()}
        s.apply_snapshot(Snapshot(SnapshotMetadata(50, 3, CONF)))
    for name, data in stale.items():  # a crash after meta was written, before the deletion
        wal.atomic_write(data, name)
    with _open(tablet) as s:
        assert (s.first_index(), s.last_index()) == (51, 50)
        assert set(s.recovery.removed) == set(stale)


def test_gc_reclaims_compacted_segments_only(tablet: FileIO) -> None:
    wal = tablet.child(WAL_DIR)
    with _open(tablet) as s:
        for e in make_entries(1, 14):
            s.append([e])  # segments hold 1-4, 5-8, 9-12, 13
        assert s.gc() == []
        s.compact(9)
        with pytest.raises(InvalidArgumentError, match="compact"):
            s.gc(10)
        assert s.gc() == [segment_name(1), segment_name(2)]
        assert s.entries(10, 14) == make_entries(10, 14)
    assert wal.listdir() == [segment_name(3), segment_name(4)]
    with _open(tablet) as s:
        assert (s.first_index(), s.last_index(), s.term(9)) == (10, 13, 1)


def test_a_wal_that_lost_entries_below_the_compaction_point_is_corruption(
        tablet: FileIO) -> None:
    with _open(tablet) as s:
        s.append(make_entries(1, 7))  # segment 1 holds 1-4, segment 2 holds 5-6
        s.compact(6)
    with Path(tablet.child(WAL_DIR).local_path(segment_name(2))).open("r+b") as f:
        f.truncate(30)  # header plus a torn first frame: entries 5-6 are gone
    with pytest.raises(CorruptionError, match="ends at index 4 but entries through 6"):
        _open(tablet)


def test_corrupt_meta_fails_the_open(tablet: FileIO) -> None:
    with _open(tablet) as s:
        s.append(make_entries(1, 3))
    data = bytearray(tablet.read_bytes("meta"))
    data[-2] ^= 0x40
    tablet.atomic_write(bytes(data), "meta")
    with pytest.raises(CorruptionError, match="meta: checksum mismatch"):
        _open(tablet)


def test_segments_without_meta_fail_the_open(tablet: FileIO) -> None:
    with _open(tablet) as s:
        s.append(make_entries(1, 3))
    tablet.delete("meta")
    with pytest.raises(CorruptionError, match="no consensus metadata"):
        _open(tablet)


def test_a_closed_storage_refuses_calls_and_closing_twice_is_harmless(tablet: FileIO) -> None:
    s = _open(tablet)
    s.close()
    s.close()
    with pytest.raises(IllegalStateError, match="closed"):
        s.last_index()


def test_non_local_tablet_directories_are_not_supported() -> None:
    with pytest.raises(NotSupportedError, match="local file system"):
        WalStorage.open("memory://tablets/t1")


def _durable(tablet: FileIO) -> ConsensusMeta:
    meta = load_meta(tablet)
    assert meta is not None
    return meta
