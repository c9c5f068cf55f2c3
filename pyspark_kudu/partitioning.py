"""Partitioning: hash buckets over primary-key columns, then optional range partitions.

The layout follows Kudu:

- Zero or more **hash dimensions**, each hashing a set of primary-key columns into
  ``num_buckets`` buckets (at least 2). A column may appear in at most one dimension.
- **Range partitions** over ``range_columns`` (primary-key columns, the whole key by default)
  with explicit bounds: ``lower`` inclusive, ``upper`` exclusive, ``None`` unbounded. Ranges may
  leave gaps but may not overlap. Without ranges there is one unbounded range.
- The tablets are the cross product, numbered by ``(bucket_0, ..., bucket_k, range)`` in
  lexicographic order, i.e. like Kudu's partition keys (hash buckets first, then the range).

Routing is deterministic across processes, machines and releases: the bucket is
:func:`hash_columns` (a fixed 64-bit hash implemented with numpy over the Arrow buffers, never
Python's salted ``hash()``) modulo the bucket count. Changing that function would misroute
existing data, so tests pin its output values.

Thread-safety: :class:`PartitionSchema` and :class:`Partitioner` are immutable after
construction and safe to share between threads.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError
from pyspark_kudu.schema import (
    ARROW_CAST_ERRORS,
    Predicate,
    PredicateOp,
    Schema,
    values_from_json,
    values_to_json,
)

__all__ = [
    "HashDimension",
    "Partition",
    "PartitionSchema",
    "Partitioner",
    "RangePartition",
    "hash_columns",
    "predicate_interval",
    "predicate_value_sets",
]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

# splitmix64 finaliser constants (Steele et al.); any fixed odd constants would do, these mix well.
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SALT_INT = np.uint64(0x243F6A8885A308D3)
_SALT_BYTES = np.uint64(0x13198A2E03707344)
_SALT_DEC = np.uint64(0xA4093822299F31D0)
_NULL_HASH = np.uint64(0x082EFA98EC4E6C89)
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_MAX_PRUNE_COMBINATIONS = 256
_SHORT_WORDS = 8  # words hashed position by position; longer tails take the flattened path


def _fmix(z: U64) -> U64:
    """splitmix64's finaliser, elementwise, wrapping modulo 2**64 (numpy arrays never warn)."""
    z = z ^ (z >> np.uint64(30))
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _int_words(arr: pa.Array) -> U64:
    t = arr.type
    if pa.types.is_date32(t):
        arr = arr.cast(pa.int32())
    if not pa.types.is_int64(arr.type):
        arr = arr.cast(pa.int64())
    vals = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return _fmix(vals.view(np.uint64) ^ _SALT_INT)


def _decimal_words(arr: pa.Array) -> U64:
    n = len(arr)
    buf = arr.buffers()[1]
    words = np.frombuffer(buf, dtype="<u8")[2 * arr.offset: 2 * (arr.offset + n)].reshape(n, 2)
    return _fmix(words[:, 0] ^ _fmix(words[:, 1] ^ _SALT_DEC))


def _word_mix(words: U64, remaining: I64, j: I64 | int) -> U64:
    """Mix 8-byte words (bytes past ``remaining`` zeroed) with their position ``j``."""
    rem = np.minimum(remaining, 8).astype(np.uint64)
    mask = np.full(len(words), _ALL_ONES, dtype=np.uint64)
    partial = rem < 8
    mask[partial] = (np.uint64(1) << (np.uint64(8) * rem[partial])) - np.uint64(1)
    pos = _fmix(np.atleast_1d(np.asarray(j, dtype=np.int64)).astype(np.uint64) + _GOLDEN)
    return _fmix((words & mask) ^ (pos if isinstance(j, np.ndarray) else pos[0]))


