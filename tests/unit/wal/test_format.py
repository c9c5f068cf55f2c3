"""Byte layout of segments and frames (pyspark_kudu.wal.format)."""

from __future__ import annotations

import pytest

from pyspark_kudu.consensus.messages import Entry, EntryType
from pyspark_kudu.errors import CorruptionError, InvalidArgumentError, NotSupportedError
from pyspark_kudu.wal.format import (
    FRAME_OVERHEAD,
    HEADER_SIZE,
    check_header,
    decode_entry,
    encode_header,
    frame_chunks,
    parse_frame,
    parse_segment_name,
    prepare_frame,
    segment_name,
)


def _frame_bytes(entry: Entry, offset: int = HEADER_SIZE) -> bytes:
    return b"".join(frame_chunks(prepare_frame(entry), group_start=offset))


@pytest.mark.parametrize("entry", [
    Entry(3, 7, EntryType.NORMAL, b"payload"),
    Entry(0, 0),
    Entry(2**63, 2**64 - 1, EntryType.CONF_CHANGE, bytes(range(256))),
])
def test_a_frame_decodes_to_the_entry_it_encodes(entry: Entry) -> None:
    frame = _frame_bytes(entry)
    assert len(frame) == FRAME_OVERHEAD + len(entry.data)
    assert decode_entry(frame, HEADER_SIZE, "seg") == entry


def test_every_single_bit_flip_in_a_frame_is_detected() -> None:
    frame = _frame_bytes(Entry(1, 5, data=b"abc"))
    for bit in range(len(frame) * 8):
        damaged = bytearray(frame)
        damaged[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(parse_frame(bytes(damaged), 0, len(damaged), base=HEADER_SIZE), str)


def test_a_frame_cut_short_is_reported_not_raised() -> None:
    frame = _frame_bytes(Entry(1, 5, data=b"abcdef"))
    assert parse_frame(frame[:5], 0, 5) == "partial frame header"
    assert "past the end" in str(parse_frame(frame[:-1], 0, len(frame) - 1, base=HEADER_SIZE))


def test_decoding_a_damaged_frame_raises_corruption_naming_file_and_offset() -> None:
    frame = bytearray(_frame_bytes(Entry(1, 5, data=b"abc"), offset=100))
    frame[-9] ^= 0xFF
    with pytest.raises(CorruptionError, match=r"seg-x: checksum mismatch at offset 100"):
        decode_entry(bytes(frame), 100, "seg-x")


def test_entries_too_large_or_with_64_bit_overflow_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="does not fit 64 bits"):
        prepare_frame(Entry(1, 2**64))


def test_segment_header_round_trips_and_checks_its_sequence_number() -> None:
    header = encode_header(42)
    assert len(header) == HEADER_SIZE
    check_header(header, "f", 42)
    with pytest.raises(CorruptionError, match="sequence 42 at offset 0"):
        check_header(header, "f", 43)


def test_damaged_or_short_headers_are_corruption() -> None:
    header = bytearray(encode_header(1))
    with pytest.raises(CorruptionError, match="header truncated"):
        check_header(bytes(header[:10]), "f", 1)
    header[12] ^= 1
    with pytest.raises(CorruptionError, match="header checksum mismatch at offset 0"):
        check_header(bytes(header), "f", 1)
    with pytest.raises(CorruptionError, match="bad magic"):
        check_header(b"X" + encode_header(1)[1:], "f", 1)


def test_an_intact_header_of_a_newer_version_is_not_supported() -> None:
    import struct

    import google_crc32c

    body = struct.pack("<8sHHQ", b"PKUDUWAL", 99, 0, 1)
    header = body + struct.pack("<I", google_crc32c.value(body))
    with pytest.raises(NotSupportedError, match="format version 99"):
        check_header(header, "f", 1)


def test_segment_names_sort_numerically_and_other_files_are_not_segments() -> None:
    assert segment_name(7) == "000000007.log"
    assert parse_segment_name("000000007.log") == 7
    assert parse_segment_name("000000007.log.tmp") is None
    assert parse_segment_name("meta") is None
