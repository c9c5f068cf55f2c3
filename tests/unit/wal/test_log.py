"""The WAL on its own: appends, rolls, restart recovery, truncation, reads, GC."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.errors import (
    CompactedError,
    EntryUnavailableError,
    IllegalStateError,
    InvalidArgumentError,
    NotSupportedError,
)
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import Log, SyncPolicy, WalOptions
from pyspark_kudu.wal.format import HEADER_SIZE, segment_name

from .conftest import FRAME_SIZE, SMALL_SEGMENT, make_entries


def test_appended_entries_read_back_identically(wal_io: FileIO) -> None:
    with Log.open(wal_io, WalOptions(cache_bytes=0)) as log:
        assert log.append(make_entries(1, 11)) == 10
        assert log.read(1, 11) == make_entries(1, 11)
        assert log.read(4, 6) == make_entries(4, 6)
        assert log.term(7) == 1


def test_a_full_segment_rolls_to_the_next(wal_io: FileIO, small_segments: WalOptions) -> None:
    with Log.open(wal_io, small_segments) as log:
        for e in make_entries(1, 10):
            log.append([e])
        assert log.read(1, 10) == make_entries(1, 10)
    assert wal_io.listdir() == [segment_name(1), segment_name(2), segment_name(3)]
    assert wal_io.size(segment_name(1)) == SMALL_SEGMENT


def test_restart_recovers_exactly_what_was_appended(wal_io: FileIO,
                                                    small_segments: WalOptions) -> None:
    with Log.open(wal_io, small_segments) as log:
        log.append(make_entries(1, 8))
        log.append(make_entries(8, 15, term=2))
    with Log.open(wal_io, WalOptions(cache_bytes=0)) as log:
        assert (log.first_index, log.last_index) == (1, 14)
        assert log.read(1, 15) == make_entries(1, 8) + make_entries(8, 15, term=2)
        assert log.recovery.torn_tail is None
        assert log.recovery.frames == 14


def test_recovery_after_a_crash_sees_every_acknowledged_entry(tmp_path: Path,
                                                             wal_io: FileIO) -> None:
    log = Log.open(wal_io, WalOptions(segment_size=1 << 20))
    log.append(make_entries(1, 6))
    # A copy of the directory while the log is open is what a crash leaves: the segment
    # still has its preallocated, zero-filled tail.
    shutil.copytree(wal_io.root, tmp_path / "crashed")
    log.close()
    assert (tmp_path / "crashed" / segment_name(1)).stat().st_size == 1 << 20
    with Log.open(FileIO(str(tmp_path / "crashed"))) as recovered:
        assert recovered.read(1, 6) == make_entries(1, 6)
        torn = recovered.recovery.torn_tail
        assert torn is not None and not torn.nonzero
        assert torn.offset == HEADER_SIZE + 5 * FRAME_SIZE


def test_overwriting_a_suffix_truncates_it_and_survives_restart(
        wal_io: FileIO, small_segments: WalOptions) -> None:
    with Log.open(wal_io, small_segments) as log:
        log.append(make_entries(1, 11))
        log.append(make_entries(4, 7, term=2))
        assert log.last_index == 6
        with pytest.raises(EntryUnavailableError):
            log.read(1, 8)
    want = make_entries(1, 4) + make_entries(4, 7, term=2)
    with Log.open(wal_io, small_segments) as log:
        assert log.read(1, log.last_index + 1) == want
        log.append(make_entries(7, 9, term=3))
    with Log.open(wal_io, small_segments) as log:
        assert log.read(1, 9) == want + make_entries(7, 9, term=3)


def test_a_gap_or_non_consecutive_batch_is_refused(wal_io: FileIO) -> None:
    with Log.open(wal_io) as log:
        log.append(make_entries(5, 7))
        with pytest.raises(InvalidArgumentError, match="gap"):
            log.append(make_entries(8, 9))
        with pytest.raises(InvalidArgumentError, match="consecutive"):
            log.append([Entry(1, 7), Entry(1, 9)])
        assert log.last_index == 6


def test_max_size_limits_reads_like_limit_size_but_returns_at_least_one(
        wal_io: FileIO) -> None:
    with Log.open(wal_io, WalOptions(cache_bytes=0)) as log:
        log.append(make_entries(1, 6))
        one = make_entries(1, 2)[0].size()
        assert len(log.read(1, 6, max_size=0)) == 1
        assert len(log.read(1, 6, max_size=3 * one)) == 3
        assert len(log.read(1, 6, max_size=3 * one - 1)) == 2


def test_append_async_completes_futures_in_order_with_the_last_index(wal_io: FileIO) -> None:
    with Log.open(wal_io) as log:
        futures = [log.append_async(make_entries(i, i + 1)) for i in range(1, 21)]
        assert [f.result(timeout=10) for f in futures] == list(range(1, 21))
        assert log.read(1, 21) == make_entries(1, 21)


def test_closing_truncates_the_preallocated_tail(wal_io: FileIO) -> None:
    log = Log.open(wal_io, WalOptions(segment_size=1 << 20))
    log.append(make_entries(1, 3))
    assert wal_io.size(segment_name(1)) == 1 << 20
    log.close()
    assert wal_io.size(segment_name(1)) == HEADER_SIZE + 2 * FRAME_SIZE
    with pytest.raises(IllegalStateError, match="closed"):
        log.append(make_entries(3, 4))


def test_gc_deletes_only_whole_closed_segments_at_or_below_the_index(
        wal_io: FileIO, small_segments: WalOptions) -> None:
    with Log.open(wal_io, small_segments) as log:
        for e in make_entries(1, 14):
            log.append([e])
        # Segments hold 1-4, 5-8, 9-12, 13 (active).
        assert log.gc(6) == [segment_name(1)]
        with pytest.raises(CompactedError):
            log.read(6, 7)
        assert log.read(7, 14) == make_entries(7, 14)
        assert log.gc(13) == [segment_name(2), segment_name(3)]
    with Log.open(wal_io, small_segments) as log:
        assert (log.first_index, log.last_index) == (13, 13)


def test_gc_stops_at_a_segment_whose_entries_a_later_one_truncated(
        wal_io: FileIO, small_segments: WalOptions) -> None:
    with Log.open(wal_io, small_segments) as log:
        log.append(make_entries(1, 9))  # segments 1-4 and 5-8
        log.append(make_entries(3, 4, term=2))  # truncates to 1-3, in segment 3
        log.append(make_entries(4, 10, term=2))
        # Segment 2 (indexes 5-8) is superseded, but segment 1 (max 4 > 3) must stay
        # first: replaying segment 2 without it would resurrect stale entries.
        assert log.gc(3) == []
    with Log.open(wal_io, small_segments) as log:
        assert log.read(1, 10) == make_entries(1, 3) + make_entries(3, 10, term=2)


def test_a_new_epoch_empties_the_log_and_drops_older_segments(
        wal_io: FileIO, small_segments: WalOptions) -> None:
    with Log.open(wal_io, small_segments) as log:
        log.append(make_entries(1, 6))
        seq = log.start_new_epoch()
        assert log.fresh
        log.append(make_entries(50, 52, term=4))
        assert log.drop_segments_before(seq) == [segment_name(1), segment_name(2)]
    with Log.open(wal_io, small_segments, start_seq=seq) as log:
        assert (log.first_index, log.last_index) == (50, 51)


def test_segments_below_the_start_sequence_and_temp_files_are_removed_on_open(
        wal_io: FileIO, small_segments: WalOptions) -> None:
    with Log.open(wal_io, small_segments) as log:
        log.append(make_entries(1, 10))
    wal_io.atomic_write(b"half-created", segment_name(9) + ".tmp")
    with Log.open(wal_io, small_segments, start_seq=4) as log:  # segments 1, 2, 3 are old
        assert log.fresh
        assert set(log.recovery.removed) == {segment_name(1), segment_name(2), segment_name(3),
                                             segment_name(9) + ".tmp"}
        log.append(make_entries(100, 101))
    assert wal_io.listdir() == [segment_name(4)]


def test_the_log_refuses_non_local_roots() -> None:
    with pytest.raises(NotSupportedError, match="local file system"):
        Log.open(FileIO("memory://wal-test"))


def test_options_reject_nonsense() -> None:
    with pytest.raises(InvalidArgumentError, match="segment_size"):
        WalOptions(segment_size=10)
    with pytest.raises(InvalidArgumentError, match="sync_policy"):
        WalOptions(sync_policy="fsync")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="group_commit_wait"):
        WalOptions(group_commit_wait=-0.1)
    assert SyncPolicy("none") is SyncPolicy.NONE