def _bytes_words(arr: pa.Array) -> U64:
    """Hash variable-length values without a Python loop over rows.

    A value is cut into 8-byte little-endian words (zero-padded); word ``j`` is mixed with its
    position, a row's mixed words are summed (mod 2**64) and the sum is mixed with the length.
    Words are read with one gather through a byte-strided ``uint64`` view of the data buffer.
    The sum is order-free, so the per-position loop for short values and the flattened path
    for long values compute the same function.
    """
    if pa.types.is_string(arr.type):
        arr = arr.cast(pa.binary())
    elif pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_binary())
    n = len(arr)
    bufs = arr.buffers()
    off_dtype = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offs = np.frombuffer(bufs[1], dtype=off_dtype)[arr.offset: arr.offset + n + 1].astype(np.int64)
    starts = offs[:-1]
    lens = offs[1:] - starts
    h = _fmix(lens.astype(np.uint64) ^ _SALT_BYTES)
    nwords = (lens + 7) // 8
    max_words = int(nwords.max()) if n else 0
    if max_words == 0:
        return _fmix(h)  # the general formula with an empty word sum
    pad = np.zeros(int(offs[-1]) + 8, dtype=np.uint8)
    pad[: int(offs[-1])] = np.frombuffer(bufs[2], dtype=np.uint8)[: int(offs[-1])]
    words8 = np.ndarray(shape=(len(pad) - 7,), dtype="<u8", buffer=pad, strides=(1,))
    sums = np.zeros(n, dtype=np.uint64)
    for j in range(min(max_words, _SHORT_WORDS)):
        active = nwords > j
        if active.all():
            sums += _word_mix(words8[starts + 8 * j], lens - 8 * j, j)
        else:
            idx = np.nonzero(active)[0]
            sums[idx] += _word_mix(words8[starts[idx] + 8 * j], lens[idx] - 8 * j, j)
    if max_words > _SHORT_WORDS:
        long_rows = np.nonzero(nwords > _SHORT_WORDS)[0]
        extra = nwords[long_rows] - _SHORT_WORDS
        row = np.repeat(long_rows, extra)
        first = np.cumsum(extra) - extra
        j = _SHORT_WORDS + np.arange(int(extra.sum()), dtype=np.int64) - np.repeat(first, extra)
        mixed = _word_mix(words8[starts[row] + 8 * j], lens[row] - 8 * j, j)
        sums[long_rows] += np.add.reduceat(mixed, first)
    return _fmix(h ^ sums)


def _column_hash(arr: pa.Array | pa.ChunkedArray) -> U64:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        h = _int_words(arr)
    elif pa.types.is_decimal128(t):
        h = _decimal_words(arr)
    elif (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
          or pa.types.is_large_binary(t)):
        h = _bytes_words(arr)
    else:
        raise InvalidArgumentError(
            f"cannot hash a column of type {t}: hash partitioning needs primary-key columns"
            " (integer, decimal, string, binary, timestamp or date)"
        )
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        h = np.where(valid, h, _NULL_HASH)
    return h


def hash_columns(columns: Sequence[pa.Array | pa.ChunkedArray], seed: int = 0) -> U64:
    """The deterministic 64-bit hash of each row of ``columns`` (equal lengths), as ``uint64``.

    Equal values of the same Arrow type hash equally in every process; the result depends
    on the column types, so cast to the schema's types first (the :class:`Partitioner` does).
    """
    if not columns:
        raise InvalidArgumentError("hash_columns needs at least one column")
    n = len(columns[0])
    h = _fmix(np.full(n, np.uint64(seed & 0xFFFFFFFFFFFFFFFF), dtype=np.uint64) ^ _GOLDEN)
    for i, col in enumerate(columns):
        if len(col) != n:
            raise InvalidArgumentError("hash_columns: columns have different lengths")
        h = _fmix((h * _GOLDEN) ^ (_column_hash(col) + np.uint64(i + 1)))
    return h


# -- the partition schema -----------------------------------------------------------------


def _small_ints(values: npt.NDArray[np.int64], bound: int) -> npt.NDArray[Any]:
    """``values`` (all in ``[0, bound)``) in the narrowest unsigned type that holds them."""
    for t in (np.uint8, np.uint16):
        if bound <= np.iinfo(t).max + 1:
            return values.astype(t)
    return values


