"""Per-rowset bloom filters: the write path asks one before loading a rowset's key index.

Kudu keeps a bloom filter of each DiskRowSet's keys and consults it before the key index, so
inserting fresh keys touches no index at all. Here a rowset's filter covers every key stored
in its file -- versions later ended by deltas included, since the write path looks for
versions, live or not -- and lives in ``rowsets/<id>.bloom`` (:func:`~.rowset.bloom_file`),
listed in the rowset's metadata. A rowset written before filters existed has none and is
simply never pruned.

Filters are built over the keys' 64-bit hashes (:func:`~pyspark_kudu.tablet.keys.key_hash`
with :data:`BLOOM_SEED`, all key columns). Two layouts, told apart by the file's version:

* **Version 2, blocked** (written since 2026-11; the layout of Putze, Sanders & Singler's
  cache-efficient filters, as in Impala, Kudu and Parquet): the filter is ``2**b`` blocks of
  512 bits (one cache line). A key's hash ``h`` picks block ``h mod 2**b`` and sets ``k`` bits
  inside it, bit ``j`` at offset ``(h * S_j mod 2**64) >> 55`` (the top 9 bits of a
  multiplicative hash with the odd salt ``S_j``: :data:`_SALTS`, fixed by this format). Adding
  or asking a key touches one cache line instead of ``k`` random ones. Measured with numpy
  2.4 on an idle 2-core machine at the default rate: adding 300,000 / 1.6M / 4M keys took
  68 / 115 / 103 ns per key (standard layout: 247 / 349 / 277), asking 71 / 132 / 116 (95 /
  254 / 351); on the same machine saturated by a cluster, adding 1.6M keys took 288 ns per
  key against 1,399. A blocked filter needs more bits for the same false-positive rate
  (keys per block vary): :func:`blocked_fp_rate` is its exact rate for ``c`` bits per key
  (measured rates came within 13% of it, ``test_bloom.py``), and :meth:`BloomFilter.sized`
  takes the fewest power-of-two blocks that reach the target, then the fewest hash bits
  ``k`` that do (1e-6 by default: 39-78 bits per key, ``k`` 7-16; 1%: 10-20 bits, ``k``
  3-7).
* **Version 1, standard** (files written before): ``k`` bit positions ``h1 + i * h2`` over
  the whole filter (double hashing, Kirsch & Mitzenmacher 2006), ``h1 = h`` and ``h2`` = ``h``
  rotated by 32 bits, made odd. Still read, and still buildable (``version=1``) for tests.

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
from pyspark_kudu.tablet import keys as _keys
from pyspark_kudu.tablet.checksums import SegmentCrcs, remember

__all__ = [
    "BLOOM_SEED",
    "DEFAULT_FP_RATE",
    "BloomFilter",
    "blocked_fp_rate",
    "bloom_hashes",
    "read_bloom",
    "write_bloom",
]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

#: Seed of the filters written now: the key index's, so that a write batch checks its keys
#: against a filter with the probe hashes it already computed (keys.probe_hashes) instead of
#: hashing every composite key a second time (10-15% of such a batch's apply, measured).
#: Persisted in every file: filters written with the earlier seed (0x626C6F6F6D) are still
#: read, their hashes computed from the key columns.
BLOOM_SEED = _keys.INDEX_SEED
DEFAULT_FP_RATE = 1e-6  # TabletOptions.bloom_fp_rate says why
MAGIC = b"KBLM"
STANDARD, BLOCKED = 1, 2  # file versions (module docstring)
VERSION = BLOCKED  # what new filters are
_HEADER = struct.Struct("<4sHHQQQQ")
_CRC = struct.Struct("<I")
_MIN_BITS = 64
_BLOCK_BITS = 512
_BLOCK_SHIFT = 9
_OFFSET_SHIFT = np.uint64(64 - _BLOCK_SHIFT)
_MAX_K = 64
_CHUNK = 1 << 18  # keys per vectorized step (standard layout): bounds the temporaries
_BLOCKED_CHUNK = 1 << 16  # keys per step (blocked): k positions each, a few MB
_BIT_BY_BIT_FROM = 1024  # fewer keys left: their remaining bits are asked at once
_WINDOW_BITS = 1 << 25  # a byte per bit while adding (blocked): at most 32 MiB at a time
_DENSE_MAX_BITS = 1 << 25  # the same bound for the standard layout's pieces
_LOW32 = np.uint64(0xFFFFFFFF)
_MASK64 = (1 << 64) - 1


def _splitmix_final(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


#: The blocked layout's salts: ``S_j`` = splitmix64's finaliser of ``(j + 1) * 0x9E3779B97F4A7C15``
#: (mod 2**64), made odd. Part of the file format: never change them.
_SALTS = np.array([_splitmix_final(((j + 1) * 0x9E3779B97F4A7C15) & _MASK64) | 1
                   for j in range(_MAX_K)], dtype=np.uint64)


def bloom_hashes(data: pa.Table | pa.RecordBatch, schema: Schema,
                 seed: int = BLOOM_SEED) -> U64:
    """The 64-bit hash of each row's key (every key column) that filters are built from.

    Looked up in :mod:`~pyspark_kudu.tablet.keys` at each call, not imported: a batch's
    probes stand in for these hashes (``keys.probe_hashes``), so the two must be one
    function, also wherever a test replaces it."""
    return _keys.key_hash(data, schema, seed)


def _bits_needed(num_keys: int, fp_rate: float) -> int:
    return math.ceil(max(num_keys, 1) * -math.log(fp_rate) / (math.log(2) ** 2))


def _num_hashes(fp_rate: float) -> int:
    return max(1, round(-math.log2(fp_rate)))


def blocked_fp_rate(bits_per_key: float, k: int) -> float:
    """The false-positive rate of a blocked filter (512-bit blocks, ``k`` bits per key,
    offsets independent and uniform) holding ``bits_per_key`` bits per key: the standard
    filter's rate of one block, averaged over the Poisson number of keys a block gets."""
    lam = _BLOCK_BITS / bits_per_key
    spread = 12 * math.sqrt(lam) + 20
    lo, hi = max(0, int(lam - spread)), int(lam + spread) + 1
    miss = 1 - 1 / _BLOCK_BITS
    log_p = -lam + lo * math.log(lam) - math.lgamma(lo + 1)  # P(lo keys), in logs
    total = 0.0
    for i in range(lo, hi):
        if i > lo:
            log_p += math.log(lam / i)
        total += math.exp(log_p) * (1 - miss ** (i * k)) ** k
    return total


