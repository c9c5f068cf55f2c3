"""``KuduContext.read_table``: a table as a lazy DataFrame, one Spark partition per tablet.

kudu-spark's ``KuduRDD`` (STYLE.md): planning turns the scan into one *scan token* per tablet
left after pruning (:class:`~pyspark_kudu.spark.host.replica_reader.TabletScan`) whose
preferred locations are the hosts of every replica it may read -- all voters for
``closest_replica``, the leader alone for ``leader_only``, the leader first then the other
voters for linearizable reads (those holding the read point's entry at its term) -- and the
task rebuilds a scanner from its token that reads the closest replica, local or remote
(:func:`~pyspark_kudu.spark.host.replica_reader.read_tablet`). Where Spark puts a task (it
waits only ``spark.locality.wait`` for a preferred host) changes speed, never correctness.

Read points: a tablet this client leads is read at its leader's commit index (the leader
replica up to it, a follower at it as a snapshot: read-your-writes either way); another
tablet at the last commit index any client reported; a tablet nobody reported yet, as what
each replica knows committed.

Thread-safety: functions only; planning reads the context's leaders under its lock.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, StructField, StructType

from pyspark_kudu.errors import InvalidArgumentError, ServiceUnavailableError
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.entities import MemberType
from pyspark_kudu.partitioning import Partitioner, PartitionSchema
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.spark.host.replica_reader import (
    ReplicaChoice,
    TabletScan,
    read_tablet_refreshing,
)
from pyspark_kudu.spark.pinned import pinned_rdd
from pyspark_kudu.spark.replication.session_client import (
    ReadPoint,
    SessionAddress,
    SessionClient,
    read_point_replicas,
)
from pyspark_kudu.spark.replication.spark_rounds import SparkTransport, TabletServerLocation

__all__ = ["LOCALITIES", "READ_MODES", "ScanClient", "out_schema_to_spark", "read_table",
           "scan_tokens"]

LOCALITIES = ("closest_replica", "leader_only")
READ_MODES = ("read_latest", "linearizable")


class ScanClient(Protocol):
    """What planning a read needs of the client (a ``KuduContext`` is one)."""

    @property
    def spark(self) -> SparkSession: ...

    @property
    def master(self) -> MasterClient: ...

    @property
    def servers(self) -> list[TabletServerLocation]: ...

    @property
    def transport(self) -> SparkTransport: ...

    def refresh_servers(self) -> None: ...

    def server_locations(self) -> dict[str, str | None]: ...

    def read_points(self, table: str, tablet_ids: Sequence[str], *, forwarded: bool = False
                    ) -> dict[str, ReadPoint]: ...

    def known_commit(self, tablet_id: str, reported_leader: str, reported_commit: int
                     ) -> tuple[str, int | None, int | None]: ...


def read_table(kudu: ScanClient, name: str, columns: Sequence[str] | None,
               predicates: Sequence[Predicate], snapshot: int | None, locality: str,
               read_mode: str, session: SessionAddress | None = None) -> DataFrame:
    """See :meth:`KuduContext.read_table`. ``session``: the context's session service, which
    a scan task asks for the tablet servers' current addresses when none in its token
    answers (:func:`read_tablet_refreshing`)."""
    tokens, out_schema, schema = scan_tokens(kudu, name, columns, predicates, snapshot,
                                             locality, read_mode)
    spark_schema = out_schema_to_spark(out_schema, schema)
    if not tokens:
        return kudu.spark.createDataFrame([], spark_schema)
    # The tokens travel as a one-column DataFrame of pickled tokens (one row per pinned
    # partition: the tasks keep the tokens' preferred hosts), and the scan runs inside
    # ``mapInArrow``: rows cross from Python to the JVM once, as Arrow batches, as they do
    # for ``format("kudu")``.
    rdd = pinned_rdd(kudu.spark.sparkContext, [(t, t.preferred_hosts()) for t in tokens])
    raw = kudu.spark.createDataFrame(rdd.map(_token_row),
                                     StructType([StructField("token", BinaryType(), False)]))
    return raw.mapInArrow(_scanner(session, out_schema), spark_schema)


def scan_tokens(kudu: ScanClient, name: str, columns: Sequence[str] | None,
                predicates: Sequence[Predicate], snapshot: int | None, locality: str,
                read_mode: str) -> tuple[list[TabletScan], pa.Schema, Schema]:
    """One scan token per tablet left after pruning, the projection's Arrow schema and the
    table's schema (see :meth:`KuduContext.scan_tokens`)."""
    if locality not in LOCALITIES:
        raise InvalidArgumentError(
            f"unknown scan locality {locality!r}: use closest_replica or leader_only")
    if read_mode not in READ_MODES:
        raise InvalidArgumentError(
            f"unknown read mode {read_mode!r}: use read_latest or linearizable")
    kudu.refresh_servers()
    locs = kudu.master.get_table(name)
    schema = locs.table.schema
    out_schema = schema.project(None if columns is None else list(columns))
    partitioner = Partitioner(schema, PartitionSchema.from_dict(
        locs.table.partition_schema, schema))
    servers = {s.uuid: s for s in kudu.servers}
    unreachable = kudu.transport.unreachable()
    where = kudu.server_locations()
    host_locations = {s.host: where.get(s.uuid) for s in kudu.servers}
    conf_root = kudu.spark.sparkContext.getConf().get("spark.kudu.dataRoot", None)
    types = {c.name: c.type for c in schema.columns}
    cols = None if columns is None else tuple(columns)

    def choice(ts: str, leader: bool) -> ReplicaChoice:
        s = servers.get(ts)
        meta = locs.tservers.get(ts)
        address = (s.address if s is not None else "") or (
            f"{meta.host}:{meta.port}" if meta is not None and meta.port else "")
        return ReplicaChoice(ts, s.root if s is not None else None, leader,
                             s.host if s is not None else (meta.host if meta else ""),
                             address, where.get(ts))

    pruned = partitioner.prune(predicates)
    points = (kudu.read_points(name, [locs.tablets[p].tablet_id for p in pruned])
              if read_mode == "linearizable" else {})
    tokens: list[TabletScan] = []
    for pidx in pruned:
        tablet = locs.tablets[pidx]
        tid = tablet.tablet_id
        require = False
        known: int | None
        term: int | None = None
        if tid in points:
            leader, known, term = points[tid]
            require = True
        else:
            leader, known, term = kudu.known_commit(tid, tablet.leader,
                                                    tablet.committed_index)
        voters = [r.ts_uuid for r in tablet.replicas
                  if r.member_type is MemberType.VOTER and r.ts_uuid not in unreachable]
        if require:
            chosen = [choice(ts, lead) for ts, lead in read_point_replicas(leader, voters, term)]
        elif locality == "leader_only" and leader:
            chosen = [choice(leader, True)]
        else:
            # Voters only: a NON_VOTER may still be receiving its tablet copy.
            chosen = [choice(v, v == leader) for v in voters]
        if not chosen:
            raise ServiceUnavailableError(f"tablet {tid} of {name}: no replica is reachable")
        tokens.append(TabletScan(name, tid, tuple(chosen), cols, tuple(predicates), snapshot,
                                 known, require, data_root_conf=conf_root, commit_term=term,
                                 host_locations=host_locations, types=types))
    return tokens, out_schema, schema


def out_schema_to_spark(arrow: pa.Schema, schema: Schema) -> StructType:
    """The Spark schema of a projection, nullability included (DESIGN §4: it must match)."""
    full = schema.to_spark()
    return StructType([full[f.name] for f in arrow])


def _token_row(scan: TabletScan) -> tuple[bytes]:
    return (pickle.dumps(scan, protocol=pickle.HIGHEST_PROTOCOL),)


def _scanner(session: SessionAddress | None, schema: pa.Schema) -> Any:
    """The ``mapInArrow`` function of a scan: each input row is a pickled token, whose
    tablet's batches it yields (in the projection's exact types), streamed."""
    def scan(tokens: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in tokens:
            for raw in b.column(0).to_pylist():
                token: TabletScan = pickle.loads(raw)
                refresh = SessionClient(session).server_addresses if session else None
                for batch in read_tablet_refreshing(token, refresh):
                    yield batch.cast(schema)
    return scan
