"""Per-rowset bloom filters: no false negatives, the target false-positive rate (blocked and
standard layouts), damaged files fall back to the key index, files of the old layout still
work, and writes of fresh keys stop loading key indexes."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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
from pyspark_kudu.tablet.bloom import (
    BLOCKED,
    STANDARD,
    BloomFilter,
    blocked_fp_rate,
    bloom_hashes,
    read_bloom,
    write_bloom,
)
from pyspark_kudu.tablet.rowset import bloom_check

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
       n=st.integers(1, 300), fp=st.sampled_from([0.2, 0.01, 1e-4, 1e-6]),
       oversize=st.integers(1, 50), version=st.sampled_from([BLOCKED, STANDARD]),
       data=st.data())
def test_a_filter_never_rejects_a_key_it_holds(kind: str, n: int, fp: float, oversize: int,
                                               version: int, data: st.DataObject) -> None:
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
    bloom = BloomFilter.sized(n * oversize, fp, version=version)  # room to spare, or none
    for part in np.array_split(hashes, 3):
        bloom.add(part)
    assert bloom.may_contain(hashes).all()
    again, check = BloomFilter.from_bytes(bloom.to_bytes(42), "test")
    assert check == 42 and again.version == version and again.may_contain(hashes).all()


def test_a_blocked_filter_larger_than_its_add_window_holds_every_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys are grouped by window when the filter is larger than one (bounded memory)."""
    import pyspark_kudu.tablet.bloom as bloom_module
    keys = _random_hashes(20_000, 7)
    whole = BloomFilter.sized(len(keys), 1e-6)
    whole.add(keys)
    monkeypatch.setattr(bloom_module, "_WINDOW_BITS", 4096)  # many windows
    windowed = BloomFilter.sized(len(keys), 1e-6)
    assert windowed.num_bits // 4096 >= 64
    windowed.add(keys[:7_000])
    windowed.add(keys[7_000:])
    assert np.array_equal(windowed.bits, whole.bits)  # the same bits, set window by window


def test_the_blocked_layout_sets_the_bits_its_format_defines() -> None:
    """The salts and the block choice are the file format: a filter written by another
    build must answer the same. 65,536 bits = 128 blocks: block 0xEF mod 128 = 111."""
    bloom = BloomFilter.sized(2000, 1e-4)
    assert (bloom.version, bloom.num_bits, bloom.k) == (BLOCKED, 65536, 5)
    bloom.add(np.array([0x0123456789ABCDEF], dtype=np.uint64))
    set_bits = np.flatnonzero(np.unpackbits(bloom.bits, bitorder="little")).tolist()
    assert set_bits == [57109, 57167, 57198, 57223, 57335]
    assert all(111 * 512 <= b < 112 * 512 for b in set_bits)


