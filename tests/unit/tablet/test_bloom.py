"""Per-rowset bloom filters: no false negatives, the target false-positive rate, damaged files
fall back to the key index, and writes of fresh keys stop loading key indexes."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import (
    MemoryLog,
    OpType,
    Superblock,
    Tablet,
    TabletCopySource,
    TabletOptions,
    encode_write_batch,
    install_tablet_copy,
    tablet_dir,
)
from pyspark_kudu.tablet.bloom import BloomFilter, bloom_hashes

INT_KEY = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "int64")),
                 ("id",))
STR_KEY = Schema((ColumnSchema("k", "string", nullable=False), ColumnSchema("v", "int64")),
                 ("k",))
COMPOSITE = Schema((ColumnSchema("h", "string", nullable=False),
                    ColumnSchema("r", pa.timestamp("us"), nullable=False),
                    ColumnSchema("n", "int32", nullable=False),
                    ColumnSchema("v", "int64")), ("h", "r", "n"))
ROWSETS, PER_ROWSET = 8, 500
# Low enough that a batch of fresh keys passes no filter (TabletOptions.bloom_fp_rate).
OPTIONS = TabletOptions(flush_threshold_bytes=0, row_group_rows=128, bloom_fp_rate=1e-6)


def _random_hashes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**63, size=n).astype(np.uint64) * 2


# -- the filter ----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["int", "str", "composite"]),
       n=st.integers(1, 300), fp=st.sampled_from([0.2, 0.01, 1e-4]),
       oversize=st.integers(1, 50), data=st.data())
def test_a_filter_never_rejects_a_key_it_holds(kind: str, n: int, fp: float, oversize: int,
                                               data: st.DataObject) -> None:
    if kind == "int":
        schema = INT_KEY
        ids = data.draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n, max_size=n))
        table = pa.table({"id": pa.array(ids, pa.int64())})
    elif kind == "str":
        schema = STR_KEY
        table = pa.table({"k": data.draw(st.lists(st.text(max_size=12), min_size=n, max_size=n))})
    else:
        schema = COMPOSITE
        table = pa.table({
            "h": data.draw(st.lists(st.text(max_size=6), min_size=n, max_size=n)),
            "r": pa.array(data.draw(st.lists(st.integers(0, 2**50), min_size=n, max_size=n)),
                          pa.timestamp("us")),
            "n": pa.array(data.draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n,
                                             max_size=n)), pa.int32())})
    hashes = bloom_hashes(table, schema)
    bloom = BloomFilter.sized(n * oversize, fp)  # a compaction output sizes in advance ...
    for part in np.array_split(hashes, 3):
        bloom.add(part)
    bloom.shrink(fp)  # ... and folds down to the rows it got
    assert bloom.may_contain(hashes).all()
    again, check = BloomFilter.from_bytes(bloom.to_bytes(42), "test")
    assert check == 42 and again.may_contain(hashes).all()


def test_composite_keys_hash_every_key_column() -> None:
    a = pa.table({"h": ["x", "x"], "r": pa.array([1, 1], pa.timestamp("us")),
                  "n": pa.array([1, 2], pa.int32())})
    h = bloom_hashes(a, COMPOSITE)
    assert h[0] != h[1]


def test_false_positive_rate_is_near_the_target_on_100k_keys() -> None:
    keys, others = _random_hashes(100_000, 1), _random_hashes(100_000, 2) + np.uint64(1)
    bloom = BloomFilter.sized(len(keys), 0.01)
    bloom.add(keys)
    assert bloom.k == 7 and 9.5 <= bloom.num_bits / len(keys) < 20
    rate = float(bloom.may_contain(others).mean())  # odd hashes: none was added
    assert rate < 0.03


@pytest.mark.parametrize("damage", ["crc", "truncate", "magic", "version"])
def test_damaged_filter_bytes_are_refused(damage: str) -> None:
    bloom = BloomFilter.sized(100)
    bloom.add(_random_hashes(100, 3))
    data = bytearray(bloom.to_bytes(0))
    if damage == "crc":
        data[40] ^= 0xFF
    elif damage == "truncate":
        data = data[:-9]
    elif damage == "magic":
        data[:4] = b"XXXX"
    else:
        data[4] = 9
    with pytest.raises(CorruptionError):
        BloomFilter.from_bytes(bytes(data), "test")


# -- the tablet ----------------------------------------------------------------------------

def _batch(op: OpType, ids: np.ndarray | list[int], v: int = 0) -> bytes:
    ids = np.asarray(ids, dtype=np.int64)
    return encode_write_batch(INT_KEY, op, pa.table({"id": ids, "v": ids * 0 + v}))


def _apply(t: Tablet, op: OpType, ids: np.ndarray | list[int], v: int = 0) -> list[str]:
    return [e.status for e in t.apply(t.applied_index + 1, _batch(op, ids, v)).errors]


def _strip_blooms(root: str, tablet_id: str) -> None:
    """Turn the tablet's rowsets into ones written before filters existed."""
    d = tablet_dir(root, tablet_id)
    sb = Superblock.load(d)
    for m in sb.rowsets:
        assert m.bloom is not None
        d.delete(m.bloom)
    metas = tuple(dataclasses.replace(m, bloom=None) for m in sb.rowsets)
    dataclasses.replace(sb, rowsets=metas).store(d)
    assert "bloom" not in d.read_bytes("superblock").decode()  # the old format exactly


