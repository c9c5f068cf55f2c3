"""Write batches staged on executors travel as refs through the driver's log and are replaced
by the real batch on each replica (pyspark_kudu.spark.host.dataplane); a ref never reaches a log."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import RoundFailedError
from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema, RangePartition
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host.dataplane import (
    REF_MAGIC,
    WAL_REF_MIN_BYTES,
    StagedRef,
    remove_staging,
    stage_batches,
)
from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind, replica_storage
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, decode_write_batch
from pyspark_kudu.wal import SyncPolicy, WalOptions

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.NONE, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
ONE_TABLET = Partitioner(SCHEMA, PartitionSchema(()))


def _stage(root: Path, ids: list[int], write_id: str = "w1", max_rows: int = 1000,
           partitioner: Partitioner = ONE_TABLET, width: int = 2) -> list[StagedRef]:
    fn = stage_batches(SCHEMA, partitioner, OpType.INSERT, write_id, str(root), max_rows)
    rng = random.Random(7)  # incompressible values, so that the batches are large
    batch = pa.RecordBatch.from_pydict(
        {"id": ids, "v": ["".join(rng.choices(string.ascii_letters, k=width)) for _ in ids]})
    refs = []
    for out in fn(iter([batch])):
        for ref in out.column(0).to_pylist():
            decoded = StagedRef.decode(ref)
            assert decoded is not None
            refs.append(decoded)
    return refs


def _log_data(root: str) -> list[bytes]:
    with replica_storage(root, "t", OPTS) as st:
        return [e.data for e in st.entries(st.first_index(), st.last_index() + 1, None)]


def _ids_in_log(root: str) -> list[int]:
    ids: list[int] = []
    for data in _log_data(root):
        wb = decode_write_batch(data)
        if wb is not None:
            ids.extend(wb.rows.column("id").to_pylist())
    return sorted(ids)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[DirectTransport, TabletLeader, Path]:
    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)
    lead.create(SCHEMA.to_json())
    lead.elect()
    return transport, lead, tmp_path / "exec"


def test_staging_splits_rows_by_tablet_and_batch_size(tmp_path: Path) -> None:
    parts = Partitioner(SCHEMA, PartitionSchema((HashDimension(("id",), 3),)))
    refs = _stage(tmp_path, list(range(50)), max_rows=7, partitioner=parts)
    assert sum(r.rows for r in refs) == 50
    assert all(r.rows <= 7 for r in refs)
    assert {r.tablet for r in refs} == {0, 1, 2}
    for ref in refs:
        wb = decode_write_batch((tmp_path / ref.path).read_bytes())
        assert wb is not None
        ids = wb.rows.column("id").to_pylist()
        assert {parts.route_batch(pa.table({"id": [i], "v": [""]}))[0] for i in ids} == {
            ref.tablet}


def test_refs_commit_and_every_replica_logs_the_real_batch(
    setup: tuple[DirectTransport, TabletLeader, Path],
) -> None:
    transport, lead, staging = setup
    refs = _stage(staging, [1, 2, 3])
    positions = lead.propose([r.encode() for r in refs])
    results = lead.take_results([i for i, _ in positions])
    assert [results[i].num_rows for i, _ in positions] == [3]
    lead.heartbeat()
    for ts in TS:
        logged = _log_data(transport.roots[ts])
        assert not any(d.startswith(REF_MAGIC) for d in logged), ts
        assert _ids_in_log(transport.roots[ts]) == [1, 2, 3], ts


def test_a_damaged_staged_batch_is_refused_and_nothing_is_written(
    setup: tuple[DirectTransport, TabletLeader, Path],
) -> None:
    transport, lead, staging = setup
    (ref,) = _stage(staging, [1, 2])
    path = staging / ref.path
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RoundFailedError, match="could not persist"):
        lead.propose([ref.encode()])
    for ts in TS:
        assert _ids_in_log(transport.roots[ts]) == [], ts


def test_after_release_a_follower_back_later_is_caught_up_from_the_leader_log(
    setup: tuple[DirectTransport, TabletLeader, Path],
) -> None:
    transport, lead, staging = setup
    transport.down.add("ts-c")
    refs = _stage(staging, [1, 2, 3], max_rows=1, width=2 * WAL_REF_MIN_BYTES)
    assert all(r.size >= WAL_REF_MIN_BYTES for r in refs)
    positions = lead.propose([r.encode() for r in refs])
    lead.take_results([i for i, _ in positions])
    lead.release(positions[-1][0])
    assert remove_staging(str(staging), ["w1"]) == 1
    # The leader replica hands out its large entries as refs to its own log ...
    (resp,) = transport.run({"ts-a": [PeerRequest(
        RequestKind.READ_ENTRIES, "t", "ts-a", lo=positions[0][0], hi=positions[-1][0] + 1,
        as_refs=True)]})["ts-a"] or [None]
    assert resp is not None and resp.ok
    assert all(StagedRef.decode(e.data) is not None for e in resp.entries)
    # ... which the round delivers to the follower that was down, as real batches.
    transport.down.clear()
    lead.heartbeat()
    lead.heartbeat()
    assert _ids_in_log(transport.roots["ts-c"]) == [1, 2, 3]
    assert not any(d.startswith(REF_MAGIC) for d in _log_data(transport.roots["ts-c"]))


def test_rows_in_no_range_partition_are_returned_not_staged(tmp_path: Path) -> None:
    ranged = Partitioner(SCHEMA, PartitionSchema((), ("id",), (RangePartition(0, 10),)))
    fn = stage_batches(SCHEMA, ranged, OpType.INSERT, "w", str(tmp_path), 100)
    outs = list(fn(iter([pa.RecordBatch.from_pydict({"id": [1, 50], "v": ["a", "b"]})])))
    bad = [b for o in outs for b in o.column(1).to_pylist() if b is not None]
    refs = [StagedRef.decode(r) for o in outs for r in o.column(0).to_pylist() if r is not None]
    assert bad == ['{"id": 50, "v": "b"}']
    assert [r.rows for r in refs if r is not None] == [1]


def test_remove_staging_refuses_paths_outside_the_staging_area(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="bad write id"):
        remove_staging(str(tmp_path), [".."])
