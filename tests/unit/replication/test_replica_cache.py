"""Open replicas are reused across requests of one process, and reopened when another
process changed them (pyspark_kudu.spark.host.replica_cache): no entry is lost either way."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import EntryType, HardState
from pyspark_kudu.errors import FencedError
from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind, replica_storage, tablet_dir
from pyspark_kudu.spark.host.replica_cache import (
    cache_stats,
    cached_memory,
    clear_cache,
    close_stale,
    delete_replica,
    open_replica,
)
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.wal import SyncPolicy, WalOptions

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=True)
TS = ("ts-a", "ts-b", "ts-c")
TABLET = TabletReplicas("t1", TS)

OTHER_CLIENT = textwrap.dedent("""
    import sys
    from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
    from pyspark_kudu.spark.replication.peer_transport import DirectTransport
    from pyspark_kudu.wal import SyncPolicy, WalOptions
    opts = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=True)
    ts = ("ts-a", "ts-b", "ts-c")
    t = DirectTransport(dict(zip(ts, sys.argv[1:4])), opts)
    lead = TabletLeader(TabletReplicas("t1", ts), "ts-b", t, seed=1)
    lead.elect()
    lead.propose([b"other-1", b"other-2"])
    lead.heartbeat()
""")


def _log(root: str) -> list[bytes]:
    with replica_storage(root, TABLET.tablet_id, OPTS) as st:
        ents = st.entries(st.first_index(), st.last_index() + 1)
    return [e.data for e in ents if e.type == EntryType.NORMAL and e.data]


@pytest.fixture
def transport(tmp_path: Path) -> DirectTransport:
    clear_cache()
    return DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)


def test_consecutive_rounds_reuse_the_open_replicas(transport: DirectTransport) -> None:
    lead = TabletLeader(TABLET, "ts-a", transport)
    lead.create()
    lead.elect()
    before = cache_stats()
    for k in range(5):
        lead.propose([f"w{k}".encode()])
    after = cache_stats()
    assert after["opens"] == before["opens"], "a replica was reopened without a reason"
    assert after["hits"] - before["hits"] >= 10
    assert _log(transport.roots["ts-c"]) == [f"w{k}".encode() for k in range(5)]


def test_a_reader_without_wal_options_reuses_a_replica_opened_with_them(
    transport: DirectTransport,
) -> None:
    # Rounds pass the client's WalOptions, scans and log-entry reads pass None: a reader
    # must not close and reopen (recover the WAL of) a replica a round left open.
    lead = TabletLeader(TABLET, "ts-a", transport)
    lead.create()
    lead.elect()
    root = transport.roots["ts-c"]
    before = cache_stats()
    for k in range(3):
        lead.propose([f"w{k}".encode()])
        with open_replica(root, tablet_dir(root, TABLET.tablet_id), TABLET.tablet_id, None,
                          mutate=False) as handle:
            assert handle.options == OPTS
            assert handle.storage.last_index() >= k + 1
    after = cache_stats()
    assert after["opens"] == before["opens"], "a reader reopened a replica a round left open"


def test_the_memory_report_counts_the_replica_a_request_holds(transport: DirectTransport
                                                             ) -> None:
    import pyarrow as pa

    from pyspark_kudu.schema import ColumnSchema, Schema
    from pyspark_kudu.spark.host.replica_cache import memory_report
    from pyspark_kudu.tablet import OpType, encode_write_batch

    schema = Schema((ColumnSchema("id", "int64", nullable=False),), ("id",))
    lead = TabletLeader(TABLET, "ts-a", transport)
    lead.create(schema.to_json())
    lead.elect()
    positions = lead.propose([encode_write_batch(schema, OpType.UPSERT,
                                                 pa.table({"id": list(range(5000))}))])
    lead.take_results([i for i, _ in positions])  # the leader's replica applied it
    root = transport.roots["ts-a"]
    with open_replica(root, tablet_dir(root, TABLET.tablet_id), TABLET.tablet_id, OPTS,
                      mutate=False) as handle:
        mrs = handle.memory_bytes()[0]
        inside = memory_report()
    after = memory_report()
    assert mrs > 0
    assert inside["replicas_in_use"] == 1 and inside["memrowset_bytes"] >= mrs, inside
    assert after["replicas_in_use"] == 0 and after["memrowset_bytes"] >= mrs, after


def test_a_change_by_another_process_is_seen_and_nothing_is_lost(
    transport: DirectTransport,
) -> None:
    lead = TabletLeader(TABLET, "ts-a", transport)
    lead.create()
    lead.elect()
    lead.propose([b"mine-1"])
    opens = cache_stats()["opens"]
    subprocess.run([sys.executable, "-c", OTHER_CLIENT, *(transport.roots[t] for t in TS)],
                   check=True, timeout=120)
    # The other client's election fenced this one; the cached replicas are stale now.
    with pytest.raises(FencedError):
        lead.propose([b"fenced"])
    again = TabletLeader(TABLET, "ts-a", transport, seed=2)
    again.elect()
    again.propose([b"mine-2"])
    again.heartbeat()
    assert cache_stats()["opens"] > opens, "stale cached replicas were not reopened"
    for ts in TS:
        assert _log(transport.roots[ts]) == [b"mine-1", b"other-1", b"other-2", b"mine-2"], ts


def test_a_deleted_replica_is_gone_and_a_late_request_does_not_recreate_it(
    transport: DirectTransport,
) -> None:
    lead = TabletLeader(TABLET, "ts-a", transport)
    lead.create()
    lead.elect()
    lead.propose([b"x"])
    root = transport.roots["ts-c"]
    assert delete_replica(root, tablet_dir(root, TABLET.tablet_id), TABLET.tablet_id)
    assert not Path(root, "tablets", TABLET.tablet_id).exists()
    (resp,) = transport.run({"ts-c": [PeerRequest(RequestKind.READ_STATE, TABLET.tablet_id,
                                                  "ts-c")]})["ts-c"] or [None]
    assert resp is not None and not resp.ok and "no replica" in resp.error
    assert not Path(root, "tablets", TABLET.tablet_id).exists()
    assert not delete_replica(root, tablet_dir(root, TABLET.tablet_id), TABLET.tablet_id)


def test_a_request_that_waited_while_its_replica_was_deleted_is_refused_not_an_os_error(
    transport: DirectTransport, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table deleted while a round's request for one of its replicas waits for the
    replica's lock: the request found the replica (checked before locking) and then locks a
    directory that ``delete_replica`` moved away. It is refused like a late request (a
    per-request error), where it used to raise ``FileNotFoundError`` writing the replica's
    generation file, which failed the whole round (seen in a 10M-row scale run)."""
    from pyspark_kudu.spark.host import replica_cache

    lead = TabletLeader(TABLET, "ts-a", transport)
    lead.create()
    lead.elect()
    lead.propose([b"x"])
    clear_cache()
    root = transport.roots["ts-c"]
    real_flock = replica_cache.fcntl.flock
    deleted: list[bool] = []
    raced = False

    def flock_after_a_delete(fd: int, op: int) -> None:
        nonlocal raced
        if not raced:  # the WIPE got the lock first: it runs to the end, then this one
            raced = True
            deleted.append(delete_replica(root, tablet_dir(root, TABLET.tablet_id),
                                          TABLET.tablet_id))
        real_flock(fd, op)

    monkeypatch.setattr(replica_cache.fcntl, "flock", flock_after_a_delete)
    (resp,) = transport.run({"ts-c": [PeerRequest(RequestKind.READ_STATE, TABLET.tablet_id,
                                                  "ts-c")]})["ts-c"] or [None]
    assert deleted == [True]
    assert resp is not None and not resp.ok, resp
    assert "deleted while this request waited" in resp.error
    assert not Path(root, "tablets", TABLET.tablet_id).exists()  # nothing recreated
    monkeypatch.setattr(replica_cache.fcntl, "flock", real_flock)
    (again,) = transport.run({"ts-c": [PeerRequest(RequestKind.READ_STATE, TABLET.tablet_id,
                                                   "ts-c")]})["ts-c"] or [None]
    assert again is not None and not again.ok and "no replica" in again.error