@pytest.fixture
def stored(tmp_path: Path, no_fsync: None) -> tuple[str, np.ndarray, np.ndarray]:
    """A tablet with 8 flushed rowsets of random keys over one range, and fresh keys."""
    keys = np.random.default_rng(5).choice(1 << 40, size=ROWSETS * PER_ROWSET * 2,
                                           replace=False)
    root = str(tmp_path)
    t = Tablet.create(root, "t", INT_KEY, options=OPTIONS)
    for r in range(ROWSETS):
        assert _apply(t, OpType.INSERT, keys[r * PER_ROWSET:(r + 1) * PER_ROWSET]) == []
        t.flush()
    assert all(m.bloom is not None for m in t.rowsets)
    half = ROWSETS * PER_ROWSET
    return root, keys[:half], keys[half:]


@pytest.mark.parametrize("blooms", [True, False], ids=["with-blooms", "old-format"])
def test_inserting_fresh_keys_loads_no_key_index_only_with_blooms(
        stored: tuple[str, np.ndarray, np.ndarray], blooms: bool) -> None:
    root, _, fresh = stored
    if not blooms:
        _strip_blooms(root, "t")
    t = Tablet.open(root, "t", options=OPTIONS)  # no index in memory
    for part in np.array_split(fresh, 8):
        assert _apply(t, OpType.INSERT, part) == []
    if blooms:
        assert t.metrics.key_index_loads == 0
        assert t.metrics.bloom_skips == t.metrics.bloom_checks == 8 * ROWSETS
    else:
        assert t.metrics.key_index_loads == ROWSETS
        assert t.metrics.bloom_checks == 0


@pytest.mark.parametrize("blooms", [True, False], ids=["with-blooms", "old-format"])
def test_writes_to_existing_keys_still_find_them(
        stored: tuple[str, np.ndarray, np.ndarray], blooms: bool) -> None:
    root, old, fresh = stored
    if not blooms:
        _strip_blooms(root, "t")
    t = Tablet.open(root, "t", options=OPTIONS)
    assert _apply(t, OpType.INSERT, [old[3], fresh[0]]) == ["AlreadyPresent"]
    assert _apply(t, OpType.UPDATE, old[:200], v=1) == []
    assert _apply(t, OpType.UPSERT, old[200:400], v=2) == []
    assert _apply(t, OpType.DELETE, old[400:600]) == []
    assert _apply(t, OpType.UPDATE, [fresh[1]], v=3) == ["NotFound"]
    t.flush()
    # The deleted keys' ended versions are still in their rowsets' filters.
    assert _apply(t, OpType.INSERT, old[400:410]) == []
    t.flush()
    t = Tablet.open(root, "t", options=OPTIONS)
    got = {r["id"]: r["v"] for r in t.scan_table().to_pylist()}
    want = {int(k): 0 for k in old} | {int(fresh[0]): 0}
    want |= {int(k): 1 for k in old[:200]} | {int(k): 2 for k in old[200:400]}
    for k in old[410:600]:
        del want[int(k)]
    assert got == want


