"""Background maintenance of a host's replicas: compaction chosen by rowset overlap and
delta size within a budget, idle flushes, a history mark from observed age, and crashes in
the middle of an operation that lose nothing."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host.handlers import tablet_dir
from pyspark_kudu.spark.host.maintenance_manager import MaintenanceManager, maintain_replica
from pyspark_kudu.spark.host.replica_apply import catch_up
from pyspark_kudu.spark.host.replica_cache import clear_cache, open_replica
from pyspark_kudu.spark.host.replica_scan import scan_replica
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import CRASH_ENV, CRASH_EXIT_CODE, OpType, encode_write_batch
from pyspark_kudu.tablet.maintenance import (
    MaintenancePolicy,
    choose_compaction,
    overlap_stacks,
)
from pyspark_kudu.tablet.rowset import DeltaFileMeta, RowSetMeta
from pyspark_kudu.tablet.superblock import Superblock

pytestmark = pytest.mark.unit

TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
REPO = Path(__file__).resolve().parents[3]


# -- policy ----------------------------------------------------------------------------------
def _meta(i: int, lo: int, hi: int, size: int = 100, rows: int = 10,
          dead: int = 0) -> RowSetMeta:
    deltas = (DeltaFileMeta(f"d{i}", dead, 5),) if dead else ()
    return RowSetMeta(i, f"r{i}", rows, size, (lo,), (hi,), 1, 2, None, deltas)


def test_overlap_stacks_group_transitively_overlapping_ranges_only() -> None:
    metas = [_meta(1, 0, 10), _meta(2, 5, 20), _meta(3, 20, 30), _meta(4, 40, 50),
             _meta(5, 60, 70), _meta(6, 65, 66)]
    assert [[m.id for m in s] for s in overlap_stacks(metas)] == [[1, 2, 3], [5, 6]]


def test_the_tallest_stack_is_merged_smallest_first_within_the_budget() -> None:
    policy = MaintenancePolicy(budget_bytes=300)
    metas = [_meta(1, 0, 100, size=250), _meta(2, 0, 100, size=90), _meta(3, 0, 100, size=80),
             _meta(4, 0, 100, size=100), _meta(7, 200, 300), _meta(8, 250, 260)]
    assert choose_compaction(metas, policy) == (2, 3, 4)
    # Two rowsets that do not fit the budget together are left alone.
    assert choose_compaction([_meta(1, 0, 9, size=200), _meta(2, 0, 9, size=200)],
                             policy) == ()


def test_a_rowset_full_of_ended_versions_is_rewritten_when_nothing_overlaps() -> None:
    policy = MaintenancePolicy(delta_ratio=0.1)
    metas = [_meta(1, 0, 9, rows=100, dead=5), _meta(2, 10, 19, rows=100, dead=30),
             _meta(3, 20, 29, rows=100, dead=12)]
    assert choose_compaction(metas, policy) == (2,)
    assert choose_compaction([_meta(1, 0, 9, rows=100, dead=5)], policy) == ()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20), st.integers(1, 400),
                          st.integers(0, 10)), max_size=12),
       st.integers(50, 1000), st.sampled_from([2, 4]))
def test_a_chosen_compaction_fits_its_budget_and_merges_one_stack(
        specs: list[tuple[int, int, int, int]], budget: int, min_stack: int) -> None:
    metas = [_meta(i, lo, lo + span, size=size, rows=10, dead=dead)
             for i, (lo, span, size, dead) in enumerate(specs)]
    policy = MaintenancePolicy(budget_bytes=budget, delta_ratio=0.5, max_stack=6,
                               min_stack=min_stack)
    ids = choose_compaction(metas, policy)
    chosen = [m for m in metas if m.id in ids]
    assert sum(m.size_bytes for m in chosen) <= budget
    if len(chosen) > 1:
        stacks = [s for s in overlap_stacks(metas) if set(ids) <= {m.id for m in s}]
        assert stacks, (ids, overlap_stacks(metas))
        assert len(stacks[0]) >= policy.min_stack
        if len(stacks[0]) < policy.max_stack:  # a low stack: similar sizes only
            sizes = sorted(m.size_bytes for m in chosen)
            assert all(b <= policy.size_ratio * sum(sizes[:i + 1])
                       for i, b in enumerate(sizes[1:])), sizes
    elif chosen:  # a delta compaction: no stack had a merge to offer
        assert chosen[0].deltas
        for s in overlap_stacks(metas):
            sizes = sorted(m.size_bytes for m in s)
            if len(s) < policy.min_stack:  # left alone
                continue
            if len(s) >= policy.max_stack:
                assert sizes[0] + sizes[1] > budget, sizes
            else:
                assert not any(b <= policy.size_ratio * a and a + b <= budget
                               for a, b in itertools.pairwise(sizes)), sizes


def test_a_low_stack_merges_rowsets_of_similar_size_and_leaves_a_small_one_over_a_big_one(
        ) -> None:
    policy = MaintenancePolicy(budget_bytes=10_000, min_stack=2)
    big = _meta(1, 0, 100, size=1000)
    # An upsert's small rowset over the table's big one: rewriting the big one for it is
    # what the size tiers avoid.
    assert choose_compaction([big, _meta(2, 0, 100, size=10)], policy) == ()
    # Small ones of a size go together (each <= 2x the sum of the smaller ones), not the
    # big one.
    small = [_meta(2, 0, 100, size=10), _meta(3, 0, 100, size=12), _meta(4, 5, 90, size=9)]
    assert choose_compaction([big, *small], policy) == (2, 3, 4)
    # ... until they add up to the big one's size.
    grown = [_meta(2, 0, 100, size=300), _meta(3, 0, 100, size=500)]
    assert choose_compaction([big, *grown], policy) == (1, 2, 3)
    # The longest tier wins, wherever it starts in size order.
    assert choose_compaction([_meta(5, 0, 100, size=1), big, *grown], policy) == (1, 2, 3)
    # A stack of max_stack or more is merged smallest first whatever the sizes.
    assert choose_compaction([big, _meta(2, 0, 100, size=10)],
                             MaintenancePolicy(budget_bytes=10_000, min_stack=2,
                                               max_stack=2)) == (1, 2)


def test_by_default_an_ingests_few_overlapping_flushes_are_left_alone() -> None:
    # The two or three rowsets an ingest flushes into a tablet, each over the whole key
    # range: merging them costs as much as flushing did, for two or three bloom probes
    # per lookup (the module docstring has the measurement).
    policy = MaintenancePolicy()
    flushes = [_meta(i, 0, 1000, size=700, rows=700) for i in (1, 2)]
    assert choose_compaction(flushes, policy) == ()
    assert choose_compaction([*flushes, _meta(3, 0, 1000, size=250, rows=250)], policy) == ()
    # A fourth makes the stack worth merging; the similar sizes go together.
    four = [*flushes, _meta(3, 0, 1000, size=250, rows=250), _meta(4, 3, 990, size=600)]
    assert choose_compaction(four, policy) == (1, 2, 4)
    # A rowset full of ended versions is still rewritten on its own.
    dead = _meta(9, 2000, 3000, rows=100, dead=60)
    assert choose_compaction([*flushes, dead], policy) == (9,)


def test_a_policy_refuses_nonsense() -> None:
    for bad in ({"delta_ratio": 0}, {"min_stack": 1}, {"budget_bytes": 0},
                {"flush_idle_s": -1}, {"size_ratio": 0.5}, {"max_stack": 1}):
        with pytest.raises(ValueError):
            MaintenancePolicy(**bad)  # type: ignore[arg-type]


# -- replicas --------------------------------------------------------------------------------
def _batch(ids: range, tag: str) -> bytes:
    return encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
        "id": list(ids), "v": [f"{tag}-{i}" for i in ids]}))


def _flush(root: str) -> None:
    io = tablet_dir(root, "t")
    with open_replica(root, io, "t", None, mutate=True) as h:
        tablet = h.open_tablet(root, "t", catch_up(root, "t", io, h))
        tablet.flush()


def _rows(root: str) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for b in scan_replica(root, "t", None, (), None)
                  for r in b.to_pylist())


def _rowsets(root: str) -> list[RowSetMeta]:
    return list(Superblock.load(tablet_dir(root, "t")).rowsets)


@pytest.fixture
def stacked(tmp_path: Path) -> Iterator[tuple[str, TabletLeader]]:
    """ts-a's replica of "t" after 8 small upserts over overlapping keys, each flushed: 8
    overlapping rowsets, the older ones with deltas."""
    clear_cache()
    roots = {ts: str(tmp_path / ts) for ts in TS}
    transport = DirectTransport(roots)
    tablet = TabletReplicas("t", TS)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
    lead = TabletLeader(tablet, "ts-a", transport)
    lead.elect()
    for k in range(8):
        lead.propose([_batch(range(k * 50, k * 50 + 300), f"w{k}")])
        lead.heartbeat()
        _flush(roots["ts-a"])
    yield roots["ts-a"], lead
    clear_cache()


def test_maintenance_compacts_overlapping_rowsets_in_the_background_and_rows_stay(
        stacked: tuple[str, TabletLeader]) -> None:
    root, _ = stacked
    before = _rows(root)
    assert len(_rowsets(root)) == 8
    manager = MaintenanceManager(MaintenancePolicy(flush_idle_s=0, busy_s=0), interval_s=0.05)
    manager.note(root)
    manager.start()
    try:
        from tests.waiting import wait_until

        wait_until(lambda: len(_rowsets(root)) == 1, 60,
                   "background maintenance merging the 8 overlapping rowsets into one")
    finally:
        manager.stop()
    assert {op.kind for op in manager.ops} == {"compact"} and manager.errors == 0
    assert _rows(root) == before
    assert not _rowsets(root)[0].deltas  # the deltas were folded into the output


@pytest.mark.parametrize("point", ["compact.start", "compact.after_outputs",
                                   "compact.after_superblock", "compact.during_delete"])
def test_a_crash_in_the_middle_of_a_compaction_loses_nothing(
        stacked: tuple[str, TabletLeader], point: str) -> None:
    root, _ = stacked
    before = _rows(root)
    clear_cache()
    script = textwrap.dedent(f"""
        from pyspark_kudu.spark.host.maintenance_manager import maintain_replica
        from pyspark_kudu.tablet.maintenance import MaintenancePolicy
        maintain_replica({root!r}, "t", MaintenancePolicy(budget_bytes=1 << 30))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={**_env(), CRASH_ENV: point})
    assert out.returncode == CRASH_EXIT_CODE, f"no crash at {point}: {out.stderr}"
    assert _rows(root) == before, f"rows changed after a crash at {point}"
    clear_cache()
    while maintain_replica(root, "t", MaintenancePolicy(budget_bytes=1 << 30)) is not None:
        pass
    assert len(_rowsets(root)) == 1 and _rows(root) == before


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != CRASH_ENV}


