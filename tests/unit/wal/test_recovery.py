"""Torn tails versus corruption on real files (rules of pyspark_kudu.wal.segment)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import Log, WalOptions
from pyspark_kudu.wal.format import HEADER_SIZE, segment_name

from .conftest import FRAME_SIZE, frame_offset, make_entries

ONE_SEGMENT = WalOptions(segment_size=1 << 16)


def _path(io: FileIO, seq: int) -> Path:
    return Path(io.local_path(segment_name(seq)))


def _write_one_per_group(io: FileIO, n: int, options: WalOptions = ONE_SEGMENT) -> None:
    with Log.open(io, options) as log:
        for e in make_entries(1, n + 1):
            log.append([e])  # each append is its own group: waited for before the next


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _assert_recovers(io: FileIO, last: int) -> Log:
    log = Log.open(io, ONE_SEGMENT)
    assert log.last_index == last
    assert log.read(1, last + 1) == make_entries(1, last + 1)
    return log


@pytest.mark.parametrize("cut", [1, 7, 8, FRAME_SIZE // 2, FRAME_SIZE - 1])
def test_a_frame_cut_mid_write_is_truncated_and_the_log_stays_appendable(
        wal_io: FileIO, cut: int) -> None:
    _write_one_per_group(wal_io, 5)
    path = _path(wal_io, 1)
    with path.open("r+b") as f:
        f.truncate(frame_offset(4) + cut)
    with _assert_recovers(wal_io, 4) as log:
        torn = log.recovery.torn_tail
        assert torn is not None and torn.offset == frame_offset(4) and torn.dropped_bytes == cut
        assert path.stat().st_size == frame_offset(4)
        log.append(make_entries(5, 8))
    with _assert_recovers(wal_io, 7):
        pass


@pytest.mark.parametrize("tail", [b"\0" * 4096, b"\xde\xad\xbe\xef" * 100, b"W" * 300])
def test_garbage_or_zeros_after_the_last_frame_are_a_torn_tail(
        wal_io: FileIO, tail: bytes) -> None:
    _write_one_per_group(wal_io, 3)
    with _path(wal_io, 1).open("ab") as f:
        f.write(tail)
    with _assert_recovers(wal_io, 3) as log:
        torn = log.recovery.torn_tail
        assert torn is not None
        assert (torn.offset, torn.dropped_bytes, torn.nonzero) == (
            frame_offset(3), len(tail), any(tail))
        log.append(make_entries(4, 5))
    with _assert_recovers(wal_io, 4):
        pass


def test_a_bit_flip_in_the_last_frame_is_indistinguishable_from_a_torn_write(
        wal_io: FileIO) -> None:
    _write_one_per_group(wal_io, 3)
    _flip(_path(wal_io, 1), frame_offset(2) + 20)
    with _assert_recovers(wal_io, 2) as log:
        assert log.recovery.torn_tail is not None


def test_a_hole_inside_the_final_group_is_a_torn_write(wal_io: FileIO) -> None:
    with Log.open(wal_io, ONE_SEGMENT) as log:
        log.append(make_entries(1, 3))
        log.append(make_entries(3, 7))  # one group: frames 2..5
    # A crash can persist a later page of a group before an earlier one.
    data = bytearray(_path(wal_io, 1).read_bytes())
    data[frame_offset(3):frame_offset(4)] = bytes(FRAME_SIZE)
    _path(wal_io, 1).write_bytes(bytes(data))
    with _assert_recovers(wal_io, 3) as log:
        torn = log.recovery.torn_tail
        assert torn is not None and torn.offset == frame_offset(3) and torn.nonzero


@pytest.mark.parametrize("where", [0, 5, 12, FRAME_SIZE - 3])
def test_a_bit_flip_followed_by_a_later_group_is_corruption_naming_file_and_offset(
        wal_io: FileIO, where: int) -> None:
    _write_one_per_group(wal_io, 6)
    path = _path(wal_io, 1)
    _flip(path, frame_offset(2) + where)
    with pytest.raises(CorruptionError) as info:
        Log.open(wal_io, ONE_SEGMENT)
    message = str(info.value)
    assert str(path) in message
    assert re.search(rf"at offset {frame_offset(2)}\b", message), message
    assert "later write group" in message


def test_a_bit_flip_in_a_closed_segment_is_corruption_even_in_its_last_frame(
        wal_io: FileIO) -> None:
    options = WalOptions(segment_size=HEADER_SIZE + 4 * FRAME_SIZE)
    _write_one_per_group(wal_io, 6, options)  # segment 1 holds 1-4, segment 2 holds 5-6
    path = _path(wal_io, 1)
    _flip(path, frame_offset(3) + 30)
    with pytest.raises(CorruptionError, match=rf"{re.escape(str(path))}: .* at offset "
                                              rf"{frame_offset(3)} in a closed segment"):
        Log.open(wal_io, options)


def test_a_closed_segment_cut_short_is_corruption(wal_io: FileIO) -> None:
    options = WalOptions(segment_size=HEADER_SIZE + 4 * FRAME_SIZE)
    _write_one_per_group(wal_io, 6, options)
    with _path(wal_io, 1).open("r+b") as f:
        f.truncate(frame_offset(3) + 10)
    with pytest.raises(CorruptionError, match=rf"offset {frame_offset(3)} in a closed segment"):
        Log.open(wal_io, options)


@pytest.mark.parametrize("seq", [1, 2])
def test_a_bad_segment_header_is_corruption(wal_io: FileIO, seq: int) -> None:
    options = WalOptions(segment_size=HEADER_SIZE + 4 * FRAME_SIZE)
    _write_one_per_group(wal_io, 6, options)
    path = _path(wal_io, seq)
    _flip(path, 17)
    with pytest.raises(CorruptionError, match=rf"{re.escape(str(path))}: header checksum "
                                              rf"mismatch at offset 0"):
        Log.open(wal_io, options)


def test_a_segment_shorter_than_its_header_is_corruption(wal_io: FileIO) -> None:
    _write_one_per_group(wal_io, 2)
    with _path(wal_io, 1).open("r+b") as f:
        f.truncate(HEADER_SIZE - 1)
    with pytest.raises(CorruptionError, match="header truncated"):
        Log.open(wal_io, ONE_SEGMENT)


def test_the_last_segment_after_a_reopen_is_judged_as_closed_once_a_newer_exists(
        wal_io: FileIO) -> None:
    _write_one_per_group(wal_io, 3)
    with _path(wal_io, 1).open("ab") as f:
        f.write(b"\xff" * 10)
    with Log.open(wal_io, ONE_SEGMENT) as log:  # cuts the tail, then writes segment 2
        log.append(make_entries(4, 5))
    with _assert_recovers(wal_io, 4) as log:
        assert log.recovery.torn_tail is None