def test_a_damaged_bloom_file_falls_back_to_the_key_index(
        stored: tuple[str, np.ndarray, np.ndarray], caplog: pytest.LogCaptureFixture) -> None:
    root, old, fresh = stored
    d = tablet_dir(root, "t")
    metas = Superblock.load(d).rowsets
    damaged = metas[2].bloom
    assert damaged is not None
    data = bytearray(d.read_bytes(damaged))
    data[len(data) // 2] ^= 0x55
    with d.open(damaged, mode="wb") as f:
        f.write(bytes(data))
    t = Tablet.open(root, "t", options=OPTIONS)
    with caplog.at_level(logging.WARNING):
        assert _apply(t, OpType.INSERT, fresh[:100]) == []
    assert t.metrics.key_index_loads == 1  # the damaged rowset's index, only
    assert "bloom filter" in caplog.text and "CRC" in caplog.text
    # Exact answers for keys of the damaged rowset and of the others.
    mine = old[2 * PER_ROWSET:2 * PER_ROWSET + 5]
    assert _apply(t, OpType.INSERT, [*mine, old[0], fresh[200]]) == ["AlreadyPresent"] * 6
    assert t.lookup(int(fresh[200])) == {"id": int(fresh[200]), "v": 0}


def test_compaction_outputs_have_filters_and_retire_the_inputs_files(
        stored: tuple[str, np.ndarray, np.ndarray]) -> None:
    root, old, fresh = stored
    t = Tablet.open(root, "t", options=dataclasses.replace(OPTIONS,
                                                           compaction_target_rows=1500))
    assert _apply(t, OpType.DELETE, old[:10]) == []
    assert t.compact(history_retention_index=t.applied_index)
    assert len(t.rowsets) == 3 and all(m.bloom is not None for m in t.rowsets)
    listed = {f.split("/", 1)[1] for m in t.rowsets for f in m.files()}
    assert set(t.directory.listdir("rowsets")) == listed
    t = Tablet.open(root, "t", options=OPTIONS)
    assert _apply(t, OpType.INSERT, fresh[:300]) == []
    assert t.metrics.key_index_loads == 0
    assert _apply(t, OpType.INSERT, [old[10], old[0]]) == ["AlreadyPresent"]


def test_old_format_rowsets_gain_filters_when_compacted(
        stored: tuple[str, np.ndarray, np.ndarray]) -> None:
    root, _, fresh = stored
    _strip_blooms(root, "t")
    t = Tablet.open(root, "t", options=OPTIONS)
    assert all(m.bloom is None for m in t.rowsets)
    t.compact()
    assert all(m.bloom is not None for m in t.rowsets)
    t = Tablet.open(root, "t", options=OPTIONS)
    assert _apply(t, OpType.INSERT, fresh[:300]) == []
    assert t.metrics.key_index_loads == 0


def test_a_tablet_copy_carries_the_bloom_files(
        stored: tuple[str, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    root, old, fresh = stored
    src = Tablet.open(root, "t", options=OPTIONS)
    with TabletCopySource(src) as copy:
        assert sum(n.endswith(".bloom") for n in copy.files()) == ROWSETS
        chunks = list(copy.chunks())
    install_tablet_copy(str(tmp_path / "dst"), chunks, MemoryLog().append)
    dst = Tablet.open(str(tmp_path / "dst"), "t", options=OPTIONS)
    assert dst.rowsets == src.rowsets
    assert _apply(dst, OpType.INSERT, fresh[:300]) == []
    assert dst.metrics.key_index_loads == 0
    assert _apply(dst, OpType.INSERT, [old[1]]) == ["AlreadyPresent"]