def test_an_idle_replica_is_flushed_and_history_older_than_the_age_is_dropped(
        tmp_path: Path) -> None:
    clear_cache()
    roots = {ts: str(tmp_path / ts) for ts in TS}
    transport = DirectTransport(roots)
    tablet = TabletReplicas("t", TS)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
    lead = TabletLeader(tablet, "ts-a", transport)
    lead.elect()
    root = roots["ts-a"]
    now = [1000.0]
    policy = MaintenancePolicy(flush_idle_s=30, history_max_age_s=600, min_stack=2)
    manager = MaintenanceManager(policy, clock=lambda: now[0])
    manager.note(root)
    (first,) = lead.propose([_batch(range(100), "old")])
    lead.heartbeat()
    assert manager.run_once() == []  # just written: not idle yet
    now[0] += 31
    (op,) = manager.run_once()
    assert op.kind == "flush" and len(_rowsets(root)) == 1
    lead.propose([_batch(range(100), "new")])  # every row gets a newer version
    lead.heartbeat()
    kinds = []
    for _ in range(3):  # sees the change, flushes once idle, merges the two rowsets
        now[0] += 31
        kinds += [op.kind for op in manager.run_once()]
    assert kinds == ["flush", "compact"] and len(_rowsets(root)) == 1
    # The old versions are kept while younger than the history age: a snapshot sees them.
    old = sorted(r["v"] for b in scan_replica(root, "t", None, (), first[0])
                 for r in b.to_pylist())
    assert old == sorted(f"old-{i}" for i in range(100))
    assert _rowsets(root)[0].num_rows == 200
    # Ten minutes later they are dropped by the next compaction, and older snapshots refused.
    lead.propose([_batch(range(50), "newer")])
    lead.heartbeat()
    for _ in range(3):
        now[0] += 601
        manager.run_once()
    assert _rows(root) == sorted([(i, f"newer-{i}") for i in range(50)]
                                 + [(i, f"new-{i}") for i in range(50, 100)])
    assert sum(m.num_rows for m in _rowsets(root)) < 250
    with pytest.raises(InvalidArgumentError, match="ancient history mark"):
        list(scan_replica(root, "t", None, (), first[0]))
    clear_cache()


