"""Replicated writes reach every replica's tablet, with Kudu's per-row errors for the writer."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pyspark_kudu.schema import ColumnSchema, Predicate, Schema
from pyspark_kudu.spark.host.handlers import replica_storage
from pyspark_kudu.spark.host.wal_committed_log import WalCommittedLog
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, Tablet, encode_write_batch
from pyspark_kudu.wal import SyncPolicy, WalOptions

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))


def _rows(root: str, snapshot: int | None = None) -> list[dict[str, object]]:
    with replica_storage(root, "t", OPTS) as st:
        t = Tablet.open(root, "t", log=WalCommittedLog(st))
        try:
            return sorted(t.scan_table(snapshot=snapshot).to_pylist(), key=lambda r: r["id"])
        finally:
            t.close()


def test_rows_commit_on_every_replica_and_duplicates_are_reported_per_row(
    tmp_path: Path,
) -> None:
    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    tablet = TabletReplicas("t", TS)
    lead = TabletLeader(tablet, "ts-b", transport)
    lead.create(SCHEMA.to_json())
    lead.elect()
    first = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [1, 2], "v": ["a", "b"]}))
    again = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [2, 3], "v": ["x", "c"]}))
    positions = lead.propose([first, again])
    results = lead.take_results([i for i, _ in positions])
    r1, r2 = (results[i] for i, _ in positions)
    assert r1.ok and r1.num_rows == 2
    assert [(e.row, e.status) for e in r2.errors] == [(0, "AlreadyPresent")]
    lead.heartbeat()
    want = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}]
    for ts in TS:
        assert _rows(transport.roots[ts]) == want, ts
    # MVCC: a snapshot at the first entry's index sees only its rows.
    assert _rows(transport.roots["ts-a"], snapshot=positions[0][0]) == want[:2]


def test_a_point_lookup_on_a_follower_sees_the_committed_update(tmp_path: Path) -> None:
    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)
    lead.create(SCHEMA.to_json())
    lead.elect()
    lead.propose([encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({"id": [7], "v": ["old"]}))])
    (pos,) = lead.propose([encode_write_batch(SCHEMA, OpType.UPDATE,
                                              pa.table({"id": [7], "v": ["new"]}))])
    lead.take_results([pos[0]])
    lead.heartbeat()
    with replica_storage(transport.roots["ts-c"], "t", OPTS) as st:
        t = Tablet.open(transport.roots["ts-c"], "t", log=WalCommittedLog(st))
        try:
            assert t.scan_table(predicates=[Predicate.eq("id", 7)]).to_pylist() == [
                {"id": 7, "v": "new"}]
        finally:
            t.close()


def test_per_row_results_wait_for_the_leaders_apply_only_and_followers_apply_later(
    tmp_path: Path,
) -> None:
    from pyspark_kudu.spark.host.handlers import tablet_dir
    from pyspark_kudu.spark.host.replica_apply import read_applied

    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)
    lead.create(SCHEMA.to_json())
    lead.elect()
    lead.propose([encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({"id": [1], "v": ["a"]}))])
    lead.heartbeat()
    applied_before = {ts: read_applied(tablet_dir(transport.roots[ts], "t")) for ts in TS}
    (pos,) = lead.propose([encode_write_batch(SCHEMA, OpType.INSERT,
                                              pa.table({"id": [1, 2], "v": ["x", "b"]}))])
    results = lead.take_results([pos[0]])
    assert [(e.row, e.status) for e in results[pos[0]].errors] == [(0, "AlreadyPresent")]
    assert read_applied(tablet_dir(transport.roots["ts-a"], "t")) >= pos[0]
    for ts in ("ts-b", "ts-c"):  # they know the commit but have not applied it yet
        assert read_applied(tablet_dir(transport.roots[ts], "t")) == applied_before[ts], ts
    lead.heartbeat()  # the next round that does not defer: followers apply, in order
    want = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    for ts in TS:
        assert read_applied(tablet_dir(transport.roots[ts], "t")) >= pos[0], ts
        assert _rows(transport.roots[ts]) == want, ts