RECREATE = textwrap.dedent("""
    import shutil, sys
    from pathlib import Path
    from pyspark_kudu.consensus.messages import HardState
    from pyspark_kudu.spark.host.handlers import tablet_dir
    from pyspark_kudu.spark.host.replica_cache import open_replica
    from pyspark_kudu.wal import SyncPolicy, WalOptions
    opts = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=True)
    root = sys.argv[1]
    shutil.rmtree(Path(root, "tablets", "t1"))  # the disk lost, then the same steps again
    with open_replica(root, tablet_dir(root, "t1"), "t1", opts, mutate=True) as h:
        h.storage.set_hard_state(HardState(9, "", 0))
""")


def test_a_replica_deleted_and_created_again_elsewhere_is_never_served_from_the_cache(
    tmp_path: Path,
) -> None:
    """Another process deletes the replica and creates it again with the same sequence of
    requests: this process's cached handle of the old incarnation must not be reused (a
    counter as generation would match again)."""
    clear_cache()
    root = str(tmp_path / "ts-a")
    io = tablet_dir(root, "t1")
    with open_replica(root, io, "t1", OPTS, mutate=True) as h:
        h.storage.set_hard_state(HardState(7, "", 0))
    subprocess.run([sys.executable, "-c", RECREATE, root], check=True, timeout=120)
    with open_replica(root, io, "t1", OPTS, mutate=False) as h:
        term = h.storage.initial_state()[0].term
    assert term == 9, f"this process served the old incarnation (term {term}) from its cache"


