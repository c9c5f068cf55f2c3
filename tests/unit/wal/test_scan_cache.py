"""Recovery's scan cache (pyspark_kudu.wal.recovery): reopening an unchanged WAL does not
read its closed segments again, and a segment whose file changed is read and checked again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import Log, WalOptions
from pyspark_kudu.wal.format import HEADER_SIZE, parse_segment_name
from pyspark_kudu.wal.recovery import scan_cache_stats

from .conftest import make_entries

SMALL = WalOptions(segment_size=1 << 12)


def _segments(io: FileIO) -> list[Path]:
    return sorted(Path(io.local_path(n)) for n in os.listdir(io.local_path())
                  if parse_segment_name(n) is not None)


def _age(paths: list[Path], seconds: float = 60.0) -> None:
    """Make the files look written a minute ago (settled: the cache may keep their scans)."""
    then = time.time() - seconds
    for p in paths:
        os.utime(p, (then, then))


def test_reopening_an_unchanged_wal_reads_no_closed_segment_again(tmp_path: Path) -> None:
    io = FileIO(str(tmp_path / "wal"))
    want = make_entries(1, 200)
    with Log.open(io, SMALL) as log:
        for e in want:
            log.append([e])
    segs = _segments(io)
    assert len(segs) >= 3, "the test needs several segments"
    _age(segs)
    Log.open(io, SMALL).close()  # scans every segment, remembers them
    before = scan_cache_stats()
    with Log.open(io, SMALL) as log:
        assert log.read(1, 200) == want
    after = scan_cache_stats()
    assert after["reads"] == before["reads"], "an unchanged segment was read again"
    assert after["hits"] - before["hits"] == len(_segments(io))


def test_a_segment_written_after_its_scan_was_remembered_is_checked_again(
        tmp_path: Path) -> None:
    io = FileIO(str(tmp_path / "wal"))
    with Log.open(io, SMALL) as log:
        for e in make_entries(1, 200):
            log.append([e])
    segs = _segments(io)
    _age(segs)
    Log.open(io, SMALL).close()
    victim = segs[1]  # a closed segment in the middle
    data = bytearray(victim.read_bytes())
    data[HEADER_SIZE + 20] ^= 0x10  # inside the first frame's payload
    victim.write_bytes(bytes(data))  # same inode and size; the write moves its times
    before = scan_cache_stats()
    with pytest.raises(CorruptionError):
        Log.open(io, SMALL)
    assert scan_cache_stats()["reads"] > before["reads"]
