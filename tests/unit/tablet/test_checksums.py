"""Segment checksums taken as a tablet's files are written (tablet/checksums.py): what a tablet
copy's manifest carries without reading the files back."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import google_crc32c
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_kudu.fileio import FileIO
from pyspark_kudu.tablet import checksums
from pyspark_kudu.tablet.bloom import BloomFilter, write_bloom
from pyspark_kudu.tablet.parquet_files import write_parquet


def _by_segment(data: bytes, seg: int) -> tuple[int, ...]:
    return tuple(google_crc32c.value(data[o:o + seg]) for o in range(0, len(data), seg))


def _fresh(path: Path) -> tuple[int, ...]:
    """The file's segment CRCs as read from disk now, whatever the memo says."""
    return _by_segment(path.read_bytes(), checksums.SEGMENT_BYTES)


@pytest.mark.parametrize("size", [0, 1, 99, 100, 101, 250, 300])
def test_a_files_segment_crcs_are_the_crc32c_of_each_segments_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int,
) -> None:
    """Computed over a memory map in slices: equal to each segment's CRC32C, at and around
    segment and slice boundaries."""
    monkeypatch.setattr(checksums, "SEGMENT_BYTES", 100)
    monkeypatch.setattr(checksums, "_CRC_STEP", 30)
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert checksums.segment_crcs(str(tmp_path / "f")) == _by_segment(data, 100)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=700), cuts=st.lists(st.integers(0, 700), max_size=8))
def test_crcs_fed_in_any_pieces_are_the_segments_crcs(data: bytes, cuts: list[int]) -> None:
    old = checksums.SEGMENT_BYTES
    checksums.SEGMENT_BYTES = 128
    try:
        crcs = checksums.SegmentCrcs()
        bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
        for a, b in itertools.pairwise(bounds):
            crcs.update(data[a:b])
        assert crcs.value() == _by_segment(data, 128)
    finally:
        checksums.SEGMENT_BYTES = old


def test_rowset_and_bloom_writers_remember_their_files_crcs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Parquet file written through the rowset writer and a bloom filter file are known to
    the memo with the CRCs of their bytes on disk (several segments each), so a copy's
    staging reads neither back."""
    monkeypatch.setattr(checksums, "SEGMENT_BYTES", 4096)
    io = FileIO(str(tmp_path))
    table = pa.table({"id": pa.array(range(20_000), pa.int64()),
                      "v": [f"value {i}" for i in range(20_000)]})
    write_parquet(io, "rs.parquet", table, 5_000)
    bloom = BloomFilter.sized(20_000)
    write_bloom(io, "rs.bloom", bloom, 7)
    for name in ("rs.parquet", "rs.bloom"):
        path = tmp_path / name
        got = checksums.known(str(path))
        assert got is not None, f"{name}: its writer did not remember its checksums"
        assert got == _fresh(path) and len(got) > 1, name

    def no_read(*_: object) -> None:
        raise AssertionError("a remembered file was read back")

    monkeypatch.setattr(checksums.mmap, "mmap", no_read)
    os.link(tmp_path / "rs.parquet", tmp_path / "linked")  # how a copy stages it
    assert checksums.segment_crcs(str(tmp_path / "linked")) == _fresh(tmp_path / "rs.parquet")


def test_a_changed_file_is_not_answered_from_the_memo(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * 1000)
    checksums.remember(str(path), (123,))  # deliberately wrong: only the memo could say it
    assert checksums.segment_crcs(str(path)) == (123,)
    path.write_bytes(b"b" * 1001)
    assert checksums.segment_crcs(str(path)) == _fresh(path)


def test_the_memo_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksums, "MAX_FILES", 3)
    paths = []
    for k in range(5):
        p = tmp_path / f"f{k}"
        p.write_bytes(bytes([k]) * 10)
        checksums.remember(str(p), (k,))
        paths.append(p)
    assert checksums.known(str(paths[0])) is None and checksums.known(str(paths[1])) is None
    assert [checksums.known(str(p)) for p in paths[2:]] == [(2,), (3,), (4,)]