OTHER_PROCESS = textwrap.dedent("""
    import sys
    from pyspark_kudu.spark.host.handlers import tablet_dir
    from pyspark_kudu.spark.host.replica_cache import delete_replica, open_replica
    from pyspark_kudu.wal import SyncPolicy, WalOptions
    opts = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=True)
    what, root = sys.argv[1:3]
    if what == "delete":
        assert delete_replica(root, tablet_dir(root, "t1"), "t1")
    else:  # a request that may change the replica: a new generation, nothing else
        with open_replica(root, tablet_dir(root, "t1"), "t1", opts, mutate=True):
            pass
""")


def test_close_stale_closes_what_another_process_deleted_or_changed_and_keeps_the_rest(
    transport: DirectTransport,
) -> None:
    """A table deleted by another process (a pinned task) leaves this process's cached
    handles behind, holding MemRowSets nobody will open again: ``close_stale`` (run by the
    host's maintenance every cycle) closes exactly those, and a changed replica's."""
    lead = TabletLeader(TABLET, "ts-c", transport)
    lead.create()
    lead.elect()
    lead.propose([b"x"])
    lead.heartbeat()
    cached = {root for root, _ in cached_memory()}
    assert cached == set(transport.roots.values())
    assert close_stale() == 0, "a replica nobody else touched was closed"

    def other(what: str, ts: str) -> None:
        subprocess.run([sys.executable, "-c", OTHER_PROCESS, what, transport.roots[ts]],
                       check=True, timeout=120)

    other("delete", "ts-a")
    other("change", "ts-b")
    before = cache_stats()["closed_stale"]
    assert close_stale() == 2
    assert cache_stats()["closed_stale"] == before + 2
    assert {root for root, _ in cached_memory()} == {transport.roots["ts-c"]}
    assert not Path(transport.roots["ts-a"], "tablets", TABLET.tablet_id).exists()
    # ts-b's changed replica is reopened from its files by the next request, intact.
    opens = cache_stats()["opens"]
    lead.propose([b"y"])
    assert cache_stats()["opens"] == opens + 1
    assert _log(transport.roots["ts-b"]) == [b"x", b"y"]
