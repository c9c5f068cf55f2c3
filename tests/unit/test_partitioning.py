"""Partitioning: the pinned deterministic hash, row and batch routing, validation, pruning."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError
from pyspark_kudu.partitioning import (
    HashDimension,
    Partitioner,
    PartitionSchema,
    RangePartition,
    hash_columns,
)
from pyspark_kudu.schema import ColumnSchema, Predicate, Schema

# -- the hash --------------------------------------------------------------------------------

MASK = (1 << 64) - 1
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
GOLDEN, SALT_INT, SALT_BYTES = 0x9E3779B97F4A7C15, 0x243F6A8885A308D3, 0x13198A2E03707344


def fmix(z: int) -> int:
    z ^= z >> 30
    z = (z * M1) & MASK
    z ^= z >> 27
    z = (z * M2) & MASK
    return z ^ (z >> 31)


def ref_int(v: int) -> int:
    return fmix((v & MASK) ^ SALT_INT)


def ref_bytes(b: bytes) -> int:
    """The documented definition of the string hash, one row at a time in pure Python."""
    total = 0
    for j in range(0, (len(b) + 7) // 8):
        word = int.from_bytes(b[8 * j: 8 * j + 8].ljust(8, b"\0"), "little")
        total = (total + fmix(word ^ fmix((j + GOLDEN) & MASK))) & MASK
    return fmix(fmix(len(b) ^ SALT_BYTES) ^ total)


def ref_row(column_hashes: list[int], seed: int = 0) -> int:
    h = fmix((seed & MASK) ^ GOLDEN)
    for i, ch in enumerate(column_hashes):
        h = fmix(((h * GOLDEN) & MASK) ^ ((ch + i + 1) & MASK))
    return h


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.binary(max_size=90), min_size=1, max_size=30),
       ints=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=30, max_size=30),
       seed=st.integers(0, 2**32))
def test_vectorized_hash_equals_its_row_by_row_definition(values: list[bytes], ints: list[int],
                                                          seed: int) -> None:
    ints = ints[: len(values)]
    got = hash_columns([pa.array(ints, pa.int64()), pa.array(values, pa.binary())], seed)
    want = [ref_row([ref_int(i), ref_bytes(v)], seed) for i, v in zip(ints, values, strict=True)]
    assert got.tolist() == want


def test_hash_values_are_pinned_because_routing_depends_on_them() -> None:
    assert hash_columns([pa.array([0, 1, -1, 2**62], pa.int64())]).tolist() == [
        10961997097024233136, 12080024112716537761, 7406337355664814620, 2960784646755898025]
    assert hash_columns([pa.array(["", "a", "kudu", "x" * 17])]).tolist() == [
        9310872165419545931, 10938382512030856834, 17793505526410354420, 5037352205485384432]
    assert hash_columns([pa.array([1, 2], pa.int32()), pa.array(["a", "b"])], seed=5).tolist() == [
        17214808143904859710, 17124431980261664870]
    assert hash_columns([pa.array([Decimal("1.50"), Decimal("-2.25")],
                                  pa.decimal128(10, 2))]).tolist() == [
        3123923198523728251, 7689632514151230164]
    assert hash_columns([pa.array([dt.date(2024, 1, 1)]),
                         pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us"))]).tolist() == [
        9738791564537949484]


def test_hash_is_identical_in_a_process_with_another_hash_seed() -> None:
    code = ("import pyarrow as pa; from pyspark_kudu.partitioning import hash_columns;"
            "print(hash_columns([pa.array(['a', 'bb' * 40]), pa.array([7, 8])], 3).tolist())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    here = hash_columns([pa.array(["a", "bb" * 40]), pa.array([7, 8])], 3).tolist()
    assert out.strip() == str(here)


def test_hash_ignores_slicing_and_chunking() -> None:
    arr = pa.array([f"value-{i}" * (i % 5) for i in range(50)])
    whole = hash_columns([arr])
    assert hash_columns([arr.slice(10, 20)]).tolist() == whole[10:30].tolist()
    chunked = pa.chunked_array([arr.slice(0, 7), arr.slice(7)])
    assert hash_columns([chunked]).tolist() == whole.tolist()
    assert hash_columns([arr.cast(pa.large_string())]).tolist() == whole.tolist()


def test_hash_rejects_non_key_types() -> None:
    with pytest.raises(InvalidArgumentError, match="cannot hash a column of type double"):
        hash_columns([pa.array([1.5])])


# -- the partitioner ---------------------------------------------------------------------------

SCHEMA = Schema(
    (
        ColumnSchema("host", "string", nullable=False),
        ColumnSchema("metric", "int32", nullable=False),
        ColumnSchema("ts", pa.timestamp("us"), nullable=False),
        ColumnSchema("value", "double"),
    ),
    ("host", "metric", "ts"),
)
T0 = dt.datetime(2024, 1, 1)
T1 = dt.datetime(2024, 2, 1)
T2 = dt.datetime(2024, 3, 1)


def partitioner() -> Partitioner:
    return Partitioner(SCHEMA, PartitionSchema(
        hash_dimensions=(HashDimension(("host",), 3), HashDimension(("metric",), 2, seed=9)),
        range_columns=("ts",),
        ranges=(RangePartition((T1,), (T2,)), RangePartition(None, (T0,)),
                RangePartition((T0,), (T1,))),
    ))


def rows(n: int, seed: int = 0) -> pa.Table:
    rnd = np.random.default_rng(seed)
    start = np.datetime64("2023-12-01")
    return pa.table({
        "host": [f"host-{i}" for i in rnd.integers(0, 40, n)],
        "metric": pa.array(rnd.integers(0, 10, n), pa.int32()),
        "ts": pa.array(start + rnd.integers(0, 120 * 86400, n).astype("timedelta64[s]"),
                       pa.timestamp("us")),
        "value": rnd.random(n),
    })


def test_partitions_are_the_cross_product_in_partition_key_order() -> None:
    p = partitioner()
    assert p.num_partitions == 3 * 2 * 3
    assert [r.lower for r in p.ranges] == [None, (T0,), (T1,)]  # sorted by lower bound
    assert p.partitions[7].hash_buckets == (1, 0) and p.partitions[7].range_index == 1
    assert p.partitions[7].describe(p.partition_schema) == (
        "HASH (host) PARTITION 1, HASH (metric) PARTITION 0, RANGE (ts) PARTITION "
        "datetime.datetime(2024, 1, 1, 0, 0) <= VALUES < datetime.datetime(2024, 2, 1, 0, 0)")


def test_vectorized_routing_agrees_with_row_routing() -> None:
    p = partitioner()
    table = rows(300)
    routed = p.route_batch(table)
    for i, row in enumerate(table.to_pylist()):
        if routed[i] < 0:
            with pytest.raises(NotFoundError, match="No tablet covering"):
                p.route_row(row)
        else:
            assert p.route_row(row) == routed[i]
    part = p.partitions[int(routed[0])]
    ts = table.column("ts")[0].as_py()
    r = p.ranges[part.range_index]
    assert (r.lower is None or r.lower <= (ts,)) and (r.upper is None or (ts,) < r.upper)


def test_rows_beyond_every_range_are_reported_not_dropped() -> None:
    p = partitioner()
    table = rows(500, seed=1)
    groups = p.split_batch(table)
    assert sum(g.num_rows for g in groups.values()) == 500
    uncovered = groups[-1].column("ts").to_pylist()
    assert uncovered and all(t >= T2 for t in uncovered)
    counts = [g.num_rows for k, g in groups.items() if k >= 0]
    assert len(counts) == 18 and min(counts) > 0



@pytest.mark.parametrize("buckets", [6, 254, 255, 300, 70_000])
def test_split_groups_rows_by_tablet_in_input_order_whatever_the_tablet_count(
        buckets: int) -> None:
    # Tablet indexes are sorted as 8-bit, 16-bit or 64-bit integers depending on the count.
    p = Partitioner(SCHEMA, PartitionSchema((HashDimension(("host", "metric"), buckets),)))
    n = 20_000
    table = pa.table({"host": [f"h{i}" for i in range(n)],
                      "metric": pa.array(np.arange(n) % 17, pa.int32()),
                      "seq": pa.array(np.arange(n), pa.int64())})
    routed = p.route_batch(table)
    groups = p.split_batch(table)
    assert sum(g.num_rows for g in groups.values()) == n
    for k, g in groups.items():
        want = np.flatnonzero(routed == k)
        assert g.column("seq").to_numpy().tolist() == want.tolist(), k

def test_hash_buckets_spread_keys_evenly() -> None:
    p = Partitioner(SCHEMA, PartitionSchema((HashDimension(("host", "metric"), 8),)))
    n = 40_000
    table = pa.table({"host": [f"h{i}" for i in range(n)],
                      "metric": pa.array(np.arange(n) % 17, pa.int32())})
    counts = np.bincount(p.route_batch(table), minlength=8)
    assert counts.min() > 0.9 * n / 8


@pytest.mark.parametrize("ps, message", [
    (PartitionSchema((HashDimension(("value",), 2),)), "'value' is not a primary key column"),
    (PartitionSchema((HashDimension(("host",), 2), HashDimension(("host", "ts"), 2))),
     "'host' appears in more than one hash dimension"),
    (PartitionSchema(range_columns=("ts",), ranges=(RangePartition((T0,), (T2,)),
                                                    RangePartition((T1,), None))), "overlap"),
    (PartitionSchema(range_columns=("ts",), ranges=(RangePartition((T1,), (T0,)),)), "is empty"),
    (PartitionSchema(range_columns=("ts",), ranges=(RangePartition((T0, 1), None),)),
     "has 2 values but the range columns are ['ts']"),
    (PartitionSchema(range_columns=("metric",), ranges=(RangePartition(("x",), None),)),
     "not a valid int32"),
])
def test_invalid_partition_schemas_are_rejected(ps: PartitionSchema, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        Partitioner(SCHEMA, ps)
    assert message in str(e.value)


def test_hash_dimension_needs_two_buckets() -> None:
    with pytest.raises(InvalidArgumentError, match="use at least 2"):
        HashDimension(("host",), 1)


def test_partition_schema_round_trips_through_json_form() -> None:
    p = partitioner()
    d = p.partition_schema.to_dict(SCHEMA)
    back = Partitioner(SCHEMA, PartitionSchema.from_dict(d, SCHEMA))
    assert back.partitions == p.partitions


def test_full_primary_key_equality_prunes_to_the_routed_partition() -> None:
    p = partitioner()
    for row in rows(40, seed=3).to_pylist():
        if row["ts"] >= T2:
            continue
        preds = [Predicate.eq(k, row[k]) for k in SCHEMA.primary_key]
        assert p.prune(preds) == [p.route_row(row)]


def test_range_predicates_prune_ranges_and_in_lists_prune_buckets() -> None:
    p = partitioner()
    kept = p.prune([Predicate.ge("ts", T1)])
    assert {p.partitions[i].range_index for i in kept} == {2}
    kept = p.prune([Predicate.in_("host", ["host-1", "host-2"]), Predicate.lt("ts", T0)])
    assert {p.partitions[i].range_index for i in kept} == {0}
    assert len({p.partitions[i].hash_buckets[0] for i in kept}) <= 2
    assert p.prune([Predicate.is_null("host")]) == []
    assert p.prune([Predicate.in_("metric", [])]) == []
    assert len(p.prune([Predicate.gt("value", 0.5)])) == 18


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_pruning_never_drops_a_partition_holding_a_matching_row(data: st.DataObject) -> None:
    p = Partitioner(SCHEMA, PartitionSchema(
        (HashDimension(("metric",), 3),), ("host", "metric"),
        (RangePartition(None, ("host-2", 5)), RangePartition(("host-2", 5), ("host-3", 0)),
         RangePartition(("host-3", 0), None))))
    table = rows(60, seed=data.draw(st.integers(0, 1000)))
    table = table.set_column(0, "host", pa.array([f"host-{i % 5}" for i in range(60)]))
    host = st.sampled_from([f"host-{i}" for i in range(6)])
    metric = st.integers(0, 10)
    preds = data.draw(st.lists(st.one_of(
        st.builds(Predicate.eq, st.just("host"), host),
        st.builds(Predicate.ge, st.just("host"), host),
        st.builds(Predicate.lt, st.just("host"), host),
        st.builds(Predicate.gt, st.just("host"), host),
        st.builds(Predicate.le, st.just("host"), host),
        st.builds(Predicate.eq, st.just("metric"), metric),
        st.builds(Predicate.in_, st.just("metric"), st.lists(metric, max_size=3)),
    ), max_size=3))
    kept = set(p.prune(preds))
    matching = table.filter(_and([q.to_expression(SCHEMA) for q in preds])) if preds else table
    assert set(p.route_batch(matching).tolist()) <= kept


def _and(exprs: list[object]) -> object:
    out = exprs[0]
    for e in exprs[1:]:
        out = out & e  # type: ignore[operator]
    return out