def _all_k_bits(bloom: BloomFilter, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The format's answer (every one of a key's ``k`` bits set) and the keys that miss
    only their last bit."""
    pos = bloom._blocked_positions(asked)
    bits = np.unpackbits(bloom.bits, bitorder="little").astype(bool)
    return bits[pos].all(axis=1), (~bits[pos[:, -1]]) & bits[pos[:, :-1]].all(axis=1)


@pytest.mark.parametrize("fp", [1e-2, 1e-6])
def test_asking_bit_by_bit_answers_as_all_k_bits_of_the_format(fp: float) -> None:
    """``may_contain`` stops looking at a key at its first clear bit, and asks the remaining
    bits at once when few keys are left or most passed: it must answer exactly what checking
    every one of the key's ``k`` bits (the format's definition) answers, for members, absent
    keys and the false positives among them, on each of those paths and across chunks."""
    # Filled past its size, so that false positives are many (~half of the absent keys)
    # and some keys miss only their last bit.
    full = BloomFilter.sized(3_000, fp)
    members = _random_hashes(30_000, 5)
    full.add(members)
    # Sized for its keys: absent keys drop out bit by bit down to a small remnant.
    sized = BloomFilter.sized(30_000, fp)
    sized.add(members)
    absent = _random_hashes(3 * 65_536 + 17, 6)
    cases = {
        "absent across chunks, overfull": (full, np.concatenate(
            [members[:1_000], absent, members[-5:]])),
        "absent across chunks, sized": (sized, np.concatenate(
            [members[:1_000], absent, members[-5:]])),
        "mostly present (updates)": (sized, np.concatenate([members, absent[:2_000]])),
        "a small batch": (full, np.concatenate([members[:40], absent[:60]])),
    }
    for name, (bloom, asked) in cases.items():
        want, last_only = _all_k_bits(bloom, asked)
        assert want[:40].all(), name
        assert np.array_equal(bloom.may_contain(asked), want), name
    want, last_only = _all_k_bits(full, cases["absent across chunks, overfull"][1])
    assert 0 < want.mean() < 1 and last_only.sum() > 0
    assert not full.may_contain(np.array([], dtype=np.uint64)).any()


def test_composite_keys_hash_every_key_column() -> None:
    a = pa.table({"h": ["x", "x"], "r": pa.array([1, 1], pa.timestamp("us")),
                  "n": pa.array([1, 2], pa.int32())})
    h = bloom_hashes(a, COMPOSITE)
    assert h[0] != h[1]


def _fp_rate(bloom: BloomFilter, keys: np.ndarray) -> float:
    others = np.random.default_rng(99).integers(0, 2**64, size=1_000_000, dtype=np.uint64)
    others = others[~np.isin(others, keys)]
    return float(bloom.may_contain(others).mean())


@pytest.mark.parametrize("target", [0.01, 1e-3, 1e-4])
def test_blocked_false_positive_rate_meets_the_target_and_its_model(target: float) -> None:
    keys = np.random.default_rng(1).integers(0, 2**64, size=100_000, dtype=np.uint64)
    bloom = BloomFilter.sized(len(keys), target)
    bloom.add(keys)
    model = blocked_fp_rate(bloom.num_bits / len(keys), bloom.k)
    assert model <= target
    rate = _fp_rate(bloom, keys)
    # 1M queries: the measured rate is within a few standard deviations of the model.
    assert rate <= model * 1.3 + 5e-5, (rate, model)
    # The fewest hash bits that reach the target: one fewer would not.
    assert bloom.k == 1 or blocked_fp_rate(bloom.num_bits / len(keys), bloom.k - 1) > target


def test_blocked_sizing_at_the_default_rate() -> None:
    """1e-6: at least 39 bits per key (a standard filter needs 29), at most twice that (the
    power-of-two rounding)."""
    for n in (1_000, 65_536, 300_000, 1_600_000):
        bloom = BloomFilter.sized(n)
        assert 39 <= bloom.num_bits / n <= 2 * 39.5
        assert blocked_fp_rate(bloom.num_bits / n, bloom.k) <= 1e-6


def test_standard_false_positive_rate_is_near_the_target_on_100k_keys() -> None:
    keys = _random_hashes(100_000, 1)
    bloom = BloomFilter.sized(len(keys), 0.01, version=STANDARD)
    bloom.add(keys)
    assert bloom.k == 7 and 9.5 <= bloom.num_bits / len(keys) < 20
    assert _fp_rate(bloom, keys) < 0.03


@pytest.mark.parametrize("damage", ["crc", "truncate", "magic", "version"])
def test_damaged_filter_bytes_are_refused(damage: str) -> None:
    bloom = BloomFilter.sized(100)
    bloom.add(_random_hashes(100, 3))
    data = bytearray(bloom.to_bytes(0))
    assert BloomFilter.from_bytes(bytes(data), "test")[0].may_contain(_random_hashes(100, 3)).all()
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


def _rewrite_blooms_standard(root: str, tablet_id: str) -> None:
    """Rewrite every rowset's filter in the standard layout (version 1), as a build from
    before the blocked layout wrote it."""
    d = tablet_dir(root, tablet_id)
    for m in Superblock.load(d).rowsets:
        assert m.bloom is not None
        keys = pq.read_table(d.path(m.file), columns=["id"])
        old = BloomFilter.sized(keys.num_rows, OPTIONS.bloom_fp_rate, version=STANDARD)
        old.add(bloom_hashes(keys, INT_KEY))
        write_bloom(d, m.bloom, old, bloom_check(INT_KEY, m.min_key, old.seed))
        assert read_bloom(d, m.bloom)[0].version == STANDARD


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


@pytest.mark.parametrize("blooms", ["blocked", "standard", "none"],
                         ids=["with-blooms", "standard-layout-blooms", "old-format"])
def test_inserting_fresh_keys_loads_no_key_index_only_with_blooms(
        stored: tuple[str, np.ndarray, np.ndarray], blooms: str) -> None:
    root, _, fresh = stored
    if blooms == "none":
        _strip_blooms(root, "t")
    elif blooms == "standard":
        _rewrite_blooms_standard(root, "t")
    t = Tablet.open(root, "t", options=OPTIONS)  # no index in memory
    parts = np.array_split(fresh, 8)
    # Which rowsets' filters admit some key of each part: a false positive at 1e-6 per key
    # is rare but these are 32,000 key checks, so the test asks the filters, not its luck.
    d = tablet_dir(root, "t")
    filters = [read_bloom(d, m.bloom)[0] for m in Superblock.load(d).rowsets
               if m.bloom is not None]
    admitted = [{j for j, f in enumerate(filters)
                 if f.may_contain(bloom_hashes(pa.table({"id": part}), INT_KEY, f.seed)).any()}
                for part in parts]
    for part in parts:
        assert _apply(t, OpType.INSERT, part) == []
    if blooms != "none":
        assert sum(map(len, admitted)) <= 2, f"filters admitting fresh keys: {admitted}"
        # Only an admitted (part, rowset) pair reads the rowset (its index or a point lookup).
        fp_reads = t.metrics.key_index_loads + t.metrics.point_lookups
        assert fp_reads <= sum(map(len, admitted)), (t.metrics, admitted)
        assert t.metrics.bloom_checks == 8 * ROWSETS
        assert t.metrics.bloom_skips == 8 * ROWSETS - sum(map(len, admitted))
    else:
        assert t.metrics.key_index_loads == ROWSETS
        assert t.metrics.bloom_checks == 0


@pytest.mark.parametrize("blooms", ["blocked", "standard", "none"],
                         ids=["with-blooms", "standard-layout-blooms", "old-format"])
def test_writes_to_existing_keys_still_find_them(
        stored: tuple[str, np.ndarray, np.ndarray], blooms: str) -> None:
    root, old, fresh = stored
    if blooms == "none":
        _strip_blooms(root, "t")
    elif blooms == "standard":
        _rewrite_blooms_standard(root, "t")
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


@pytest.mark.parametrize("seed", ["current", "earlier"])
def test_composite_keys_are_checked_with_the_batchs_own_probes_and_old_seeds_still_work(
        tmp_path: Path, no_fsync: None, monkeypatch: pytest.MonkeyPatch, seed: str) -> None:
    """Filters written now share the key index's seed, so a batch of composite keys asks
    them with the hashes it already has (no second hash of every key); a filter written
    with the earlier seed is asked with hashes computed for it. Both answer exactly."""
    import datetime as dt

    from pyspark_kudu.tablet import apply as apply_module
    from pyspark_kudu.tablet.bloom import BLOOM_SEED

    def rows(lo: int, hi: int) -> pa.Table:
        n = np.arange(lo, hi)
        return pa.table({
            "h": [f"h{i % 7}" for i in n],
            "r": pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(seconds=int(i) * 37)
                           for i in n], pa.timestamp("us")),
            "n": pa.array(n, pa.int32()), "v": pa.array(n, pa.int64())})

    root = str(tmp_path)
    t = Tablet.create(root, "t", COMPOSITE, log=MemoryLog(), options=OPTIONS)
    index = 0

    def apply(op: OpType, table: pa.Table) -> list[str]:
        nonlocal index
        index += 1
        data = encode_write_batch(COMPOSITE, op, table)
        assert t.log is not None
        t.log.append((index, data))  # type: ignore[attr-defined]
        return [e.status for e in t.apply(index, data).errors]

    for r in range(3):
        assert apply(OpType.INSERT, rows(r * 400, (r + 1) * 400)) == []
        t.flush()
    d = tablet_dir(root, "t")
    earlier = 0x626C6F6F6D
    if seed == "earlier":  # as a build from before the shared seed wrote them
        for m in Superblock.load(d).rowsets:
            assert m.bloom is not None
            keys = pq.read_table(d.path(m.file), columns=["h", "r", "n"])
            old = BloomFilter.sized(keys.num_rows, OPTIONS.bloom_fp_rate, seed=earlier)
            old.add(bloom_hashes(keys, COMPOSITE, earlier))
            write_bloom(d, m.bloom, old, bloom_check(COMPOSITE, m.min_key, earlier))
    want_seed = BLOOM_SEED if seed == "current" else earlier
    assert {read_bloom(d, m.bloom)[0].seed for m in Superblock.load(d).rowsets
            if m.bloom is not None} == {want_seed}
    hashed: list[int] = []
    real = apply_module.bloom_hashes
    monkeypatch.setattr(apply_module, "bloom_hashes",
                        lambda data, schema, s: hashed.append(s) or real(data, schema, s))
    t = Tablet.open(root, "t", log=t.log, options=OPTIONS)
    checks = t.metrics.bloom_checks
    assert apply(OpType.INSERT, rows(5_000, 5_300)) == []  # fresh keys: every filter says no
    assert t.metrics.bloom_skips == t.metrics.bloom_checks - checks == 3
    assert t.metrics.key_index_loads == 0
    assert hashed == ([] if seed == "current" else [earlier])  # once per batch and seed
    # Keys that are there are found, wherever they are.
    assert apply(OpType.INSERT, rows(398, 402)) == ["AlreadyPresent"] * 4
    assert apply(OpType.INSERT, rows(5_299, 5_301)) == ["AlreadyPresent"]
    t.flush()
    assert t.scan_table(["n"]).num_rows == 1_200 + 301


def test_a_flush_builds_a_composite_keys_filter_from_the_index_probes(
        tmp_path: Path, no_fsync: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MemRowSet's index already holds every composite key's hash at the filters' seed:
    a flush builds the rowset's filter from those (no second hash of every key), and the
    filter is bit for bit the one hashing the written rows gives, replaced and deleted
    versions left out like their rows."""
    import datetime as dt

    from pyspark_kudu.tablet import compaction

    def rows(ids: np.ndarray, v: int) -> pa.Table:
        return pa.table({
            "h": [f"h{i % 7}" for i in ids],
            "r": pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(seconds=int(i) * 37)
                           for i in ids], pa.timestamp("us")),
            "n": pa.array(ids, pa.int32()), "v": pa.array(ids * 0 + v, pa.int64())})

    root = str(tmp_path)
    t = Tablet.create(root, "t", COMPOSITE, log=MemoryLog(), options=OPTIONS)
    index = 0

    def apply(op: OpType | list[int], table: pa.Table) -> None:
        nonlocal index
        index += 1
        data = encode_write_batch(COMPOSITE, op, table)
        assert t.log is not None
        t.log.append((index, data))  # type: ignore[attr-defined]
        assert t.apply(index, data).ok

    apply(OpType.INSERT, rows(np.arange(0, 600), 1))
    apply(OpType.UPSERT, rows(np.arange(300, 900), 2))  # replaces 300..599
    apply(OpType.DELETE, rows(np.arange(0, 50), 0).select(["h", "r", "n"]))
    # Keys 5000..5009 live and die within one entry: no version is written, no filter bit.
    apply([OpType.INSERT] * 10 + [OpType.DELETE] * 10,
          rows(np.concatenate([np.arange(5000, 5010)] * 2), 3))
    rehashed: list[int] = []
    real = compaction.bloom_hashes
    monkeypatch.setattr(compaction, "bloom_hashes",
                        lambda data, schema, s: rehashed.append(data.num_rows)
                        or real(data, schema, s))
    assert t.flush()
    assert rehashed == []  # built from the probes
    d = tablet_dir(root, "t")
    (meta,) = Superblock.load(d).rowsets
    assert meta.bloom is not None
    got = read_bloom(d, meta.bloom)[0]
    written = pq.read_table(d.path(meta.file), columns=["h", "r", "n"])
    want = BloomFilter.sized(written.num_rows, OPTIONS.bloom_fp_rate)
    want.add(real(written, COMPOSITE, want.seed))
    assert (got.seed, got.k, got.num_bits) == (want.seed, want.k, want.num_bits)
    assert np.array_equal(got.bits, want.bits)
    assert got.may_contain(real(rows(np.arange(0, 900), 0), COMPOSITE, got.seed)).all()