@dataclass(frozen=True)
class HashDimension:
    """Rows hashed on ``columns`` into ``num_buckets`` buckets (``HASH (...) PARTITIONS n``)."""

    columns: tuple[str, ...]
    num_buckets: int
    seed: int = 0

    def __post_init__(self) -> None:
        cols = (self.columns,) if isinstance(self.columns, str) else tuple(self.columns)
        object.__setattr__(self, "columns", cols)
        if not cols:
            raise InvalidArgumentError("a hash dimension needs at least one column")
        if self.num_buckets < 2:
            raise InvalidArgumentError(
                f"hash dimension on {list(cols)} has {self.num_buckets} buckets; use at least 2"
            )


@dataclass(frozen=True)
class RangePartition:
    """Rows with ``lower <= range key < upper`` (tuples over the range columns; None = open)."""

    lower: tuple[Any, ...] | None = None
    upper: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("lower", "upper"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(v) if isinstance(v, list) else (v,))

    def describe(self) -> str:
        lo = "" if self.lower is None else f"{_fmt(self.lower)} <= "
        hi = "" if self.upper is None else f" < {_fmt(self.upper)}"
        return f"{lo}VALUES{hi}" if (lo or hi) else "UNBOUNDED"


def _fmt(t: tuple[Any, ...]) -> str:
    return repr(t[0]) if len(t) == 1 else repr(t)


@dataclass(frozen=True)
class PartitionSchema:
    """Hash dimensions plus range partitions; bind it to a schema with :class:`Partitioner`.

    ``range_columns=None`` means "the primary key" when ranges are given.
    """

    hash_dimensions: tuple[HashDimension, ...] = ()
    range_columns: tuple[str, ...] | None = None
    ranges: tuple[RangePartition, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash_dimensions", tuple(self.hash_dimensions))
        object.__setattr__(self, "ranges", tuple(self.ranges))
        if self.range_columns is not None:
            rc = self.range_columns
            object.__setattr__(self, "range_columns", (rc,) if isinstance(rc, str) else tuple(rc))

    def to_dict(self, schema: Schema) -> dict[str, Any]:
        rcols = _range_columns(self, schema)
        types = [schema.column(c).type for c in rcols]

        def bound(b: tuple[Any, ...] | None) -> list[Any] | None:
            if b is None:
                return None
            return [values_to_json(t, [v])[0] for t, v in zip(types, b, strict=True)]

        return {
            "hash": [{"columns": list(d.columns), "buckets": d.num_buckets, "seed": d.seed}
                     for d in self.hash_dimensions],
            "range_columns": list(rcols),
            "ranges": [{"lower": bound(r.lower), "upper": bound(r.upper)} for r in self.ranges],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], schema: Schema) -> PartitionSchema:
        rcols = tuple(d.get("range_columns", ()))
        types = [schema.column(c).type for c in rcols]

        def bound(b: list[Any] | None) -> tuple[Any, ...] | None:
            if b is None:
                return None
            return tuple(values_from_json(t, [v])[0].as_py() for t, v in zip(types, b, strict=True))

        return cls(
            tuple(HashDimension(tuple(h["columns"]), int(h["buckets"]), int(h.get("seed", 0)))
                  for h in d.get("hash", ())),
            rcols,
            tuple(RangePartition(bound(r["lower"]), bound(r["upper"]))
                  for r in d.get("ranges", ())),
        )


def _range_columns(ps: PartitionSchema, schema: Schema) -> tuple[str, ...]:
    if ps.range_columns is not None:
        return ps.range_columns
    return schema.primary_key if ps.ranges else ()


@dataclass(frozen=True)
class Partition:
    """One tablet's slice: a bucket per hash dimension and one range partition."""

    index: int
    hash_buckets: tuple[int, ...]
    range_index: int
    range: RangePartition

    def describe(self, partition_schema: PartitionSchema) -> str:
        parts = [f"HASH ({', '.join(d.columns)}) PARTITION {b}"
                 for d, b in zip(partition_schema.hash_dimensions, self.hash_buckets, strict=True)]
        parts.append(f"RANGE ({', '.join(partition_schema.range_columns or ())}) PARTITION "
                     f"{self.range.describe()}")
        return ", ".join(parts)


