"""The WAL's entry cache: what one log keeps, and the process-wide budget over all of them."""

from __future__ import annotations

import gc
import os

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import Log, WalOptions
from pyspark_kudu.wal.entry_cache import ENTRY_CACHES, EntryCache, EntryCacheBudget

SIZE = Entry(1, 1, data=b"x" * 100).size()


def _e(index: int, n: int = 100) -> Entry:
    return Entry(1, index, data=bytes([index % 256]) * n)


def test_a_full_cache_keeps_the_entries_next_in_line_until_they_are_applied() -> None:
    cache = EntryCache(3 * SIZE)
    for i in (1, 2, 3):
        cache.put(_e(i))
    cache.put(_e(4))  # full: 1-3 are applied first, so 4 waits (read from disk later)
    assert cache.indexes() == [1, 2, 3]
    cache.release(2)  # applied through 2: they leave
    assert cache.indexes() == [3] and cache.nbytes == SIZE
    cache.put(_e(4))  # read back from disk as the replica gets to it: kept now
    cache.put(_e(5))
    assert cache.indexes() == [3, 4, 5]


def test_an_applied_entry_is_not_kept_and_a_gap_is_filled_in_order() -> None:
    cache = EntryCache(10 * SIZE)
    cache.release(4)
    cache.put(_e(3))  # read back for a lagging follower
    assert len(cache) == 0
    cache.put(_e(5))
    cache.put(_e(8))
    cache.put(_e(6))  # read back from disk, below an entry kept already
    assert cache.indexes() == [5, 6, 8]
    replaced = _e(8, 50)
    cache.put(replaced)  # the same index again (a truncation's replacement) replaces
    assert cache.get(8) is replaced and cache.nbytes == 3 * SIZE - 50
    cache.release(6)
    assert cache.indexes() == [8]


def test_an_entry_larger_than_the_limit_is_not_kept() -> None:
    cache = EntryCache(SIZE - 1)
    cache.put(_e(1))
    assert len(cache) == 0 and cache.nbytes == 0


def test_forget_and_clear_release_the_bytes() -> None:
    cache = EntryCache(10 * SIZE)
    for i in range(1, 6):
        cache.put(_e(i))
    cache.forget(lambda i: i >= 4)
    assert cache.indexes() == [1, 2, 3] and cache.nbytes == 3 * SIZE
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_budget_sheds_the_idle_cache_first_and_keeps_the_total_under_it() -> None:
    budget = EntryCacheBudget(4 * SIZE)
    idle, busy = EntryCache(10 * SIZE, budget), EntryCache(10 * SIZE, budget)
    for i in (1, 2, 3):
        idle.put(_e(i))
    for i in (1, 2, 3):
        busy.put(_e(i))
        assert budget.total_bytes() <= 4 * SIZE
    # The idle cache gave up its newest entries (it needs them last); the one adding kept
    # all of its own.
    assert idle.indexes() == [1] and busy.indexes() == [1, 2, 3]
    assert budget.shed_bytes == 2 * SIZE
    busy.put(_e(4))
    busy.put(_e(5))  # nothing left to take from the idle cache: 5 is not kept
    assert len(idle) == 0 and budget.total_bytes() == 4 * SIZE
    assert busy.indexes() == [1, 2, 3, 4]


def test_a_cache_locked_by_another_thread_is_skipped_not_waited_for() -> None:
    budget = EntryCacheBudget(2 * SIZE)
    other, mine = EntryCache(10 * SIZE, budget), EntryCache(10 * SIZE, budget)
    other.put(_e(1))
    other.put(_e(2))
    with other._lock:  # another thread is reading it right now
        mine.put(_e(1))
    assert other.indexes() == [1, 2] and len(mine) == 0  # the adder gave up its own
    mine.put(_e(2))  # unlocked now: the other cache gives up its newest
    assert other.indexes() == [1] and mine.indexes() == [2]


def test_a_collected_cache_leaves_the_budget() -> None:
    budget = EntryCacheBudget(10 * SIZE)
    cache = EntryCache(10 * SIZE, budget)
    cache.put(_e(1))
    assert budget.total_bytes() == SIZE
    del cache
    gc.collect()
    assert budget.total_bytes() == 0 and not budget._caches


def test_a_log_reads_a_large_batch_it_just_wrote_from_memory(wal_io: FileIO) -> None:
    # A 65,536-row write batch of a 7-column table is 4-5 MiB: the former 4 MiB cache could
    # not hold one, so every apply read it back from the segment (pread, CRC, copies).
    big = Entry(1, 1, data=os.urandom(5 << 20))
    with Log.open(wal_io, WalOptions()) as log:
        log.append([big])
        assert log.read(1, 2)[0] is big
        assert ENTRY_CACHES.total_bytes() >= big.size()
    with Log.open(wal_io, WalOptions(cache_bytes=4 << 20)) as log:
        (again,) = log.read(1, 2)  # too large for this log's cache: from the segment
        assert again == big and again is not big


def test_a_log_keeps_what_its_replica_applies_next(wal_io: FileIO) -> None:
    ents = [Entry(1, i, data=bytes([i]) * (1 << 20)) for i in range(1, 5)]
    with Log.open(wal_io, WalOptions(cache_bytes=2 * ents[0].size())) as log:
        log.append(ents)
        assert log.cached_indexes() == [1, 2]  # 3 and 4 wait for room
        log.release_applied(2)
        assert log.cached_indexes() == []
        (third,) = log.read(3, 4)  # from the segment, and kept for the reads that follow
        assert log.cached_indexes() == [3] and log.read(3, 4)[0] is third


def test_closing_a_log_empties_its_cache(wal_io: FileIO) -> None:
    before = ENTRY_CACHES.total_bytes()
    log = Log.open(wal_io, WalOptions())
    log.append([Entry(1, 1, data=b"y" * 1000)])
    log.sync()
    assert ENTRY_CACHES.total_bytes() > before
    log.close()
    assert ENTRY_CACHES.total_bytes() == before
