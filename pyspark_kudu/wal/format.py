"""Byte layout of WAL segments: the segment header and the CRC32C-framed entries.

A segment ``<tablet>/wal/<seq>.log`` (``seq`` zero-padded to 9 digits, DESIGN §5) is::

    header  (24 bytes)
        magic        8s   b"PKUDUWAL"
        version      u16  FORMAT_VERSION (1)
        flags        u16  0, reserved
        seq          u64  the sequence number, also in the file name
        header_crc   u32  CRC32C of the 20 bytes above
    frame*
        len          u32  payload length in bytes
        crc          u32  CRC32C of the 4 ``len`` bytes followed by the payload
        payload      len bytes:
            tag          u8   0x57 ("W"), a cheap filter when scanning for frames
            entry_type   u8   0 = NORMAL, 1 = CONF_CHANGE
            term         u64
            index        u64
            data         len - 26 bytes, the entry's ``data``
            group_start  u64  offset in this segment of the first frame of the write group
                              (one write + one sync by the sync thread) this frame belongs to
    zeros               the preallocated, not yet written tail (truncated when the segment closes)

All integers are little-endian. ``crc`` covers ``len`` so that a flipped length cannot pass as
a shorter or longer valid frame. ``group_start`` comes last because the sync thread only learns
it when it forms the group: it then extends the CRC the appender computed over everything
before it (CRC32C can be continued, not prefixed), so appenders do the expensive part.
How recovery uses ``group_start`` to tell a torn tail from corruption is described in
:mod:`pyspark_kudu.wal.segment`.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from pyspark_kudu.consensus.messages import Entry, EntryType
from pyspark_kudu.errors import CorruptionError, InvalidArgumentError, NotSupportedError

__all__ = [
    "FORMAT_VERSION",
    "FRAME_OVERHEAD",
    "HEADER_SIZE",
    "FrameView",
    "PreparedFrame",
    "check_header",
    "decode_entry",
    "encode_header",
    "entry_size_of_frame",
    "frame_chunks",
    "parse_frame",
    "parse_segment_name",
    "prepare_frame",
    "segment_name",
]

SEGMENT_MAGIC = b"PKUDUWAL"
FORMAT_VERSION = 1
SEGMENT_SUFFIX = ".log"
TMP_SUFFIX = ".tmp"

_HEADER = struct.Struct("<8sHHQ")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _CRC.size

_FRAME_HEADER = struct.Struct("<II")
_ENTRY_HEAD = struct.Struct("<BBQQ")
_GROUP = struct.Struct("<Q")
FRAME_TAG = 0x57
FRAME_TAG_BYTE = bytes([FRAME_TAG])
FRAME_HEADER_SIZE = _FRAME_HEADER.size
PAYLOAD_OVERHEAD = _ENTRY_HEAD.size + _GROUP.size
FRAME_OVERHEAD = FRAME_HEADER_SIZE + PAYLOAD_OVERHEAD
MAX_PAYLOAD = 1 << 30
"""Sanity bound on one frame; a larger ``len`` field can only be damage."""

_EMPTY_ENTRY_SIZE = Entry(term=0, index=0).size()
_TYPE_CODES = {EntryType.NORMAL: 0, EntryType.CONF_CHANGE: 1}
_CODE_TYPES = {code: t for t, code in _TYPE_CODES.items()}


# -- names ---------------------------------------------------------------------------------


def segment_name(seq: int) -> str:
    return f"{seq:09d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The sequence number of a segment file name, or None for any other file."""
    stem = name[: -len(SEGMENT_SUFFIX)] if name.endswith(SEGMENT_SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


# -- segment header ------------------------------------------------------------------------


def encode_header(seq: int) -> bytes:
    body = _HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, seq)
    return body + _CRC.pack(google_crc32c.value(body))


def check_header(buf: bytes, where: str, seq: int) -> None:
    """Validate the header at the start of ``buf`` for segment ``seq``.

    Raises:
        CorruptionError: short, wrong magic, bad CRC or a sequence number that does not match
            the file name (segments only appear under their final name once their header is
            durable, so none of these can be a torn write).
        NotSupportedError: an intact header of a newer format version.
    """
    if len(buf) < HEADER_SIZE:
        raise CorruptionError(
            f"WAL segment {where}: header truncated at offset {len(buf)} "
            f"(need {HEADER_SIZE} bytes)"
        )
    magic, version, _flags, found_seq = _HEADER.unpack_from(buf, 0)
    (crc,) = _CRC.unpack_from(buf, _HEADER.size)
    if magic != SEGMENT_MAGIC:
        raise CorruptionError(f"WAL segment {where}: bad magic {magic!r} at offset 0")
    if google_crc32c.value(buf[: _HEADER.size]) != crc:
        raise CorruptionError(f"WAL segment {where}: header checksum mismatch at offset 0")
    if version != FORMAT_VERSION:
        raise NotSupportedError(
            f"WAL segment {where} has format version {version}; this build reads version "
            f"{FORMAT_VERSION} only: upgrade pyspark-kudu on this host"
        )
    if found_seq != seq:
        raise CorruptionError(
            f"WAL segment {where}: header says sequence {found_seq} at offset 0, "
            f"the file name says {seq}"
        )