class Partitioner:
    """A :class:`PartitionSchema` validated against a :class:`Schema`; routes rows and prunes.

    Raises:
        InvalidArgumentError: a column is not a primary-key column, appears in two hash
            dimensions, a bound has the wrong arity or type, or two ranges overlap.
    """

    def __init__(self, schema: Schema, partition_schema: PartitionSchema) -> None:
        self.schema = schema
        rcols = _range_columns(partition_schema, schema)
        self.partition_schema = PartitionSchema(
            partition_schema.hash_dimensions, rcols, partition_schema.ranges)
        seen: set[str] = set()
        for dim in partition_schema.hash_dimensions:
            for c in dim.columns:
                self._check_key_column(c, "hash")
                if c in seen:
                    raise InvalidArgumentError(
                        f"column {c!r} appears in more than one hash dimension; each key column"
                        " may be hashed in one dimension only"
                    )
                seen.add(c)
        for c in rcols:
            self._check_key_column(c, "range")
        if len(set(rcols)) != len(rcols):
            raise InvalidArgumentError(f"range columns {list(rcols)} name a column twice")
        self.range_columns = rcols
        ranges = [self._bind_range(r) for r in partition_schema.ranges] or [RangePartition()]
        ranges.sort(key=lambda r: (r.lower is not None, r.lower or ()))
        for a, b in itertools.pairwise(ranges):
            if a.upper is None or b.lower is None or b.lower < a.upper:
                raise InvalidArgumentError(
                    f"range partitions [{a.describe()}] and [{b.describe()}] overlap; make"
                    " every range's lower bound at least the previous range's upper bound"
                )
        self.ranges: tuple[RangePartition, ...] = tuple(ranges)
        dims = partition_schema.hash_dimensions
        self.partitions: tuple[Partition, ...] = tuple(
            Partition(i, buckets, r, ranges[r])
            for i, (buckets, r) in enumerate(
                (b, r) for b in itertools.product(*(range(d.num_buckets) for d in dims))
                 for r in range(len(ranges)))
        )

    def _check_key_column(self, c: str, what: str) -> None:
        self.schema.column(c)
        if not self.schema.is_key(c):
            raise InvalidArgumentError(
                f"{what} partition column {c!r} is not a primary key column; partition on key"
                f" columns only ({list(self.schema.primary_key)})"
            )

    def _bind_range(self, r: RangePartition) -> RangePartition:
        def bind(b: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
            if b is None:
                return None
            if len(b) != len(self.range_columns):
                raise InvalidArgumentError(
                    f"range bound {b!r} has {len(b)} values but the range columns are"
                    f" {list(self.range_columns)}; give one value per range column"
                )
            out = []
            for c, v in zip(self.range_columns, b, strict=True):
                out.append(Predicate.eq(c, v).bind(self.schema).value)
            return tuple(out)

        lo, hi = bind(r.lower), bind(r.upper)
        if lo is not None and hi is not None and not lo < hi:
            raise InvalidArgumentError(
                f"range partition [{r.describe()}] is empty: the lower bound must be below the"
                " upper bound"
            )
        return RangePartition(lo, hi)

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    # -- routing ------------------------------------------------------------------------
    def _key_array(self, data: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
        if name not in data.schema.names:
            raise InvalidArgumentError(
                f"cannot route rows without primary key column {name!r}; include it"
            )
        col = data.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        want = self.schema.column(name).type
        if col.type == want:
            return col
        try:
            return col.cast(want)
        except ARROW_CAST_ERRORS as e:
            raise InvalidArgumentError(
                f"key column {name!r}: cannot convert {col.type} values to the table's "
                f"{want} ({e}); cast the data first") from e

    def route_batch(self, data: pa.Table | pa.RecordBatch) -> I64:
        """Partition index of every row (vectorized); ``-1`` where no range partition covers it."""
        n = data.num_rows
        idx = np.zeros(n, dtype=np.int64)
        for dim in self.partition_schema.hash_dimensions:
            h = hash_columns([self._key_array(data, c) for c in dim.columns], dim.seed)
            bucket = (h % np.uint64(dim.num_buckets)).astype(np.int64)
            idx = idx * dim.num_buckets + bucket
        rng = self._range_index(data, n)
        out = idx * len(self.ranges) + rng
        out[rng < 0] = -1
        return out

    def _range_index(self, data: pa.Table | pa.RecordBatch, n: int) -> I64:
        if len(self.ranges) == 1 and self.ranges[0] == RangePartition():
            return np.zeros(n, dtype=np.int64)
        cols = [self._key_array(data, c) for c in self.range_columns]
        out = np.full(n, -1, dtype=np.int64)
        for i, r in enumerate(self.ranges):
            mask = np.ones(n, dtype=bool)
            if r.lower is not None:
                mask &= ~_lex_less(cols, r.lower)
            if r.upper is not None:
                mask &= _lex_less(cols, r.upper)
            out[mask] = i
        return out

    def route_row(self, row: Mapping[str, Any]) -> int:
        """Partition index of one row given as ``{column: value}`` (key columns suffice).

        Raises:
            NotFoundError: no range partition covers the row.
        """
        needed = {c for d in self.partition_schema.hash_dimensions for c in d.columns}
        needed |= set(self.range_columns)
        arrays, names = [], []
        for c in self.schema.primary_key:
            if c in needed:
                if c not in row:
                    raise InvalidArgumentError(f"row {dict(row)!r} lacks key column {c!r}")
                arrays.append(pa.array([row[c]], type=self.schema.column(c).type))
                names.append(c)
        table = pa.table(arrays, names=names) if names else pa.table({"_": [0]})
        p = int(self.route_batch(table)[0])
        if p < 0:
            raise NotFoundError(
                f"No tablet covering the requested range partition for row {dict(row)!r}:"
                " add a range partition that covers it"
            )
        return p

    def split_batch(self, data: pa.Table | pa.RecordBatch) -> dict[int, pa.Table]:
        """Rows grouped by partition index, in input order within each group.

        Rows no range covers are returned under key ``-1`` so the caller can report them
        (Kudu reports them per row as ``NotFound``).
        """
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        pidx = self.route_batch(table)
        # numpy's stable sort of 8- or 16-bit integers is a radix sort, ~5x faster than on
        # int64. Indexes are shifted by one so that -1 (no range) sorts first.
        order = np.argsort(_small_ints(pidx + 1, self.num_partitions + 1), kind="stable")
        keys, starts = np.unique(pidx[order], return_index=True)
        taken = table.take(pa.array(order))
        bounds = [*starts.tolist(), len(order)]
        return {int(k): taken.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))
                for i, k in enumerate(keys)}

    # -- pruning ------------------------------------------------------------------------
    def prune(self, predicates: Iterable[Predicate]) -> list[int]:
        """Indices of the partitions that may hold rows matching all ``predicates``.

        Equality (or small ``IN``) on every column of a hash dimension selects its buckets;
        equality on all range columns selects one range, other comparisons on the leading
        range column select the overlapping ranges. Equality on the whole primary key thus
        yields exactly one partition. Pruning is conservative: it never drops a partition
        that could hold a match.
        """
        bound = [p.bind(self.schema) for p in predicates]
        if any(p.op is PredicateOp.IS_NULL and self.schema.is_key(p.column) for p in bound):
            return []
        values = predicate_value_sets(bound)
        if any(v is not None and not v for v in values.values()):
            return []
        bucket_sets: list[Iterable[int]] = []
        for dim in self.partition_schema.hash_dimensions:
            sets = [values.get(c) for c in dim.columns]
            if any(s is None for s in sets) or _product_size(sets) > _MAX_PRUNE_COMBINATIONS:
                bucket_sets.append(range(dim.num_buckets))
                continue
            combos = list(itertools.product(*(sorted(s or ()) for s in sets)))
            arrays = [pa.array([c[i] for c in combos], type=self.schema.column(col).type)
                      for i, col in enumerate(dim.columns)]
            buckets = hash_columns(arrays, dim.seed) % np.uint64(dim.num_buckets)
            bucket_sets.append(sorted({int(b) for b in buckets}))
        ranges = self._prune_ranges(bound, values)
        allowed = set(ranges)
        out = []
        for p in self.partitions:
            if p.range_index in allowed and all(
                    b in s for b, s in zip(p.hash_buckets, bucket_sets, strict=True)):
                out.append(p.index)
        return out

    def _prune_ranges(self, bound: list[Predicate],
                      values: dict[str, set[Any] | None]) -> list[int]:
        all_ranges = list(range(len(self.ranges)))
        if not self.range_columns:
            return all_ranges
        sets = [values.get(c) for c in self.range_columns]
        if all(s is not None for s in sets) and _product_size(sets) <= _MAX_PRUNE_COMBINATIONS:
            hits = set()
            for combo in itertools.product(*(sorted(s or ()) for s in sets)):
                for i, r in enumerate(self.ranges):
                    if ((r.lower is None or r.lower <= combo)
                            and (r.upper is None or combo < r.upper)):
                        hits.add(i)
            return sorted(hits)
        lo, lo_inc, hi, hi_inc = predicate_interval(bound, self.range_columns[0])
        # With one range column, the partition's first-column values are [L0, U0). With more,
        # rows whose first column equals U0 can still sort below the full upper bound, so the
        # first-column interval is [L0, U0] and pruning stays conservative.
        multi = len(self.range_columns) > 1
        out = []
        for i, r in enumerate(self.ranges):
            if r.lower is not None and hi is not None:
                first = r.lower[0]
                if hi < first or (hi == first and not hi_inc):
                    continue
            if r.upper is not None and lo is not None:
                top = r.upper[0]
                if lo > top or (lo == top and (not multi or not lo_inc)):
                    continue
            out.append(i)
        return out


