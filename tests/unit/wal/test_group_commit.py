"""Group commit: many appenders, one sync thread, one sync per group, order kept."""

from __future__ import annotations

import threading
from pathlib import Path

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal import Log, SyncPolicy, WalOptions, WalStorage

WRITERS = 8
PER_WRITER = 40


def _run_writers(log: Log) -> None:
    """Each writer reserves the next index under a shared lock (Kudu's Reserve), enqueues
    inside it so that index order is enqueue order, and waits for durability outside it."""
    order = threading.Lock()
    next_index = [1]
    start = threading.Barrier(WRITERS)

    def writer(w: int) -> None:
        start.wait()
        for k in range(PER_WRITER):
            with order:
                index = next_index[0]
                next_index[0] += 1
                fut = log.append_async([Entry(1, index, data=f"w{w}k{k}".encode())])
            assert fut.result(timeout=30) == index

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _assert_every_entry_once_in_order(log: Log) -> None:
    total = WRITERS * PER_WRITER
    got = log.read(1, total + 1)
    assert [e.index for e in got] == list(range(1, total + 1))
    payloads = [e.data.decode() for e in got]
    assert sorted(payloads) == sorted(f"w{w}k{k}" for w in range(WRITERS)
                                      for k in range(PER_WRITER))
    for w in range(WRITERS):  # each writer's own entries keep their order
        mine = [p for p in payloads if p.startswith(f"w{w}k")]
        assert mine == [f"w{w}k{k}" for k in range(PER_WRITER)]


def test_concurrent_appenders_get_every_entry_exactly_once_in_order(wal_io: FileIO) -> None:
    options = WalOptions(segment_size=4096, sync_policy=SyncPolicy.FDATASYNC)
    with Log.open(wal_io, options) as log:
        _run_writers(log)
        _assert_every_entry_once_in_order(log)
    with Log.open(wal_io, WalOptions(cache_bytes=0)) as log:
        _assert_every_entry_once_in_order(log)


def test_concurrent_appenders_share_syncs(wal_io: FileIO) -> None:
    with Log.open(wal_io, WalOptions(sync_policy=SyncPolicy.FDATASYNC)) as log:
        _run_writers(log)
        stats = log.stats()
    assert stats.entries == stats.appends == WRITERS * PER_WRITER
    # One segment: its creation costs one fsync, every group one fdatasync.
    assert stats.syncs == stats.groups + 1
    assert stats.groups < stats.appends
    assert stats.largest_group > 1


def test_a_lone_appender_pays_one_sync_per_append(wal_io: FileIO) -> None:
    with Log.open(wal_io, WalOptions(sync_policy=SyncPolicy.FSYNC)) as log:
        for i in range(1, 11):
            log.append([Entry(1, i)])
        assert log.stats().groups == 10
        assert log.stats().syncs == 11


def test_sync_policy_none_issues_no_syncs_for_appends(wal_io: FileIO) -> None:
    with Log.open(wal_io, WalOptions(sync_policy=SyncPolicy.NONE)) as log:
        for i in range(1, 11):
            log.append([Entry(1, i)])
        assert log.stats().syncs == 0
        assert log.read(1, 11)[-1].index == 10


def test_wal_storage_appends_from_many_threads_share_syncs(tmp_path: Path) -> None:
    order = threading.Lock()

    def writer(s: WalStorage, w: int) -> None:
        for k in range(PER_WRITER):
            with order:  # last_index() + 1 and the enqueue must not interleave
                fut = s.append_async([Entry(1, s.last_index() + 1, data=f"w{w}k{k}".encode())])
            fut.result(timeout=30)

    with WalStorage.open(str(tmp_path / "t1")) as s:
        threads = [threading.Thread(target=writer, args=(s, w)) for w in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = s.wal_stats()
        assert s.last_index() == WRITERS * PER_WRITER
    assert stats.groups < stats.appends
    with WalStorage.open(str(tmp_path / "t1")) as s:
        assert len(s.entries(1, WRITERS * PER_WRITER + 1)) == WRITERS * PER_WRITER


class _Watched(bytes):
    """Entry data that reports when it is freed."""

    freed = threading.Event()

    def __del__(self) -> None:
        _Watched.freed.set()


def test_an_idle_log_holds_no_reference_to_the_entries_it_wrote(wal_io: FileIO) -> None:
    # No entry cache: what the log keeps after a write is then only the sync thread's.
    with Log.open(wal_io, WalOptions(sync_policy=SyncPolicy.NONE, cache_bytes=0)) as log:
        _Watched.freed.clear()
        log.append([Entry(1, 1, data=_Watched(b"x" * (1 << 20)))])
        # The caller's references are gone with the call; the sync thread must not keep
        # the group it wrote while it waits for the next one (idle logs held whole rounds).
        assert _Watched.freed.wait(timeout=10), (
            "an idle log still holds the data of the entry it wrote")
        assert log.read(1, 2)[0].data == b"x" * (1 << 20)