def _three_tablets(tmp_path: Path) -> tuple[str, list[TabletLeader]]:
    roots = {ts: str(tmp_path / ts) for ts in TS}
    transport = DirectTransport(roots)
    leads = []
    for k, tid in enumerate(("t1", "t2", "t3")):
        tablet = TabletReplicas(tid, TS)
        TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
        lead = TabletLeader(tablet, "ts-a", transport)
        lead.elect()
        lead.propose([encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
            "id": list(range(2000 * (k + 1))), "v": ["x" * 250] * (2000 * (k + 1))}))])
        lead.heartbeat()
        leads.append(lead)
    return roots["ts-a"], leads


def _open_all(root: str) -> None:
    """Open each tablet's replica in this process (as a scan would)."""
    for tid in ("t1", "t2", "t3"):
        for _ in scan_replica(root, tid, ("id",), (), None):
            pass


def test_open_replicas_beyond_the_memory_budget_are_closed_least_recent_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark_kudu.spark.host import replica_cache

    clear_cache()
    root, _ = _three_tablets(tmp_path)
    _open_all(root)
    # (The in-process transport keeps every replica of the three tablets open here.)
    held = replica_cache.cached_memory()
    mine = {k[1]: v for k, v in held.items() if k[0] == root}
    assert set(mine) == {"t1", "t2", "t3"} and all(m > 0 for m, _ in mine.values())
    budget = sum(sum(v) for v in held.values()) - 1  # one byte short of all of them
    monkeypatch.setenv(replica_cache.CACHE_BUDGET_ENV, str(budget / 2**20))
    before = replica_cache.cache_stats()["evicted_for_memory"]
    _open_all(root)  # each use evicts the least recently used others until it fits
    after = replica_cache.cached_memory()
    assert sum(sum(v) for v in after.values()) <= budget
    assert (root, "t3") in after and len(after) < len(held), after
    assert replica_cache.cache_stats()["evicted_for_memory"] > before
    clear_cache()