# -- frames --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedFrame:
    """An entry encoded by its appender, waiting for the sync thread to add ``group_start``.

    Immutable, so thread-safe.

    ``partial_crc`` is the CRC32C of ``len`` + ``head`` + ``entry.data``; :func:`frame_chunks`
    extends it over the group field.
    """

    entry: Entry
    len_bytes: bytes
    head: bytes
    partial_crc: int

    @property
    def size(self) -> int:
        return FRAME_OVERHEAD + len(self.entry.data)


def prepare_frame(entry: Entry) -> PreparedFrame:
    """Encode ``entry`` up to its group field (run by the appender, outside any lock).

    Raises:
        InvalidArgumentError: the entry is too large or its term/index do not fit 64 bits.
    """
    length = PAYLOAD_OVERHEAD + len(entry.data)
    if length > MAX_PAYLOAD:
        raise InvalidArgumentError(
            f"log entry {entry.index} has {len(entry.data)} bytes of data; "
            f"the WAL limit is {MAX_PAYLOAD - PAYLOAD_OVERHEAD}: split the batch"
        )
    try:
        head = _ENTRY_HEAD.pack(FRAME_TAG, _TYPE_CODES[entry.type], entry.term, entry.index)
    except struct.error as e:
        raise InvalidArgumentError(
            f"log entry term {entry.term} / index {entry.index} does not fit 64 bits"
        ) from e
    len_bytes = _CRC.pack(length)
    crc = google_crc32c.extend(google_crc32c.value(len_bytes), head)
    if entry.data:
        crc = google_crc32c.extend(crc, entry.data)
    return PreparedFrame(entry, len_bytes, head, crc)


def frame_chunks(frame: PreparedFrame, group_start: int) -> tuple[bytes, bytes, bytes, bytes]:
    """The byte pieces of ``frame`` as it is written in a group starting at ``group_start``."""
    group = _GROUP.pack(group_start)
    crc = google_crc32c.extend(frame.partial_crc, group)
    return frame.len_bytes + _CRC.pack(crc), frame.head, frame.entry.data, group


@dataclass(frozen=True, slots=True)
class FrameView:
    """What recovery needs of a valid frame; ``data`` stays on disk. Immutable."""

    offset: int
    size: int
    term: int
    index: int
    group_start: int


def parse_frame(buf: bytes, pos: int, end: int, base: int = 0) -> FrameView | str:
    """Validate the frame at ``buf[pos:]`` (file offset ``base + pos``).

    Returns the frame, or a short reason why no valid frame starts there (never raises:
    the caller decides whether that is a torn tail or corruption).
    """
    if end - pos < FRAME_HEADER_SIZE:
        return "partial frame header"
    length, crc = _FRAME_HEADER.unpack_from(buf, pos)
    if length < PAYLOAD_OVERHEAD or length > MAX_PAYLOAD:
        return f"bad frame length {length}"
    stop = pos + FRAME_HEADER_SIZE + length
    if stop > end:
        return f"frame of {length} bytes runs past the end of the file"
    if buf[pos + FRAME_HEADER_SIZE] != FRAME_TAG:
        return "bad frame tag"
    actual = google_crc32c.extend(
        google_crc32c.value(buf[pos:pos + 4]), buf[pos + FRAME_HEADER_SIZE:stop]
    )
    if actual != crc:
        return "checksum mismatch"
    _tag, code, term, index = _ENTRY_HEAD.unpack_from(buf, pos + FRAME_HEADER_SIZE)
    (group_start,) = _GROUP.unpack_from(buf, stop - _GROUP.size)
    if code not in _CODE_TYPES:
        return f"unknown entry type code {code}"
    if not HEADER_SIZE <= group_start <= base + pos:
        return f"bad group offset {group_start}"
    return FrameView(base + pos, stop - pos, term, index, group_start)


def decode_entry(buf: bytes, offset: int, where: str, pos: int = 0, size: int | None = None
                 ) -> Entry:
    """Decode the frame read back from file offset ``offset`` of segment ``where``: the
    ``size`` bytes at ``buf[pos:]`` (all of ``buf`` by default; a run of adjacent frames is
    read at once and decoded in place, not copied frame by frame first).

    Raises:
        CorruptionError: the frame fails its checksum or structural checks (it passed them
            at recovery, so the file changed under us).
    """
    end = len(buf) if size is None else pos + size
    view = parse_frame(buf, pos, end, base=offset - pos)
    if isinstance(view, str) or view.size != end - pos:
        reason = view if isinstance(view, str) else "frame length changed"
        raise CorruptionError(f"WAL segment {where}: {reason} at offset {offset}")
    code = buf[pos + FRAME_HEADER_SIZE + 1]
    data = buf[pos + FRAME_HEADER_SIZE + _ENTRY_HEAD.size:end - _GROUP.size]
    return Entry(term=view.term, index=view.index, type=_CODE_TYPES[code], data=data)


def entry_size_of_frame(frame_size: int) -> int:
    """``Entry.size()`` of the entry stored in a frame of ``frame_size`` bytes."""
    return _EMPTY_ENTRY_SIZE + frame_size - FRAME_OVERHEAD
