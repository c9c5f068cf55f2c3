"""Key orders: ``keys.stable_order`` (probes) and ``keys.sort_order`` (rows by key columns)
give exactly the orders of numpy's stable argsort and Arrow's ``sort_indices``."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_kudu.tablet import keys as keys_module


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
@pytest.mark.parametrize("values", ["distinct", "few-repeats", "many-repeats", "tiny",
                                    "small-repeats"])
def test_stable_order_is_numpys_stable_argsort(dtype: type, values: str) -> None:
    """``stable_order`` takes a faster, unstable sort when the values are distinct or nearly
    so: with repeated values (versions of one key, or hash collisions) it must still keep
    equal values in their original order, which an unstable sort of 100,000 values does
    not -- whether it mends a few runs, sorts many repeats stably, or sorts a small input."""
    rng = np.random.default_rng(3)
    n = {"tiny": 2, "small-repeats": 300}.get(values, 100_000)
    a = rng.integers(0, 2**62, size=n).astype(dtype)
    if values == "few-repeats":
        a[rng.integers(0, n, 20)] = a[rng.integers(0, n, 20)]
    elif values in ("many-repeats", "small-repeats"):
        a = (a % (n // 100)).astype(dtype)
    want = np.argsort(a, kind="stable")
    if values in ("few-repeats", "many-repeats"):
        assert not np.array_equal(np.argsort(a), want)  # the case the mending is for
    got = keys_module.stable_order(a)
    assert got.dtype == np.int64
    assert np.array_equal(got, want)


_FEW = 5  # distinct values per column in the drawn tables: rows tie on leading columns


def _columns(rng: np.random.Generator, n: int) -> dict[str, pa.Array]:
    """One column of each type a key (or ``__kudu_ts``) may have, few distinct values each,
    with negative numbers, empty strings, shared prefixes and bytes above 0x7f."""
    ints = rng.integers(-_FEW, _FEW, n)
    words = np.array(["", "a", "ab", "b", "\u00e9t\u00e9", "A"])[rng.integers(0, 6, n)]
    return {
        "i8": pa.array(ints.astype(np.int8)),
        "u64": pa.array(ints.astype(np.uint64) + np.uint64(2**63)),
        "i64": pa.array(ints * 10**12),
        "s": pa.array(words.tolist()),
        "ls": pa.array(words.tolist(), pa.large_string()),
        "b": pa.array([w.encode() + b"\xff" * (i % 2) for w, i in zip(words, ints, strict=True)]),
        "fb": pa.array([bytes([i % 256, 7]) for i in ints.tolist()], pa.binary(2)),
        "ts": pa.array(ints * 10**6, pa.timestamp("us", tz="UTC")),
        "d32": pa.array([datetime.date(2000, 1, 1) + datetime.timedelta(days=int(i) * 400)
                         for i in ints]),
        "dec": pa.array([decimal.Decimal(int(i)).scaleb(-2) for i in ints], pa.decimal128(9, 2)),
        "bool": pa.array((ints > 0).tolist()),
    }


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300),
       picks=st.lists(st.sampled_from(["i8", "u64", "i64", "s", "ls", "b", "fb", "ts", "d32",
                                       "dec", "bool"]), min_size=1, max_size=4, unique=True),
       chunks=st.integers(1, 3))
def test_sort_order_is_arrows_sort_indices(seed: int, n: int, picks: list[str],
                                           chunks: int) -> None:
    """Whatever the key columns' types, and across a table's chunks: rows in the order
    Arrow's ``sort_indices`` gives, ties (equal on every column) in row order."""
    rng = np.random.default_rng(seed)
    cols = _columns(rng, n)
    table = pa.table({c: cols[c] for c in picks})
    if chunks > 1 and n:
        cut = sorted(rng.integers(0, n, chunks - 1).tolist())
        bounds = zip([0, *cut], [*cut, n], strict=True)
        table = pa.concat_tables([table.slice(a, b - a) for a, b in bounds])
    want = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in picks]).to_numpy()
    got = keys_module.sort_order(table, picks)
    assert got.dtype == np.int64
    assert np.array_equal(got, want)


def test_sort_order_takes_arrows_sort_where_a_column_has_nulls_or_no_integer_order() -> None:
    table = pa.table({"x": [3, None, 1, 3], "f": [0.5, -1.0, 2.0, float("nan")],
                      "y": ["b", "a", "c", "a"]})
    for cols in (["x", "y"], ["f"], ["y", "f"]):
        want = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in cols]).to_numpy()
        assert np.array_equal(keys_module.sort_order(table, cols), want), cols
