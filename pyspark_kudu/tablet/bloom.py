"""Per-rowset bloom filters: the write path asks one before loading a rowset's key index.

Kudu keeps a bloom filter of each DiskRowSet's keys and consults it before the key index, so
inserting fresh keys touches no index at all. Here a rowset's filter covers every key stored
in its file -- versions later ended by deltas included, since the write path looks for
versions, live or not -- and lives in ``rowsets/<id>.bloom`` (:func:`~.rowset.bloom_file`),
listed in the rowset's metadata. A rowset written before filters existed has none and is
simply never pruned.

The filter is a standard bloom filter over the keys' 64-bit hashes
(:func:`~pyspark_kudu.tablet.keys.key_hash` with :data:`BLOOM_SEED`, all key columns):
``k`` bit positions ``h1 + i * h2`` (double hashing, Kirsch & Mitzenmacher 2006), with
``h1 = h`` and ``h2`` = ``h`` rotated by 32 bits, made odd. The number of bits is a power of
two, at least what the target false-positive rate needs (1e-6 by default: ~29 bits per
key, ``k = 20``; 1%: ~9.6 bits, ``k = 7``); an odd ``h2`` then gives ``k`` distinct
positions, and a filter may be *folded* in half (OR of its halves) without losing a key,
which is how a filter sized in advance for a streaming compaction output shrinks to the
rows it got. Every operation is vectorized over
the keys (one numpy pass per hash function).

File format (little-endian)::

    magic "KBLM" | version u16 | k u16 | seed u64 | num_bits u64 | num_keys u64 |
    check u64 | bits (num_bits / 8 bytes) | crc32 u32 of everything before it

``check`` is the filter's hash of the rowset's first key: a reader recomputes it from the
rowset's metadata, so a file hashed differently (another hash function, another key type)
is refused instead of answering wrongly. A damaged, truncated or refused file raises
:class:`~pyspark_kudu.errors.CorruptionError`; the rowset then falls back to its key index
(slower, never wrong).

Thread-safety: a :class:`BloomFilter` is mutated (:meth:`BloomFilter.add`) only while its
rowset is being written, by one thread; afterwards it is read-only and may be shared.
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.keys import key_hash

__all__ = [
    "BLOOM_SEED",
    "DEFAULT_FP_RATE",
    "BloomFilter",
    "bloom_hashes",
    "read_bloom",
    "write_bloom",
]

U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]

BLOOM_SEED = 0x626C6F6F6D  # persisted in every file: changing it keeps old files readable
DEFAULT_FP_RATE = 1e-6  # TabletOptions.bloom_fp_rate says why
MAGIC = b"KBLM"
VERSION = 1
_HEADER = struct.Struct("<4sHHQQQQ")
_CRC = struct.Struct("<I")
_MIN_BITS = 64
_CHUNK = 1 << 18  # keys per vectorized step: bounds the temporaries to a few MB
_DENSE_MAX_BITS = 1 << 25  # a byte per bit while adding a piece: at most 32 MiB
_LOW32 = np.uint64(0xFFFFFFFF)


def bloom_hashes(data: pa.Table | pa.RecordBatch, schema: Schema,
                 seed: int = BLOOM_SEED) -> U64:
    """The 64-bit hash of each row's key (every key column) that filters are built from."""
    return key_hash(data, schema, seed)


def _bits_needed(num_keys: int, fp_rate: float) -> int:
    return math.ceil(max(num_keys, 1) * -math.log(fp_rate) / (math.log(2) ** 2))


def _num_hashes(fp_rate: float) -> int:
    return max(1, round(-math.log2(fp_rate)))