def _lex_less(cols: list[pa.Array], bound: tuple[Any, ...]) -> npt.NDArray[np.bool_]:
    """Vectorized ``row_key < bound`` in lexicographic order over ``cols``."""
    result: pa.Array | None = None
    for col, b in reversed(list(zip(cols, bound, strict=True))):
        s = pa.scalar(b, type=col.type)
        lt = pc.less(col, s)
        result = lt if result is None else pc.or_(lt, pc.and_(pc.equal(col, s), result))
    assert result is not None
    return np.asarray(result.to_numpy(zero_copy_only=False), dtype=bool)


def predicate_value_sets(preds: list[Predicate]) -> dict[str, set[Any] | None]:
    """Per column, the finite set of values equality/IN predicates allow (intersected)."""
    out: dict[str, set[Any] | None] = {}
    for p in preds:
        if p.op is PredicateOp.EQ:
            s = {p.value}
        elif p.op is PredicateOp.IN:
            s = set(p.value)
        else:
            continue
        prev = out.get(p.column)
        out[p.column] = s if prev is None else prev & s
    return out


def _product_size(sets: Sequence[set[Any] | None]) -> int:
    n = 1
    for s in sets:
        n *= len(s or ())
    return n


def predicate_interval(preds: list[Predicate], column: str) -> tuple[Any, bool, Any, bool]:
    """``(lo, lo_inclusive, hi, hi_inclusive)`` implied for ``column`` (None = unbounded)."""
    lo: Any = None
    hi: Any = None
    lo_inc = hi_inc = True
    for p in preds:
        if p.column != column:
            continue
        cands: list[tuple[str, Any, bool]] = []
        if p.op is PredicateOp.EQ:
            cands = [("lo", p.value, True), ("hi", p.value, True)]
        elif p.op is PredicateOp.IN and p.value:
            cands = [("lo", min(p.value), True), ("hi", max(p.value), True)]
        elif p.op in (PredicateOp.GT, PredicateOp.GE):
            cands = [("lo", p.value, p.op is PredicateOp.GE)]
        elif p.op in (PredicateOp.LT, PredicateOp.LE):
            cands = [("hi", p.value, p.op is PredicateOp.LE)]
        for side, v, inc in cands:
            if side == "lo" and (lo is None or v > lo or (v == lo and not inc)):
                lo, lo_inc = v, inc
            if side == "hi" and (hi is None or v < hi or (v == hi and not inc)):
                hi, hi_inc = v, inc
    return lo, lo_inc, hi, hi_inc