def _fewest_hashes(bits_per_key: float, fp_rate: float) -> int | None:
    """The fewest ``k`` whose blocked rate at ``bits_per_key`` is at most ``fp_rate``, or
    None if none is (the rate falls with ``k`` up to its optimum, then rises)."""
    prev = 2.0
    for k in range(1, _MAX_K + 1):
        rate = blocked_fp_rate(bits_per_key, k)
        if rate <= fp_rate:
            return k
        if rate >= prev:
            return None
        prev = rate
    return None


def _blocked_shape(num_keys: int, fp_rate: float) -> tuple[int, int]:
    """(blocks, k) of a blocked filter for ``num_keys`` keys at ``fp_rate``: the fewest
    power-of-two blocks for which some ``k`` reaches the rate, and the fewest such ``k``."""
    n = max(num_keys, 1)
    blocks = 1 << max(0, math.ceil(math.log2(max(n / _BLOCK_BITS, 1))))  # >= 1 bit per key
    while True:
        k = _fewest_hashes(blocks * _BLOCK_BITS / n, fp_rate)
        if k is not None:
            return blocks, k
        blocks *= 2


class BloomFilter:
    """A bloom filter over 64-bit key hashes (module docstring). Build with :meth:`sized`."""

    def __init__(self, bits: npt.NDArray[np.uint8], k: int, seed: int = BLOOM_SEED,
                 num_keys: int = 0, version: int = VERSION) -> None:
        num_bits = len(bits) * 8
        least = _BLOCK_BITS if version == BLOCKED else _MIN_BITS
        if version not in (STANDARD, BLOCKED):
            raise ValueError(f"no bloom filter layout {version}")
        if num_bits < least or num_bits & (num_bits - 1):
            raise ValueError(f"a bloom filter needs a power of two >= {least} bits, "
                             f"not {num_bits}")
        if not 1 <= k <= _MAX_K:
            raise ValueError(f"a bloom filter needs 1 to {_MAX_K} hash functions, not {k}")
        self.bits = bits
        self.k = k
        self.seed = seed
        self.num_keys = num_keys
        self.version = version

    @classmethod
    def sized(cls, expected_keys: int, fp_rate: float = DEFAULT_FP_RATE,
              seed: int = BLOOM_SEED, version: int = VERSION) -> BloomFilter:
        """An empty filter for up to ``expected_keys`` keys at ``fp_rate`` false positives."""
        if not 0 < fp_rate < 1:
            raise ValueError(f"fp_rate must be between 0 and 1, not {fp_rate}")
        if version == STANDARD:
            num_bits = max(_MIN_BITS,
                           1 << (_bits_needed(expected_keys, fp_rate) - 1).bit_length())
            return cls(np.zeros(num_bits // 8, dtype=np.uint8), _num_hashes(fp_rate), seed,
                       version=STANDARD)
        blocks, k = _blocked_shape(expected_keys, fp_rate)
        return cls(np.zeros(blocks * _BLOCK_BITS // 8, dtype=np.uint8), k, seed,
                   version=version)

    @property
    def num_bits(self) -> int:
        return len(self.bits) * 8

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)

    def add(self, hashes: U64) -> None:
        """Add the keys with these hashes (while the rowset is being written)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        if self.version == BLOCKED:
            self._add_blocked(hashes)
        else:
            self._add_standard(hashes)
        self.num_keys += len(hashes)

    def may_contain(self, hashes: U64) -> Mask:
        """False where a key is certainly absent; True where it may be present."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        if self.version == STANDARD:
            return self._may_contain_standard(hashes)
        out = np.zeros(len(hashes), dtype=bool)
        for start in range(0, len(hashes), _BLOCKED_CHUNK):
            out[start + self._blocked_hits(hashes[start:start + _BLOCKED_CHUNK])] = True
        return out

    def _blocked_hits(self, hashes: U64) -> I64:
        """Which of ``hashes`` (indexes) have all ``k`` bits set. One bit at a time, over
        the keys whose bits so far were all set: an absent key fails its first bit with
        the probability that a bit is clear (0.65-0.9 at the default rate), so a batch of
        fresh keys costs about one bit per key rather than ``k``. Measured on 393,216 absent
        keys against a filter of 830,000 (``k`` 12): 43 ns per key, against 1,029 for all
        ``k`` bits of every key at once (both on a machine busy with a cluster).

        Each step is a few numpy calls, so the remaining bits are asked all at once when
        few keys are left (:data:`_BIT_BY_BIT_FROM`) or when most keys passed a bit (a
        batch of keys that are present, as in updates, would pass every step)."""
        block = (hashes & np.uint64((self.num_bits >> _BLOCK_SHIFT) - 1)) << np.uint64(
            _BLOCK_SHIFT)
        n = len(hashes)
        alive: I64 = np.arange(n, dtype=np.int64)
        salts = _SALTS[:self.k]
        for j, salt in enumerate(salts):
            if len(alive) < _BIT_BY_BIT_FROM or (j and 2 * len(alive) > n):
                pos = block[:, None] | ((hashes[:, None] * salts[None, j:]) >> _OFFSET_SHIFT)
                bits = self.bits[pos >> np.uint64(3)] >> (pos & np.uint64(7)).astype(np.uint8)
                hit: I64 = alive[(bits & np.uint8(1)).all(axis=1)]
                return hit
            pos = block | ((hashes * salt) >> _OFFSET_SHIFT)
            bit = self.bits[pos >> np.uint64(3)] >> (pos & np.uint64(7)).astype(np.uint8)
            keep = np.flatnonzero(bit & np.uint8(1))
            if len(keep) < len(alive):
                alive, hashes, block = alive[keep], hashes[keep], block[keep]
        return alive

    # -- blocked layout (version 2) --------------------------------------------------------
    def _blocked_positions(self, hashes: U64) -> I64:
        """Bit positions, one row of ``k`` per key, all inside the key's block."""
        block = (hashes & np.uint64((self.num_bits >> _BLOCK_SHIFT) - 1)) << np.uint64(
            _BLOCK_SHIFT)
        offsets = (hashes[:, None] * _SALTS[None, :self.k]) >> _OFFSET_SHIFT
        pos: I64 = (block[:, None] | offsets).view(np.int64)
        return pos

    def _add_blocked(self, hashes: U64) -> None:
        # One bool per bit of a window of the filter, set where the keys' bits go and packed
        # into it: k writes per key inside one 512-byte stretch, no scattered bit-OR. Keys
        # are grouped by window first (a radix sort of small integers) when the filter is
        # larger than one window, so memory stays bounded whatever the filter's size.
        window = min(self.num_bits, _WINDOW_BITS)
        windows = self.num_bits // window
        if windows == 1:
            groups = [(0, hashes)]
        else:
            win_shift = np.uint64((window >> _BLOCK_SHIFT).bit_length() - 1)
            which = (hashes & np.uint64((self.num_bits >> _BLOCK_SHIFT) - 1)) >> win_shift
            which = which.astype(np.uint16 if windows <= 1 << 16 else np.int64)
            ordered = hashes[np.argsort(which, kind="stable")]
            ends = np.cumsum(np.bincount(which, minlength=windows))
            groups = [(w, ordered[ends[w] - c:ends[w]])
                      for w, c in enumerate(np.diff(ends, prepend=0)) if c]
        flags = np.zeros(window, dtype=bool)
        for w, part in groups:
            lo = w * window
            if w:
                flags[:] = False
            for start in range(0, len(part), _BLOCKED_CHUNK):
                pos = self._blocked_positions(part[start:start + _BLOCKED_CHUNK])
                flags[(pos - lo).ravel()] = True
            self.bits[lo // 8:(lo + window) // 8] |= np.packbits(flags, bitorder="little")

    # -- standard layout (version 1) -------------------------------------------------------
    def _positions(self, hashes: U64) -> tuple[U64, U64]:
        h1 = np.asarray(hashes, dtype=np.uint64)
        h2 = ((h1 >> np.uint64(32)) | ((h1 & _LOW32) << np.uint64(32))) | np.uint64(1)
        return h1, h2

    def _add_standard(self, hashes: U64) -> None:
        mask = np.uint64(self.num_bits - 1)
        # Set one bool per bit and pack them unless the keys are few for the filter's size:
        # a scattered OR costs ~130 ns per key and hash (numpy 2.4, measured).
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

    def _may_contain_standard(self, hashes: U64) -> Mask:
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

    # -- files -----------------------------------------------------------------------------
    def to_bytes(self, check: int) -> bytes:
        head = _HEADER.pack(MAGIC, self.version, self.k, self.seed, self.num_bits,
                            self.num_keys, check)
        body = head + self.bits.tobytes()
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> tuple[BloomFilter, int]:
        """The filter and its ``check`` value.

        Raises:
            CorruptionError: the bytes are not a whole, undamaged filter of a known version.
        """
        if len(data) < _HEADER.size + _CRC.size:
            raise CorruptionError(f"bloom filter {where} is truncated ({len(data)} bytes)")
        magic, version, k, seed, num_bits, num_keys, check = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptionError(f"{where} is not a bloom filter (magic {magic!r})")
        if version not in (STANDARD, BLOCKED):
            raise CorruptionError(f"bloom filter {where} has version {version}; this build"
                                  f" reads {STANDARD} and {BLOCKED}")
        if len(data) != _HEADER.size + num_bits // 8 + _CRC.size or num_bits % 8:
            raise CorruptionError(f"bloom filter {where} has {len(data)} bytes, its header"
                                  f" says {num_bits} bits")
        (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
        if zlib.crc32(data[:-_CRC.size]) != crc:
            raise CorruptionError(f"bloom filter {where} failed its CRC")
        bits = np.frombuffer(data, dtype=np.uint8, count=num_bits // 8,
                             offset=_HEADER.size).copy()
        try:
            return cls(bits, k, seed, num_keys, version), check
        except ValueError as e:
            raise CorruptionError(f"bloom filter {where}: {e}") from e


def write_bloom(fileio: FileIO, name: str, bloom: BloomFilter, check: int) -> int:
    """Write ``bloom`` to ``name`` durably (fsync); returns the file size. Like the rowset
    file, it is published by the superblock that lists it (the caller syncs the directory)."""
    data = bloom.to_bytes(check)
    with fileio.open(name, mode="wb") as f:
        f.write(data)
        fileio.fsync(f)
    if fileio.is_local:  # for a tablet copy (:mod:`~pyspark_kudu.tablet.checksums`)
        crcs = SegmentCrcs()
        crcs.update(data)
        remember(fileio.local_path(name), crcs.value())
    return len(data)


def read_bloom(fileio: FileIO, name: str) -> tuple[BloomFilter, int]:
    """The filter in ``name`` and its ``check`` value.

    Raises:
        CorruptionError: the file is damaged (see :meth:`BloomFilter.from_bytes`).
        OSError: the file cannot be read.
    """
    return BloomFilter.from_bytes(fileio.read_bytes(name), fileio.path(name))