class BloomFilter:
    """A bloom filter over 64-bit key hashes (module docstring). Build with :meth:`sized`."""

    def __init__(self, bits: npt.NDArray[np.uint8], k: int, seed: int = BLOOM_SEED,
                 num_keys: int = 0) -> None:
        num_bits = len(bits) * 8
        if num_bits < _MIN_BITS or num_bits & (num_bits - 1):
            raise ValueError(f"a bloom filter needs a power of two >= {_MIN_BITS} bits, "
                             f"not {num_bits}")
        if not 1 <= k <= 64:
            raise ValueError(f"a bloom filter needs 1 to 64 hash functions, not {k}")
        self.bits = bits
        self.k = k
        self.seed = seed
        self.num_keys = num_keys

    @classmethod
    def sized(cls, expected_keys: int, fp_rate: float = DEFAULT_FP_RATE,
              seed: int = BLOOM_SEED) -> BloomFilter:
        """An empty filter for up to ``expected_keys`` keys at ``fp_rate`` false positives."""
        if not 0 < fp_rate < 1:
            raise ValueError(f"fp_rate must be between 0 and 1, not {fp_rate}")
        num_bits = max(_MIN_BITS, 1 << (_bits_needed(expected_keys, fp_rate) - 1).bit_length())
        return cls(np.zeros(num_bits // 8, dtype=np.uint8), _num_hashes(fp_rate), seed)

    @property
    def num_bits(self) -> int:
        return len(self.bits) * 8

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)

    def _positions(self, hashes: U64) -> tuple[U64, U64]:
        h1 = np.asarray(hashes, dtype=np.uint64)
        h2 = ((h1 >> np.uint64(32)) | ((h1 & _LOW32) << np.uint64(32))) | np.uint64(1)
        return h1, h2

    def add(self, hashes: U64) -> None:
        """Add the keys with these hashes (while the rowset is being written)."""
        mask = np.uint64(self.num_bits - 1)
        # Set one bool per bit and pack them (~0.7 ns per bit of the filter) unless the
        # keys are few for the filter's size: a scattered OR costs ~130 ns per key and
        # hash (numpy 2.4, measured). A compaction adds its output's keys piece by piece,
        # each a small share of the filter: dense too while the bools stay small.
        work = len(hashes) * self.k
        dense = work * 4 >= self.num_bits or (work * 64 >= self.num_bits
                                              and self.num_bits <= _DENSE_MAX_BITS)
        flags = np.zeros(self.num_bits, dtype=bool) if dense else None
        for start in range(0, len(hashes), _CHUNK):
            h1, h2 = self._positions(hashes[start:start + _CHUNK])
            pos = h1 & mask
            for _ in range(self.k):
                if flags is not None:
                    flags[pos] = True
                else:
                    np.bitwise_or.at(self.bits, pos >> np.uint64(3),
                                     np.left_shift(1, pos & np.uint64(7)).astype(np.uint8))
                pos = (pos + h2) & mask
        if flags is not None:
            self.bits |= np.packbits(flags, bitorder="little")
        self.num_keys += len(hashes)

    def may_contain(self, hashes: U64) -> Mask:
        """False where a key is certainly absent; True where it may be present."""
        out = np.ones(len(hashes), dtype=bool)
        mask = np.uint64(self.num_bits - 1)
        for start in range(0, len(hashes), _CHUNK):
            h1, h2 = self._positions(hashes[start:start + _CHUNK])
            pos = h1 & mask
            hit = out[start:start + _CHUNK]
            for _ in range(self.k):
                byte = self.bits[pos >> np.uint64(3)]
                hit &= ((byte >> (pos & np.uint64(7)).astype(np.uint8)) & 1).astype(bool)
                pos = (pos + h2) & mask
        return out

    def shrink(self, fp_rate: float = DEFAULT_FP_RATE) -> None:
        """Fold the filter in half while it keeps enough bits for its keys at ``fp_rate``.

        Position ``p`` of the large filter maps to ``p mod (m / 2)`` of the folded one,
        which is where a query against the folded filter looks: no key is lost."""
        need = max(_MIN_BITS, _bits_needed(self.num_keys, fp_rate))
        while self.num_bits // 2 >= need:
            half = len(self.bits) // 2
            self.bits = self.bits[:half] | self.bits[half:]

    def to_bytes(self, check: int) -> bytes:
        head = _HEADER.pack(MAGIC, VERSION, self.k, self.seed, self.num_bits, self.num_keys,
                            check)
        body = head + self.bits.tobytes()
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> tuple[BloomFilter, int]:
        """The filter and its ``check`` value.

        Raises:
            CorruptionError: the bytes are not a whole, undamaged filter of this version.
        """
        if len(data) < _HEADER.size + _CRC.size:
            raise CorruptionError(f"bloom filter {where} is truncated ({len(data)} bytes)")
        magic, version, k, seed, num_bits, num_keys, check = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptionError(f"{where} is not a bloom filter (magic {magic!r})")
        if version != VERSION:
            raise CorruptionError(f"bloom filter {where} has version {version}; this build"
                                  f" reads {VERSION}")
        if len(data) != _HEADER.size + num_bits // 8 + _CRC.size or num_bits % 8:
            raise CorruptionError(f"bloom filter {where} has {len(data)} bytes, its header"
                                  f" says {num_bits} bits")
        (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
        if zlib.crc32(data[:-_CRC.size]) != crc:
            raise CorruptionError(f"bloom filter {where} failed its CRC")
        bits = np.frombuffer(data, dtype=np.uint8, count=num_bits // 8,
                             offset=_HEADER.size).copy()
        try:
            return cls(bits, k, seed, num_keys), check
        except ValueError as e:
            raise CorruptionError(f"bloom filter {where}: {e}") from e


def write_bloom(fileio: FileIO, name: str, bloom: BloomFilter, check: int) -> int:
    """Write ``bloom`` to ``name`` durably (fsync); returns the file size. Like the rowset
    file, it is published by the superblock that lists it (the caller syncs the directory)."""
    data = bloom.to_bytes(check)
    with fileio.open(name, mode="wb") as f:
        f.write(data)
        fileio.fsync(f)
    return len(data)


def read_bloom(fileio: FileIO, name: str) -> tuple[BloomFilter, int]:
    """The filter in ``name`` and its ``check`` value.

    Raises:
        CorruptionError: the file is damaged (see :meth:`BloomFilter.from_bytes`).
        OSError: the file cannot be read.
    """
    return BloomFilter.from_bytes(fileio.read_bytes(name), fileio.path(name))