def test_memory_pressure_flushes_the_largest_memrowsets_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark_kudu.spark.host import replica_cache

    clear_cache()
    root, _ = _three_tablets(tmp_path)
    _open_all(root)
    held = replica_cache.cached_memory()
    mrs = {k[1]: m for k, (m, _) in held.items() if k[0] == root}
    # Half the budget holds the smallest MemRowSet only: the two largest must be flushed,
    # largest first, and the smallest not. (The budget is at least 1 MiB: the rows are
    # wide enough for these MemRowSets to pass half of it.)
    budget = 2 * (mrs["t1"] + mrs["t2"] // 2)
    assert mrs["t1"] < budget / 2 < mrs["t1"] + mrs["t2"]
    monkeypatch.setenv(replica_cache.CACHE_BUDGET_ENV, str(budget / 2**20))
    manager = MaintenanceManager(MaintenancePolicy(flush_idle_s=3600))
    manager.note(root)
    ops = manager.run_once()
    assert [(op.tablet_id, op.kind) for op in ops] == [("t3", "flush"), ("t2", "flush")]
    for tid in ("t2", "t3"):
        sb = Superblock.load(tablet_dir(root, tid))
        assert len(sb.rowsets) == 1, tid  # its MemRowSet is on disk now
    assert not Superblock.load(tablet_dir(root, "t1")).rowsets
    clear_cache()


# -- writes first ----------------------------------------------------------------------------
def test_a_replica_being_written_gets_only_tall_stacks_merged() -> None:
    policy = MaintenancePolicy(min_stack=2, busy_min_stack=4, delta_ratio=0.1)
    three = [_meta(i, 0, 100) for i in (1, 2, 3)]
    dead = [_meta(9, 500, 600, rows=100, dead=50)]
    assert choose_compaction(three, policy) == (1, 2, 3)
    assert choose_compaction(three + dead, policy, busy=True) == ()
    assert choose_compaction(dead, policy) == (9,)
    four = [*three, _meta(4, 50, 60)]
    assert choose_compaction(four + dead, policy, busy=True) == (1, 2, 3, 4)
    with pytest.raises(ValueError, match="busy_min_stack"):
        MaintenancePolicy(min_stack=3, busy_min_stack=2)


def test_maintenance_waits_for_writes_to_pause_before_merging(
        stacked: tuple[str, TabletLeader]) -> None:
    root, lead = stacked
    now = [1000.0]
    manager = MaintenanceManager(MaintenancePolicy(busy_s=10, busy_min_stack=9,
                                                   flush_idle_s=3600), clock=lambda: now[0])
    manager.note(root)
    assert manager.run_once() == []  # first look: not watched for busy_s yet, so it waits
    now[0] += 5
    lead.propose([_batch(range(10), "busy")])
    lead.heartbeat()
    now[0] += 6
    assert manager.run_once() == [] and len(_rowsets(root)) == 8  # just written: waits
    now[0] += 9
    assert manager.run_once() == []  # written 9 s ago
    now[0] += 2
    (op,) = manager.run_once()  # quiet for 11 s: the 8 overlapping rowsets are merged
    assert op.kind == "compact" and len(op.rowsets) == 8


def test_a_write_during_the_merge_drops_it_and_the_next_attempt_holds_the_lock(
        stacked: tuple[str, TabletLeader], monkeypatch: pytest.MonkeyPatch) -> None:
    """The merge runs without the replica's lock: a round applies to the replica meanwhile
    (here, an upsert of keys the inputs hold), so the commit drops the merge; the manager's
    next compaction of that replica, after ``max_conflicts`` in a row, holds the lock."""
    from pyspark_kudu.tablet import Tablet

    root, lead = stacked
    real = Tablet.run_compaction
    writes = iter(range(100))

    def run_with_a_write(self: Tablet, job: object, between: object = None) -> None:
        k = next(writes)
        if k < 3:  # the three unlocked merges below (the fourth holds the lock: no round
            #        could get in, this thread would wait on itself)
            # Keys whose live versions are in the inputs (not in the rowset the previous
            # attempt's write was flushed into): each attempt meets a change.
            lead.propose([_batch(range(20 * k, 20 * k + 20), f"during-{k}")])
            lead.heartbeat()
        real(self, job, between)  # type: ignore[arg-type]

    monkeypatch.setattr(Tablet, "run_compaction", run_with_a_write)
    policy = MaintenancePolicy(flush_idle_s=0, busy_s=0, budget_bytes=1 << 30)
    op = maintain_replica(root, "t", policy)
    assert op is not None and op.kind == "compact_conflict"
    assert len(_rowsets(root)) == 8  # nothing published
    assert dict(_rows(root))[5] == "during-0-5"  # the write is there
    manager = MaintenanceManager(policy, interval_s=0.05)
    manager.note(root)
    kinds = []
    for _ in range(3):
        kinds += [op.kind for op in manager.run_once() if op.kind != "flush"]
    assert kinds[:3] == ["compact_conflict", "compact_conflict", "compact"], kinds
    want = dict(_rows(root))
    assert (want[5], want[25], want[45]) == ("during-0-5", "during-1-25", "during-2-45")
    assert len(_rowsets(root)) < 8
    assert not manager.errors


def test_a_merge_that_fails_closes_the_replica_so_the_next_request_reopens_it(
        stacked: tuple[str, TabletLeader], monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged input met by the unlocked merge fails the tablet, as under the lock; the
    cached handle is closed, so the next request opens the replica from its files."""
    from pyspark_kudu.errors import CorruptionError
    from pyspark_kudu.spark.host.replica_cache import cached_memory
    from pyspark_kudu.tablet import tablet_compaction as tablet_module

    root, _ = stacked
    before = _rows(root)

    def damaged(*args: object, **kwargs: object) -> object:
        raise CorruptionError("a damaged input rowset (injected)")

    monkeypatch.setattr(tablet_module, "write_merged", damaged)
    with pytest.raises(CorruptionError, match="injected"):
        maintain_replica(root, "t", MaintenancePolicy(busy_s=0, budget_bytes=1 << 30))
    assert (root, "t") not in cached_memory()
    monkeypatch.undo()
    assert _rows(root) == before and len(_rowsets(root)) == 8  # reopened from its files


# -- copies first ----------------------------------------------------------------------------
def test_maintenance_waits_while_this_process_fetches_a_tablet_copy(
        stacked: tuple[str, TabletLeader]) -> None:
    """While a copy is being fetched here (``copy_traffic``), an operation does not start;
    it starts when the fetch ends, and a compaction's merge asks again before its chunk."""
    import threading
    import time

    from pyspark_kudu.spark.host import copy_traffic

    root, _ = stacked
    before = _rows(root)
    calls: list[tuple[float, float]] = []  # (returned at, seconds waited)
    entered = threading.Event()

    def pause() -> float:
        entered.set()
        waited = copy_traffic.wait_for_copies(60.0)
        calls.append((time.monotonic(), waited))
        return waited

    manager = MaintenanceManager(MaintenancePolicy(flush_idle_s=0, busy_s=0), pause=pause)
    manager.note(root)
    done: list[list[object]] = []
    with copy_traffic.fetching():
        assert copy_traffic.copies_fetching() == 1
        worker = threading.Thread(target=lambda: done.append(list(manager.run_once())))
        worker.start()
        assert entered.wait(30), "the maintenance cycle never asked to step aside"
        assert len(_rowsets(root)) == 8 and worker.is_alive(), "it merged during the fetch"
        released = time.monotonic()
    worker.join(60)
    assert not worker.is_alive(), "the cycle did not go on once the fetch ended"
    assert copy_traffic.copies_fetching() == 0
    (op,) = done[0]
    assert op.kind == "compact" and len(_rowsets(root)) == 1  # type: ignore[attr-defined]
    assert _rows(root) == before
    first_returned, first_waited = calls[0]
    # The fetch ended after ``released`` was read, so a wait that lasted until it ended
    # returned after that instant (and did wait).
    assert first_returned >= released and first_waited > 0, "it did not wait for the fetch"
    assert len(calls) >= 2, "the merge did not ask before its chunk"  # before op + chunk
    assert manager.paused_s == pytest.approx(sum(w for _, w in calls))


def test_waiting_for_copies_is_bounded_and_free_when_none_runs() -> None:
    import threading
    import time

    from pyspark_kudu.spark.host import copy_traffic

    assert copy_traffic.wait_for_copies(30.0) < 1.0  # none runs: no wait
    with copy_traffic.fetching():
        t0 = time.monotonic()
        waited = copy_traffic.wait_for_copies(0.2)
        assert 0.2 <= waited and time.monotonic() - t0 >= 0.2  # the bound, then it goes on
    # A fetch ending wakes a waiter at once (not at its bound).
    started = threading.Event()
    ended: list[float] = []
    with copy_traffic.fetching():
        waiter = threading.Thread(
            target=lambda: (started.set(), ended.append(copy_traffic.wait_for_copies(300.0))))
        waiter.start()
        assert started.wait(30)
    waiter.join(60)
    assert ended and ended[0] < 300.0
