"""DESIGN §3 replication rounds over real WAL files, with the in-process transport.

A ``TabletLeader`` in the "driver" elects itself on behalf of one replica, appends, and
commits on a majority; replicas' durable state is read back from their data roots.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.errors import FencedError, RoundFailedError
from pyspark_kudu.spark.host.handlers import replica_storage
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.wal import SyncPolicy, WalOptions

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")
TABLET = TabletReplicas("t1", TS)


@pytest.fixture
def transport(tmp_path: Path) -> DirectTransport:
    return DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)


def _log(t: DirectTransport, ts: str) -> list[bytes]:
    with replica_storage(t.roots[ts], TABLET.tablet_id, OPTS) as st:
        ents = st.entries(st.first_index(), st.last_index() + 1)
    return [e.data for e in ents if e.type == EntryType.NORMAL and e.data]


def _new_leader(t: DirectTransport, leader: str = "ts-a", seed: int = 0) -> TabletLeader:
    lead = TabletLeader(TABLET, leader, t, seed=seed)
    lead.elect()
    return lead


def test_write_commits_and_every_replica_holds_it_durably(transport: DirectTransport) -> None:
    TabletLeader(TABLET, "ts-a", transport).create()
    lead = _new_leader(transport)
    positions = lead.propose([b"w1", b"w2"])
    assert [p[1] for p in positions] == [lead.node.term] * 2  # type: ignore[union-attr]
    assert lead.node is not None and lead.node.commit_index >= positions[-1][0]
    lead.heartbeat()  # deliver the commit index
    for ts in TS:
        assert _log(transport, ts) == [b"w1", b"w2"]


def test_a_write_commits_with_one_replica_down_and_the_replica_catches_up_later(
    transport: DirectTransport,
) -> None:
    TabletLeader(TABLET, "ts-a", transport).create()
    lead = _new_leader(transport)
    transport.down.add("ts-c")
    lead.propose([b"x"])
    assert _log(transport, "ts-c") == []
    transport.down.clear()
    lead.heartbeat()
    lead.heartbeat()
    assert _log(transport, "ts-c") == [b"x"]


def test_no_majority_means_a_clear_error(transport: DirectTransport) -> None:
    TabletLeader(TABLET, "ts-a", transport).create()
    lead = _new_leader(transport)
    transport.down.update({"ts-b", "ts-c"})
    with pytest.raises(RoundFailedError, match="majority"):
        lead.propose([b"lost"])


def test_a_second_client_fences_the_first_and_no_acknowledged_write_is_lost(
    transport: DirectTransport,
) -> None:
    TabletLeader(TABLET, "ts-a", transport).create()
    first = _new_leader(transport, "ts-a")
    first.propose([b"from-first"])
    second = _new_leader(transport, "ts-b", seed=1)
    assert second.node is not None and first.node is not None
    assert second.node.term > first.node.term
    second.propose([b"from-second"])
    with pytest.raises(FencedError):
        first.propose([b"stale"])
    second.heartbeat()
    for ts in TS:
        log = _log(transport, ts)
        assert log[:2] == [b"from-first", b"from-second"]
        assert b"stale" not in log  # fenced before anything was written anywhere


def test_a_lagging_replica_is_caught_up_from_the_leader_log_after_a_leader_change(
    transport: DirectTransport,
) -> None:
    TabletLeader(TABLET, "ts-a", transport).create()
    transport.down.add("ts-c")
    first = _new_leader(transport, "ts-a")
    first.propose([b"a", b"b", b"c"])
    transport.down.clear()
    # A new client knows only ts-a's tail after its commit index: ts-c needs older entries.
    second = _new_leader(transport, "ts-a", seed=2)
    second.propose([b"d"])
    second.heartbeat()
    assert _log(transport, "ts-c") == [b"a", b"b", b"c", b"d"]


def test_a_retried_round_writes_nothing_twice(transport: DirectTransport) -> None:
    TabletLeader(TABLET, "ts-a", transport).create()
    lead = _new_leader(transport)
    lead.propose([b"once"])
    lead.heartbeat()
    with replica_storage(transport.roots["ts-a"], "t1", OPTS) as st:
        before = st.wal_stats()
        last = st.last_index()
        again = st.entries(last, last + 1)
    from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind, handle_requests

    assert lead.node is not None
    resp = handle_requests(transport.roots["ts-a"], [PeerRequest(
        RequestKind.PERSIST, "t1", "ts-a", term=lead.node.term, entries=tuple(again))],
        options=OPTS)
    assert resp[0].ok
    with replica_storage(transport.roots["ts-a"], "t1", OPTS) as st:
        assert st.last_index() == last
        assert st.wal_stats().appends == before.appends


def test_a_write_returns_only_once_a_majority_holds_it_durably(
    transport: DirectTransport,
) -> None:
    TabletLeader(TABLET, "ts-a", transport).create()
    lead = _new_leader(transport)
    for k in range(5):
        transport.down = {TS[1 + k % 2]}  # a different follower is down each time
        lead.propose([f"w{k}".encode()])
        # Reopening the WAL from disk = what survives a crash of every process right now.
        holders = [ts for ts in TS if f"w{k}".encode() in _log(transport, ts)]
        assert len(holders) >= 2, f"write w{k} returned while only {holders} held it"
