"""``KuduContext``: tables on Spark executors, written and read through pinned tasks.

The client-side entry point of DESIGN §1-3. A context

1. connects to the master: an embedded one under the warehouse directory by default (1
   replica), or the standalone group named by ``master="h1:7051,h2:7052,h3:7053"``;
2. discovers tablet servers: one per executor host on a cluster (a pinned job creates or
   reads each host's ``instance`` file), or ``local_tablet_servers`` virtual servers with
   their own data roots in ``local[*]`` mode; and registers them with the master (which
   resolves their locations);
3. writes: rows are routed to tablets, each tablet's batch is encoded once, and all tablets
   are replicated through one
   :class:`~pyspark_kudu.spark.replication.write_service.ReplicationService`
   (barrier stages of pinned tasks, rounds shared by concurrent writers); a write returns
   once committed on a majority, with Kudu's per-row errors;
4. reads: one pinned scan task per (pruned) tablet on the chosen replica's host, yielding
   Arrow batches into a lazy DataFrame. A tablet this client leads is read on its leader
   replica at the client's commit index, so a write that returned is visible to the next
   read; any other replica serves only what it knows committed.

Leadership: before leading a tablet the context takes its lease from the master
(:mod:`pyspark_kudu.spark.replication.lease_keeper`); a tablet another live client leads is not
elected but
*forwarded to* (writes, linearizable read points and replication actions go to that client's
session service), so writers of one tablet share one leader instead of fencing each other.

Tablet-server liveness: a driver thread heartbeats every server whose host has an executor
(:mod:`pyspark_kudu.spark.healing.liveness`, ``spark.kudu.heartbeatIntervalSec``, default 1 s).

Healing and replica management (the healer's target, sweeps, unsafe recovery) are the
:class:`~pyspark_kudu.spark.healing.replica_management.ReplicaManagement` part of the context.
Replica files
a deleted table left on hosts unreachable at the time are removed by a later sweep.

Thread-safety: ``KuduContext`` methods may be called from several threads; writes share
rounds through the service, and leader elections are serialised by a lock.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark import SparkConf
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pyspark_kudu.errors import (
    FencedError,
    InvalidArgumentError,
    KuduError,
    LocationMappingError,
    NotFoundError,
    NotLeaderError,
    RoundFailedError,
    RowWriteError,
    ServiceUnavailableError,
    SessionUnreachableError,
    TimedOutError,
)
from pyspark_kudu.master.client import MasterClient, TableLocations
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.locations import DEFAULT_MAPPING_TIMEOUT_S
from pyspark_kudu.master.records import TabletReport
from pyspark_kudu.partitioning import Partitioner, PartitionSchema
from pyspark_kudu.rpc.auth import SECRET_ENV, new_secret
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.spark.api import scan
from pyspark_kudu.spark.api.registration import register
from pyspark_kudu.spark.api.session_service import FILTER_PUSHDOWN_CONF
from pyspark_kudu.spark.api.source_options import OPERATIONS, check_write_columns, parse_bool
from pyspark_kudu.spark.healing.healer import Healer
from pyspark_kudu.spark.healing.liveness import LivenessReporter
from pyspark_kudu.spark.healing.replica_management import ReplicaManagement, delete_replicas_task
from pyspark_kudu.spark.host.dataplane import (
    StagedRef,
    StagingJanitor,
    stage_batches,
    staging_schema,
)
from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind
from pyspark_kudu.spark.host.identity import (
    CONF_DATA_ROOT_ENV,
    DATA_ROOT_CONF,
    TabletServerInfo,
    ensure_instance,
    local_data_root,
)
from pyspark_kudu.spark.host.replica_reader import TabletScan
from pyspark_kudu.spark.host.tserver_protocol import ADDRESS_ENV
from pyspark_kudu.spark.pinned import executor_hosts, pinned_rdd
from pyspark_kudu.spark.replication.lease_keeper import (
    DEFAULT_LEASE_S,
    LEASE_CONF,
    LeaseKeeper,
    by_holder,
)
from pyspark_kudu.spark.replication.multitablet import elect_all
from pyspark_kudu.spark.replication.session_client import (
    SessionAddress,
    SessionClient,
    TableInfo,
    TabletInfo,
)
from pyspark_kudu.spark.replication.spark_rounds import (
    DEFAULT_ROUND_TIMEOUT_S,
    SparkTransport,
    TabletServerLocation,
    root_cause,
)
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.replication.write_service import (
    ReplicationService,
    WriteOutcome,
    WriteProgress,
    WriteSummary,
)
from pyspark_kudu.tablet import OpType
from pyspark_kudu.wal import WalOptions

__all__ = ["KuduContext", "WriteProgress", "WriteSummary"]

_log = logging.getLogger(__name__)

WAREHOUSE_CONF = "spark.kudu.warehouse"
HEARTBEAT_CONF = "spark.kudu.heartbeatIntervalSec"
HEAL_ENABLED_CONF = "spark.kudu.heal.enabled"
HEAL_INTERVAL_CONF = "spark.kudu.heal.intervalSec"
HEAL_MAX_MOVES_CONF = "spark.kudu.heal.maxMoves"
FAILED_AFTER_CONF = "spark.kudu.followerUnavailableConsideredFailedSec"
AUTO_REBALANCE_CONF = "spark.kudu.autoRebalance"
ROUND_TIMEOUT_CONF = "spark.kudu.roundTimeoutSec"
LOCATION_MAPPING_CMD_CONF = "spark.kudu.locationMappingCmd"
LOCATION_MAPPING_TIMEOUT_CONF = "spark.kudu.locationMappingTimeoutSec"
_MAX_BATCH_ROWS = 65536


_MAY_FAIL_PER_ROW = (int(OpType.INSERT), int(OpType.UPDATE), int(OpType.DELETE))
_FORWARD_GRACE_S = 15.0  # past the lease: how long a forward that found no leader re-routes
_FORWARD_RETRY_S = 0.5


class _Tally:
    """What one write committed so far, from this client's rounds and forwards.
    Thread-safety: confined to the thread running ``commit_staged``."""

    def __init__(self, progress: Callable[[WriteProgress], None] | None) -> None:
        self.progress = progress
        self.errors: list[tuple[str, dict[str, object], str, str]] = []
        self.written = self.rows_done = self.batches_done = 0
        self.rows_total = self.batches_total = 0
        self.failure: KuduError | None = None

    def fail(self, e: KuduError) -> None:
        self.failure = self.failure or e

    def own_done(self, tid: str, outcome: WriteOutcome, refs: Sequence[StagedRef]) -> None:
        for (_, _, result), ref in zip(outcome, refs, strict=True):
            if result is None:
                self.written += ref.rows
            else:
                self.written += result.num_rows - len(result.errors)
                self.errors.extend((tid, e.key or {}, e.status, e.message)
                                   for e in result.errors)
            self.rows_done += ref.rows
            self.batches_done += 1
        self._report()

    def remote_done(self, tids: Sequence[str], refs: dict[str, list[StagedRef]],
                    written: int, errors: Sequence[tuple[str, dict[str, object], str, str]]
                    ) -> None:
        self.written += written
        self.errors.extend(errors)
        self.rows_done += sum(r.rows for t in tids for r in refs[t])
        self.batches_done += sum(len(refs[t]) for t in tids)
        self._report()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(WriteProgress(self.rows_done, self.rows_total, self.batches_done,
                                        self.batches_total))


@dataclass(frozen=True)
class _ScanTask:
    tablet_id: str
    ts_uuid: str
    root: str | None
    columns: tuple[str, ...] | None
    predicates: tuple[Predicate, ...]
    snapshot: int | None
    known_commit: int | None
    require: bool = False  # the replica must hold the log up to known_commit (linearizable)


class KuduContext(ReplicaManagement):
    """Tables of this cluster, for one SparkSession. Close it (or use ``with``).

    Unless ``spark.kudu.heal.enabled=false``, the context also heals the cluster in the
    background (:mod:`~pyspark_kudu.spark.healing.healer`): replicas on tablet servers the master
    considers failed are replaced, every ``spark.kudu.heal.intervalSec`` (default 5 s).
    """

    def __init__(self, spark: SparkSession, master: str | None = None, *,
                 warehouse: str | None = None, local_tablet_servers: int = 3,
                 wal_options: WalOptions | None = None,
                 location_mapping_cmd: str | None = None,
                 location_mapping_timeout_s: float | None = None,
                 heal: bool | None = None,
                 heal_interval_s: float | None = None,
                 failed_after_s: float | None = None,
                 round_timeout_s: float | None = None,
                 lease_s: float | None = None) -> None:
        """Connect to the master, discover and register the tablet servers, start the
        services. Each setting is the argument if given, else its Spark setting if set, else
        its default; a value that cannot be honoured is refused, never replaced:

        - ``location_mapping_cmd`` / ``spark.kudu.locationMappingCmd`` (default none) and
          ``location_mapping_timeout_s`` / ``spark.kudu.locationMappingTimeoutSec`` (default
          10 s): the embedded master's location mapping
          (:mod:`~pyspark_kudu.master.locations`);
        - ``failed_after_s`` / ``spark.kudu.followerUnavailableConsideredFailedSec`` (default
          300 s): the embedded master's ``follower_unavailable_considered_failed_sec``;
        - ``heal`` / ``spark.kudu.heal.enabled`` (default true), ``heal_interval_s`` /
          ``spark.kudu.heal.intervalSec`` (default 5 s), ``spark.kudu.heal.maxMoves``
          (default 4) and ``spark.kudu.autoRebalance`` (default false): the healer;
        - ``round_timeout_s`` / ``spark.kudu.roundTimeoutSec`` (default 300 s): a replication
          round's Spark job is cancelled after it
          (:mod:`~pyspark_kudu.spark.replication.spark_rounds`);
        - ``lease_s`` / ``spark.kudu.leaderLeaseSec`` (default 10 s): tablet leadership leases
          (:mod:`~pyspark_kudu.spark.replication.lease_keeper`); 0: none, every writer elects
          itself and fences the others;
        - ``spark.kudu.heartbeatIntervalSec`` (default 1 s): tablet-server liveness.

        Raises:
            InvalidArgumentError: a setting of the embedded master with ``master=`` (a
                standalone master takes it on its own command line); a timeout, interval or
                count that is zero (except ``lease_s``), negative or not a number; on a
                cluster, an executor host with neither ``PYSPARK_KUDU_DATA_ROOT`` nor
                ``spark.kudu.dataRoot`` (refused before anything is written there).
        """
        sc = spark.sparkContext
        conf = sc.getConf()
        # Every setting is checked before anything starts: a refused one leaves nothing behind.
        embedded_kwargs = _embedded_master_settings(
            conf, master, location_mapping_cmd, location_mapping_timeout_s, failed_after_s)
        round_timeout = _seconds(conf, ROUND_TIMEOUT_CONF, DEFAULT_ROUND_TIMEOUT_S,
                                 "round_timeout_s", round_timeout_s)
        lease_ttl = _seconds(conf, LEASE_CONF, DEFAULT_LEASE_S, "lease_s", lease_s,
                             zero_ok=True)
        heal_interval = _seconds(conf, HEAL_INTERVAL_CONF, 5.0, "heal_interval_s",
                                 heal_interval_s)
        heartbeat = _seconds(conf, HEARTBEAT_CONF, 1.0)
        max_moves = _heal_max_moves(conf)
        rebalance = parse_bool(AUTO_REBALANCE_CONF, conf.get(AUTO_REBALANCE_CONF, None))
        if heal is None:
            heal = parse_bool(HEAL_ENABLED_CONF, conf.get(HEAL_ENABLED_CONF, None), default=True)

        self.spark = spark
        conf_wh = conf.get(WAREHOUSE_CONF, None)
        self.warehouse = os.path.abspath(warehouse or conf_wh or "kudu-warehouse")
        self._local = (sc.master or "").startswith("local")
        self._data_root_conf = conf.get(DATA_ROOT_CONF, None)
        self._secret = _cluster_secret(spark)
        self._executors: dict[str, list[str]] = {}
        # Discovery before the master: a host without a data root is refused before an
        # embedded master writes its catalog (and is left running).
        try:
            self.servers = self._discover(local_tablet_servers)
        except KuduError:
            raise
        except Exception as e:  # a discovery task failed; Spark wraps its error
            usage = _task_usage_error(e)
            if usage is None:
                raise
            raise usage from None
        self._embedded: EmbeddedMaster | None = None
        if master is None:
            self._embedded = EmbeddedMaster(self.warehouse, 1, **embedded_kwargs)
            self.master: MasterClient = self._embedded.client()
        else:
            self.master = MasterClient(master)
        self._register()
        self.transport = SparkTransport(sc, self.servers, wal_options,
                                        round_timeout_s=round_timeout)
        self._service = ReplicationService(self.transport)
        self._janitor = StagingJanitor(sc, [s.host for s in self.servers],
                                       self.warehouse if self._local else None)
        self._leaders: dict[str, TabletLeader] = {}
        self._failed_reported: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.liveness = LivenessReporter(
            self.master, [s.meta() for s in self.servers],
            self._live_hosts, interval_s=heartbeat).start()
        # format("kudu") for this session: a loopback service its data source calls.
        self.session_service = register(self)
        self.client_id = uuid.uuid4().hex[:16]
        self.leases = LeaseKeeper(
            self.master, self.client_id, self.session_service.address, ttl_s=lease_ttl,
            alive=lambda: sc._jsc is not None)
        self.healer = Healer(self, interval_s=heal_interval, max_moves=max_moves,
                             rebalance=rebalance)
        if heal:
            self.healer.start()

    def _live_hosts(self) -> set[str]:
        if self._local:
            return {s.host for s in self.servers}
        # A suspect host (not answering, though Spark still lists its executor) is not
        # reported live: if it stays away, the master declares its tablet server failed.
        return set(executor_hosts(self.spark.sparkContext)) - self.transport.suspect_hosts()

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop healing, release this client's tablet leases, stop its services. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.healer.stop()
        self.leases.close()  # other clients lead this one's tablets from now on
        self.session_service.close()
        self.liveness.stop()
        self._service.close()
        self._janitor.close()
        self.master.close()
        if self._embedded is not None:
            self._embedded.close()

    def __enter__(self) -> KuduContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _discover(self, n_local: int) -> list[TabletServerLocation]:
        """Every tablet server of this application: one per executor host (its identity
        from the host's data root, created on first use), or ``n_local`` virtual servers in
        local mode; each with the address of its host's resident tablet server."""
        sc = self.spark.sparkContext
        self._executors = executor_hosts(sc)
        if self._local:
            host = next(iter(self._executors))
            address = sc.parallelize([0], 1).map(_resident_address).collect()[0]
            out = []
            for i in range(n_local):
                info = ensure_instance(os.path.join(self.warehouse, "tservers", f"ts{i}"))
                out.append(TabletServerLocation(info.uuid, host, info.data_root, address))
            return out
        hosts = sorted(self._executors)
        if not hosts:
            raise ServiceUnavailableError("no executors: start the application's executors first")
        return self._discover_hosts(hosts)

    def _discover_hosts(self, hosts: Sequence[str]) -> list[TabletServerLocation]:
        found = pinned_rdd(self.spark.sparkContext, [(h, [h]) for h in hosts]).map(
            partial(_identify, conf_root=self._data_root_conf)).collect()
        out = [TabletServerLocation(i.uuid, i.host, None, a) for i, a in found]
        _warn_without_server(out)
        return out

    def refresh_servers(self) -> None:
        """Learn the new tablet server address of every host whose executor was replaced
        since the last look (a new executor runs a new resident server on a new port) and
        register it with the master. Cheap when nothing changed: one look at the executors."""
        if self._local:
            return
        now = executor_hosts(self.spark.sparkContext)
        changed = sorted(h for h, ids in now.items() if self._executors.get(h) != ids)
        if not changed:
            return
        try:
            fresh = {s.uuid: s for s in self._discover_hosts(changed)}
        except Exception as e:  # an executor lost meanwhile: the next read looks again
            _log.warning("refreshing tablet server addresses failed: %s", root_cause(str(e)))
            return
        with self._lock:
            self.servers = [fresh.get(s.uuid, s) for s in self.servers]
        for h in changed:
            self._executors[h] = now[h]
        for s in fresh.values():
            self.liveness.update(s.meta())

    def _register(self, deadline_s: float = 30.0) -> None:
        """Heartbeat every tablet server to every master until the leader has seen it (only
        the leader registers servers, and a fresh master group may not have one yet)."""
        end = time.monotonic() + deadline_s
        for s in self.servers:
            meta = s.meta()
            while True:
                seen = False
                for addr in self.master.addresses:
                    try:
                        seen = bool(self.master.heartbeat_to(addr, meta).get("leader")) or seen
                    except LocationMappingError:
                        raise  # the server's location is refused: retrying will not help
                    except KuduError:
                        continue  # that master is down; the others may lead
                if seen:
                    break
                if time.monotonic() > end:
                    raise TimedOutError(
                        f"tablet server {s.uuid} ({s.host}) could not register: no master "
                        f"leader among {self.master.addresses} within {deadline_s:.0f} s")
                self.master.leader_address(timeout_s=max(0.1, end - time.monotonic()))

    @property
    def master_addresses(self) -> tuple[str, ...]:
        return tuple(self.master.addresses)

    def describe(self, table: str) -> TableInfo:
        """What the ``kudu`` data source needs to plan a read or write of ``table``."""
        self.refresh_servers()
        locs = self.master.get_table(table)
        where = self.server_locations()
        sc = self.spark.sparkContext
        pushdown = str(self.spark.conf.get(FILTER_PUSHDOWN_CONF, "false")).lower() == "true"
        return TableInfo(
            table=table, schema=locs.table.schema,
            partition_schema=dict(locs.table.partition_schema),
            tablets=tuple(TabletInfo(t.tablet_id, tuple(r.ts_uuid for r in t.replicas),
                                     t.leader, t.committed_index or None)
                          for t in locs.tablets),
            tservers={s.uuid: (s.host, s.root, s.address, where.get(s.uuid))
                      for s in self.servers},
            staging_root=self.warehouse if self._local else None,
            data_root_conf=sc.getConf().get("spark.kudu.dataRoot", None),
            filter_pushdown=pushdown,
        )

    # -- DDL ---------------------------------------------------------------------------------
    def create_table(self, name: str, schema: Schema | StructType,
                     keys: Sequence[str] | None = None,
                     partitioning: PartitionSchema | None = None, replicas: int = 3) -> str:
        """Create ``name`` with its tablets and replicas; returns the table id."""
        if isinstance(schema, StructType):
            schema = Schema.from_spark(schema, keys)
        elif keys is not None and tuple(keys) != schema.primary_key:
            raise InvalidArgumentError(
                f"keys {list(keys)} differ from the schema's primary key "
                f"{list(schema.primary_key)}; pass one or the other")
        self._register()  # liveness for placement
        table_id = self.master.create_table(name, schema, partitioning,
                                            replication_factor=replicas)
        locs = self.master.get_table(name)
        reqs: dict[str, list[PeerRequest]] = {}
        for t in locs.tablets:
            voters = tuple(r.ts_uuid for r in t.replicas)
            for v in voters:
                reqs.setdefault(v, []).append(PeerRequest(
                    RequestKind.CREATE, t.tablet_id, v, voters=voters,
                    schema_json=schema.to_json()))
        out = self.transport.run(reqs)  # one stage creates every replica of every tablet
        failed = [ts for ts, resps in out.items() if resps is None or not all(r.ok for r in resps)]
        if failed:
            errs = {r.error for resps in out.values() if resps for r in resps if not r.ok}
            cause = "; ".join(sorted(errs)) or self.transport.last_error or "task failed"
            raise RoundFailedError(
                f"table {name}: creating replicas failed on tablet servers {failed}: {cause}"
                + (" (executors must run a Python with pyspark-kudu installed: set "
                   "PYSPARK_PYTHON or spark.pyspark.python)" if "ModuleNotFound" in cause else ""))
        # Like Kudu, a new table's tablets get leaders right away, so its first write does
        # not pay the elections (four shared rounds). A failure here is not the DDL's: the
        # first write elects again.
        try:
            self._route(locs, [t.tablet_id for t in locs.tablets])
        except KuduError as e:
            _log.warning("table %s: electing tablet leaders after creation failed (the first "
                         "write elects again): %s", name, e)
        return table_id

    def table_exists(self, name: str) -> bool:
        return name in self.master.list_tables()

    def delete_table(self, name: str) -> None:
        """Delete ``name`` from the catalog, then its replicas' files on their hosts.

        The catalog deletion is what makes the table gone. Replica files are removed by one
        pinned job; a host that cannot run it now (no executor) keeps them, and a warning
        names them; the healer's sweep deletes them once the host is back (the catalog keeps
        the tablets' tombstones).
        """
        locs = self.master.get_table(name)
        self.master.delete_table(name)
        with self._lock:
            for t in locs.tablets:
                self._leaders.pop(t.tablet_id, None)
        by_ts: dict[str, list[str]] = {}
        for t in locs.tablets:
            for r in t.replicas:
                by_ts.setdefault(r.ts_uuid, []).append(t.tablet_id)
        servers = {s.uuid: s for s in self.servers}
        tasks = [((ts, servers[ts].root, tuple(tids)), [servers[ts].host])
                 for ts, tids in sorted(by_ts.items()) if ts in servers]
        left = set(by_ts) - {ts for (ts, _, _), _ in tasks}
        if tasks:
            try:
                out = pinned_rdd(self.spark.sparkContext, tasks).map(delete_replicas_task).collect()
                left |= {ts for ts, ok in out if not ok}
            except Exception as e:  # the catalog deletion stands; files stay behind
                _log.warning("table %s: removing replica files failed: %s", name,
                             root_cause(str(e)))
                left |= set(by_ts)
        if left:
            _log.warning("table %s: replica files stay on tablet servers %s (not reachable "
                         "now)", name, sorted(left))

    # -- writes ------------------------------------------------------------------------------
    def insert_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "insert")

    def insert_ignore_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "insert_ignore")

    def upsert_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "upsert")

    def update_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "update")

    def update_ignore_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "update_ignore")

    def delete_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "delete")

    def delete_ignore_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "delete_ignore")

    def write(self, df: DataFrame, table: str, operation: str = "upsert", *,
              progress: Callable[[WriteProgress], None] | None = None,
              batch_rows: int = _MAX_BATCH_ROWS, repartition: bool = False,
              repartition_sort: bool = True) -> WriteSummary:
        """Write ``df``'s rows to ``table`` with Kudu's ``operation``; returns once every
        batch is committed on a majority of its tablet's replicas.

        The rows are routed and encoded on the executors that hold them and shuffled to the
        replicas' hosts (:mod:`~pyspark_kudu.spark.host.dataplane`); only small refs reach the
        driver. ``progress`` is called as tablets' batches commit.

        ``repartition=True`` (kudu-spark's ``kudu.repartition``) first shuffles the rows so
        that each staging task holds one tablet's rows, sorted by primary key unless
        ``repartition_sort=False`` (``kudu.repartition.sort``): each tablet then receives
        batches of up to ``batch_rows`` rows from one task instead of a batch from every
        input partition (:mod:`~pyspark_kudu.spark.api.repartition`).

        Raises:
            InvalidArgumentError: unknown operation, a column the table lacks, a missing key
                column, or values that do not fit the schema; nothing is written.
            RowWriteError: some rows were rejected (e.g. duplicate keys for ``insert``); the
                others are written and the error lists the rejected rows' keys.
        """
        op = OPERATIONS.get(operation)
        if op is None:
            raise InvalidArgumentError(
                f"Unsupported operation type {operation!r}: use one of {sorted(OPERATIONS)}")
        if batch_rows < 1:
            raise InvalidArgumentError(f"batch_rows must be >= 1, got {batch_rows}")
        locs = self.master.get_table(table)
        schema = locs.table.schema
        check_write_columns(df.columns, schema, table, struct=df.schema)
        partitioner = Partitioner(schema, PartitionSchema.from_dict(
            locs.table.partition_schema, schema))
        write_id = uuid.uuid4().hex
        staging_root = self.warehouse if self._local else None
        if repartition:
            # Imported here: only this method of the context uses it.
            from pyspark_kudu.spark.api.repartition import repartition_by_tablet

            df = repartition_by_tablet(df, partitioner,
                                       schema.primary_key if repartition_sort else ())
        try:
            staged = df.mapInArrow(
                stage_batches(schema, partitioner, op, write_id, staging_root, batch_rows),
                staging_schema()).collect()
        except Exception as e:  # the staging job failed: nothing was proposed
            self._janitor.remove(write_id)
            cause = root_cause(str(e))
            if cause.startswith("InvalidArgumentError: "):
                raise InvalidArgumentError(
                    f"table {table}: {cause.removeprefix('InvalidArgumentError: ')}") from None
            raise
        refs = [StagedRef.decode(bytes(r["ref"])) for r in staged if r["ref"] is not None]
        bad = [str(r["bad_row"]) for r in staged if r["bad_row"] is not None]
        try:
            return self.commit_staged(table, [r for r in refs if r is not None], bad,
                                      progress=progress, locations=locs)
        finally:
            self.discard_staged(write_id)

    def discard_staged(self, write_id: str) -> None:
        """Remove a write's staged batches on every host (in the background)."""
        self._janitor.remove(write_id)

    def commit_staged(self, table: str, staged: Sequence[StagedRef],
                      bad_rows: Sequence[str] = (), *,
                      progress: Callable[[WriteProgress], None] | None = None,
                      locations: TableLocations | None = None,
                      forwarded: bool = False) -> WriteSummary:
        """Replicate batches staged by :func:`~pyspark_kudu.spark.host.dataplane.stage_batches`
        (by :meth:`write`, or by the ``kudu`` data source's writer tasks); returns once all
        are committed. ``bad_rows`` are the JSON rows staging found in no range partition,
        reported as per-row ``NotFound`` errors. The caller removes the staging afterwards
        (:meth:`discard_staged`).

        Tablets another client leads are forwarded to it (``lead_commit``); a forward that
        could not be delivered, or reached a client that no longer leads, is routed again
        until the lease it found lapses. ``forwarded``: this call is such a forward; a tablet
        this client does not lead is refused (``NotLeaderError``) before anything is
        proposed."""
        locs = locations or self.master.get_table(table)
        tally = _Tally(progress)
        tally.errors.extend(("", json.loads(row), "NotFound", "row is in no range partition")
                            for row in bad_rows)
        refs: dict[int, list[StagedRef]] = {}
        for ref in staged:
            if not 0 <= ref.tablet < len(locs.tablets):
                raise InvalidArgumentError(
                    f"table {table}: staged batch {ref.path} names tablet {ref.tablet}, the "
                    f"table has {len(locs.tablets)}; was it staged for another table?")
            refs.setdefault(ref.tablet, []).append(ref)
        tally.rows_total = sum(r.rows for rs in refs.values() for r in rs)
        tally.batches_total = sum(len(rs) for rs in refs.values())
        by_tid = {locs.tablets[p].tablet_id: refs[p] for p in sorted(refs)}
        pending = list(by_tid)
        deadline = time.monotonic() + self.leases.ttl_s + _FORWARD_GRACE_S
        while pending:
            own, remote = self._route(locs, pending, forwarded=forwarded)
            groups = by_holder(remote)
            retry: list[str] = []
            with self.leases.using(list(own)), ThreadPoolExecutor(
                    max(1, len(groups)), thread_name_prefix="kudu-forward") as pool:
                forwards = {pool.submit(SessionClient(addr).lead_commit, table,
                                        [r.encode() for t in tids for r in by_tid[t]]): tids
                            for addr, tids in groups.items()}
                self._commit_own(table, {t: by_tid[t] for t in own}, own, tally)
                for fut in as_completed(forwards):
                    tids = forwards[fut]
                    try:
                        summary = fut.result()
                    except RowWriteError as e:
                        tally.remote_done(tids, by_tid, e.rows_written, e.errors)
                    except (SessionUnreachableError, NotLeaderError) as e:
                        if time.monotonic() < deadline:  # nothing was proposed: route again
                            retry.extend(tids)
                        else:
                            tally.fail(RoundFailedError(
                                f"table {table}: tablets {tids} are led by another client "
                                f"that did not take the write ({e}); nothing was written "
                                f"to them"))
                    except KuduError as e:
                        tally.fail(RoundFailedError(
                            f"table {table}: the write to tablets {tids}, forwarded to the "
                            f"client leading them, was not acknowledged ({e}); its rows "
                            f"may or may not have been applied, so retry the write (an "
                            f"upsert retry is harmless)"))
                    else:
                        tally.remote_done(tids, by_tid, summary.rows_written, [])
            pending = retry
            if pending:
                time.sleep(_FORWARD_RETRY_S)  # the holder's lease lapses within the deadline
        if tally.failure is not None:
            raise tally.failure
        summary = WriteSummary(tally.written, len(tally.errors), len(by_tid))
        if tally.errors:
            sample = "; ".join(f"{s} {r}" for _, r, s, _ in tally.errors[:3])
            raise RowWriteError(
                f"failed to write {len(tally.errors)} rows to table {table} "
                f"({tally.written} written); sample errors: {sample}", tally.errors,
                tally.written)
        return summary

    def _commit_own(self, table: str, refs: dict[str, list[StagedRef]],
                    leaders: dict[str, TabletLeader], tally: _Tally) -> None:
        """Replicate the batches of tablets this client leads, into ``tally``."""
        if not refs:
            return
        futures: dict[Future[WriteOutcome], tuple[str, list[StagedRef]]] = {}
        for tid, batch_refs in refs.items():
            # Only insert, update and delete can fail per row; the others return once
            # committed, without waiting a round for the replicas' per-row results.
            fut = self._service.submit(leaders[tid], [r.encode() for r in batch_refs],
                                       want_results=any(r.op in _MAY_FAIL_PER_ROW
                                                        for r in batch_refs))
            futures[fut] = (tid, batch_refs)
        failed = False
        for fut in as_completed(futures):
            tid, batch_refs = futures[fut]
            try:
                outcome = fut.result()
            except KuduError as e:  # fenced by another writer, or no majority
                failed = True
                with self._lock:
                    self._leaders.pop(tid, None)  # elect again next time
                if isinstance(e, FencedError):
                    self.leases.distrust(tid)  # someone else led: is the lease still ours?
                kind = FencedError if isinstance(e, FencedError) else RoundFailedError
                tally.fail(kind(
                    f"table {table}: the write to tablet {tid} was not acknowledged ({e}); "
                    f"its rows may or may not have been applied, so retry the write (an "
                    f"upsert retry is harmless)"))
                continue
            tally.own_done(tid, outcome, batch_refs)
        self._report_failed(leaders[t] for t in refs)
        if not failed:
            self._report_commits([leaders[t] for t in refs])

    def _report_failed(self, leaders: Iterable[TabletLeader]) -> None:
        """Tell the master about replicas that answered "failed" (corrupt files, full disk):
        it marks them REPLACE and the healer replaces them (peer.py, failed replicas)."""
        for lead in leaders:
            for ts, why in list(lead.failed_replicas.items()):
                key = (lead.tablet.tablet_id, ts)
                if key in self._failed_reported:
                    continue
                try:
                    self.master.set_replace(lead.tablet.tablet_id, ts)
                except NotFoundError:  # already out of the config (replaced): nothing to do
                    self._failed_reported.add(key)
                    continue
                except KuduError as e:  # retried with the next write or healing pass
                    _log.warning("could not report failed replica %s of tablet %s: %s", ts,
                                 lead.tablet.tablet_id, e)
                    continue
                self._failed_reported.add(key)
                _log.warning("replica %s of tablet %s failed (%s): marked for replacement",
                             ts, lead.tablet.tablet_id, why)

    def _report_commits(self, leaders: Sequence[TabletLeader]) -> None:
        """Record each tablet's leader, term and commit index in the master (DESIGN §3: scans
        and tools read what is committed from there). One heartbeat per leader replica's
        tablet server carries all its tablets."""
        by_ts: dict[str, list[dict[str, Any]]] = {}
        for lead in leaders:
            node = lead.node
            if node is None:
                continue
            by_ts.setdefault(lead.leader_id, []).append(TabletReport(
                lead.tablet.tablet_id, node.term, leader=lead.leader_id,
                committed_index=node.commit_index).to_dict())
        if not by_ts:
            return
        servers = {s.uuid: s for s in self.servers}
        address = self.master.leader_address()
        for ts, reports in by_ts.items():
            loc = servers[ts]
            self.master.heartbeat_to(address, loc.meta(), reports)

    def _leaders_for(self, locs: TableLocations, tablet_ids: Sequence[str],
                     exclude: frozenset[str] = frozenset()) -> dict[str, TabletLeader]:
        """This client's leader of each tablet, electing the missing ones together
        (:func:`elect_all`: four shared rounds), trying each reachable voter in turn.
        A leader acting for a replica in ``exclude`` is given up and another elected."""
        with self._lock:
            for tid in tablet_ids:
                cur = self._leaders.get(tid)
                if cur is not None and cur.leader_id in exclude:
                    cur.abandon(f"replica {cur.leader_id} is leaving tablet {tid}")
            missing = [t for t in locs.tablets if t.tablet_id in set(tablet_ids)
                       and (self._leaders.get(t.tablet_id) is None
                            or self._leaders[t.tablet_id].node is None)]
            unreachable = self.transport.unreachable() | exclude
            candidates = {t.tablet_id: [v for v in t.voters if v not in unreachable]
                          for t in missing}
            voters = {t.tablet_id: t.voters for t in missing}
            errors: dict[str, KuduError] = {}
            while candidates:
                batch = [TabletLeader(TabletReplicas(tid, voters[tid]), cands.pop(0),
                                      self.transport)
                         for tid, cands in candidates.items() if cands]
                if not batch:
                    break
                elected = elect_all(self.transport, batch)
                self._report_failed(batch)
                for lead, res in elected.items():
                    tid = lead.tablet.tablet_id
                    if isinstance(res, Exception):
                        errors[tid] = res
                    else:
                        self._leaders[tid] = lead
                        candidates.pop(tid, None)
                candidates = {tid: c for tid, c in candidates.items() if c}
            failed = [tid for tid in tablet_ids if tid not in self._leaders
                      or self._leaders[tid].node is None]
            if failed:
                raise RoundFailedError(
                    f"tablets {failed}: no replica could become leader (last errors: "
                    + "; ".join(str(errors.get(t, "no reachable replica")) for t in failed[:3])
                    + ")")
            return {tid: self._leaders[tid] for tid in tablet_ids}

    def _route(self, locs: TableLocations, tablet_ids: Sequence[str], *,
               forwarded: bool = False, exclude: frozenset[str] = frozenset()
               ) -> tuple[dict[str, TabletLeader], dict[str, SessionAddress]]:
        """Split ``tablet_ids`` into the ones this client leads (their leaders, elected as
        needed, see :meth:`_leaders_for`) and the ones another client holds the lease of
        (its session service). A cached leader of a tablet whose lease this client did not
        hold is dropped (another client may have led it meanwhile: elect again rather than
        fail the next write as fenced). ``forwarded``: another client sent this work here,
        so every tablet must be this client's (``NotLeaderError`` otherwise)."""
        fresh = {t for t in tablet_ids
                 if self.leases.enabled and not self.leases.holds(t)}
        holders = self.leases.route(tablet_ids)
        remote = {t: a for t, a in holders.items() if a is not None}
        if remote and forwarded:
            raise NotLeaderError(
                f"client {self.client_id} does not lead tablets {sorted(remote)} (their "
                f"leases are another client's now): route the request again")
        with self._lock:
            for t in remote.keys() | fresh:
                self._leaders.pop(t, None)
        own = [t for t in tablet_ids if t not in remote]
        return (self._leaders_for(locs, own, exclude=exclude) if own else {}), remote

    def read_points(self, table: str, tablet_ids: Sequence[str], *, forwarded: bool = False
                    ) -> dict[str, tuple[str, int]]:
        """Per tablet: its leader replica and the index of an empty entry committed after
        this call began (see ``read_table``'s ``linearizable``); tablets another client
        leads are asked of it. ``forwarded`` as for :meth:`commit_staged`."""
        return self._read_points(self.master.get_table(table), tablet_ids, forwarded=forwarded)

    def _read_points(self, locs: TableLocations, tablet_ids: Sequence[str], *,
                     forwarded: bool = False) -> dict[str, tuple[str, int]]:
        """:meth:`read_points`. A leader fenced by another writer meanwhile is elected
        again, and a forward that found no leader is routed again, once."""
        failure: KuduError | None = None
        for _ in range(2):
            own, remote = self._route(locs, tablet_ids, forwarded=forwarded)
            futures = {tid: self._service.submit(lead, [b""]) for tid, lead in own.items()}
            points: dict[str, tuple[str, int]] = {}
            failure = None
            for addr, tids in by_holder(remote).items():
                try:
                    points.update(SessionClient(addr).lead_read(locs.table.name, tids))
                except KuduError as e:
                    failure = failure or e
            for tid, fut in futures.items():
                try:
                    ((index, _, _),) = fut.result()
                except KuduError as e:  # fenced, or no majority: elect again
                    with self._lock:
                        self._leaders.pop(tid, None)
                    failure = failure or e
                    continue
                points[tid] = (own[tid].leader_id, index)
            if failure is None:
                return points
        assert failure is not None
        raise failure

    # -- reads -------------------------------------------------------------------------------
    def read_table(self, name: str, columns: Sequence[str] | None = None,
                   predicates: Sequence[Predicate] = (), snapshot: int | None = None,
                   locality: str = "closest_replica", read_mode: str = "read_latest"
                   ) -> DataFrame:
        """A lazy DataFrame over ``name``: one partition per tablet left after pruning with
        ``predicates``, preferring the hosts of the replicas it may read; a task placed
        elsewhere reads through the replica host's tablet server (:mod:`.scan`).

        ``locality``: ``closest_replica`` (every voter is eligible, the closest to the task
        is read) or ``leader_only``.

        ``read_mode``:

        - ``read_latest`` (Kudu's READ_LATEST): a tablet this client leads is read on its
          leader replica at the client's commit index (so this client's own acknowledged
          writes are visible); any other tablet at the last commit index a client reported.
          Writes another client (another application, or another context of this one)
          acknowledged since may be missing.
        - ``linearizable``: for every tablet read, this client becomes (or stays) the
          leader and commits an empty entry first, then reads the leader replica up to it:
          every write acknowledged before the read began, by any writer, is visible (Raft
          thesis §6.4, a read through the log). Costs a round, and like a write it fences
          another writer's leadership of those tablets. ``locality`` does not apply.
        """
        return scan.read_table(self, name, columns, predicates, snapshot, locality, read_mode)

    def scan_tokens(self, name: str, columns: Sequence[str] | None = None,
                    predicates: Sequence[Predicate] = (), snapshot: int | None = None,
                    locality: str = "closest_replica", read_mode: str = "read_latest"
                    ) -> list[TabletScan]:
        """The scan :meth:`read_table` would run, as one token per tablet (kudu-spark's
        ``KuduScanToken``): its eligible replicas, read point and preferred hosts. Run one
        anywhere with :func:`~pyspark_kudu.spark.host.replica_reader.read_tablet`."""
        return scan.scan_tokens(self, name, columns, predicates, snapshot, locality,
                                read_mode)[0]

    def server_locations(self) -> dict[str, str | None]:
        """Every registered tablet server's location (None: it has none)."""
        return {str(t["uuid"]): t.get("location") for t in self.master.list_tservers()}

    def known_commit(self, tablet_id: str, reported_leader: str, reported_commit: int
                     ) -> tuple[str, int | None]:
        """The replica leading ``tablet_id`` and the commit index a read must see: this
        client's own leader's, else the last one any client reported (entries up to it are
        committed for good), else None (each replica serves what it knows committed)."""
        with self._lock:
            lead = self._leaders.get(tablet_id)
        if lead is not None and lead.node is not None:
            return lead.leader_id, lead.node.commit_index
        if (reported_leader and reported_commit
                and reported_leader not in self.transport.unreachable()):
            return reported_leader, reported_commit
        return reported_leader, None

def _identify(_: object, conf_root: str | None = None) -> tuple[TabletServerInfo, str]:
    """Executor side of discovery on a cluster: this host's tablet server and its resident
    server. The data root is the host's ``PYSPARK_KUDU_DATA_ROOT``, else ``conf_root`` (the
    application's ``spark.kudu.dataRoot``); never the local-mode default, which is refused
    before anything is written (:func:`~pyspark_kudu.spark.host.identity.local_data_root`)."""
    root = local_data_root(None, conf_root, cluster=True)
    return ensure_instance(root), os.environ.get(ADDRESS_ENV, "")


def _resident_address(_: object) -> str:
    return os.environ.get(ADDRESS_ENV, "")


def _cluster_secret(spark: SparkSession) -> str:
    """The credential of this application's tablet servers (``PYSPARK_KUDU_SECRET``): the
    one configured (``spark.executorEnv.PYSPARK_KUDU_SECRET``, which reaches every executor,
    or this driver's environment), else a random one made once per application. It is put
    in ``SparkContext.environment`` so every Python worker started from now on has it:
    executors' daemons start their resident tablet servers with it, and scan tasks call
    other hosts' servers with it."""
    env = spark.sparkContext.environment
    secret = env.get(SECRET_ENV) or os.environ.get(SECRET_ENV) or new_secret()
    env[SECRET_ENV] = secret
    # spark.kudu.dataRoot reaches every task (writes, copies, scans) and the resident
    # servers the same way (identity.CONF_DATA_ROOT_ENV).
    conf_root = spark.sparkContext.getConf().get(DATA_ROOT_CONF, None)
    if conf_root:
        env[CONF_DATA_ROOT_ENV] = conf_root
    return secret


# -- settings ------------------------------------------------------------------------------

# The embedded master's settings, each with the flag of `pyspark-kudu master run` that sets
# it on a standalone master (pyspark_kudu/tools/cli.py).
_MAPPING_CMD_FLAG = "--location-mapping-cmd"
_MAPPING_TIMEOUT_FLAG = "--location-mapping-timeout-s"
_FAILED_AFTER_FLAG = "--follower-unavailable-considered-failed-sec"


def _embedded_master_settings(conf: SparkConf, master: str | None, cmd: str | None,
                              timeout_s: float | None, failed_after_s: float | None
                              ) -> dict[str, Any]:
    """The keyword arguments of the embedded :class:`EmbeddedMaster` (``master`` None).

    Raises:
        InvalidArgumentError: with a standalone ``master``, any of these settings given as
            an argument or a Spark setting (the standalone master would never see it); an
            invalid timeout.
    """
    if master is not None:
        has = conf.contains
        given = [(name, flag) for name, flag, is_set in (
            ("location_mapping_cmd", _MAPPING_CMD_FLAG, cmd is not None),
            ("location_mapping_timeout_s", _MAPPING_TIMEOUT_FLAG, timeout_s is not None),
            ("failed_after_s", _FAILED_AFTER_FLAG, failed_after_s is not None),
            (LOCATION_MAPPING_CMD_CONF, _MAPPING_CMD_FLAG, has(LOCATION_MAPPING_CMD_CONF)),
            (LOCATION_MAPPING_TIMEOUT_CONF, _MAPPING_TIMEOUT_FLAG,
             has(LOCATION_MAPPING_TIMEOUT_CONF)),
            (FAILED_AFTER_CONF, _FAILED_AFTER_FLAG, has(FAILED_AFTER_CONF)),
        ) if is_set]
        if given:
            flags = " ".join(dict.fromkeys(f"{f} ..." for _, f in given))
            raise InvalidArgumentError(
                f"{', '.join(n for n, _ in given)}: setting(s) of the embedded master, but this "
                f"KuduContext uses the standalone masters {master}, which never see them; a "
                f"standalone master takes them on its own command line (pyspark-kudu master run "
                f"{flags}, or its --conf file): drop them here")
        return {}
    return {
        "location_mapping_cmd": cmd if cmd is not None else conf.get(
            LOCATION_MAPPING_CMD_CONF, None),
        "location_mapping_timeout_s": _seconds(conf, LOCATION_MAPPING_TIMEOUT_CONF,
                                               DEFAULT_MAPPING_TIMEOUT_S,
                                               "location_mapping_timeout_s", timeout_s),
        "follower_unavailable_considered_failed_s": _seconds(
            conf, FAILED_AFTER_CONF, 300.0, "failed_after_s", failed_after_s),
    }


def _seconds(conf: SparkConf, key: str, default: float, arg_name: str = "",
             arg: float | None = None, *, zero_ok: bool = False) -> float:
    """A timeout or interval: the argument ``arg_name`` if given (not None), else the Spark
    setting ``key`` if set, else ``default``.

    Raises:
        InvalidArgumentError: the value is zero (unless ``zero_ok``: 0 means something, as
            no leases), negative or not a finite number; naming the argument or setting.
            A 0 is refused rather than replaced by the default, which would ignore it.
    """
    source: str
    if arg is not None:
        source, value = arg_name, float(arg)
    else:
        raw = conf.get(key, None)
        if raw is None:
            return default
        source = key
        try:
            value = float(raw)
        except ValueError:
            raise InvalidArgumentError(
                f"{key}={raw!r} is not a number of seconds (default {default:g})") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        least = "0 or more" if zero_ok else "more than 0"
        raise InvalidArgumentError(
            f"{source}={value:g} is not usable: it must be {least} seconds "
            f"(default {default:g})")
    return value


def _heal_max_moves(conf: SparkConf, default: int = 4) -> int:
    """``spark.kudu.heal.maxMoves``, else ``default``.

    Raises:
        InvalidArgumentError: not an integer, or less than 1: a healer allowed no move would
            quietly never heal (``spark.kudu.heal.enabled=false`` says so instead).
    """
    raw = conf.get(HEAL_MAX_MOVES_CONF, None)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise InvalidArgumentError(
            f"{HEAL_MAX_MOVES_CONF}={raw!r} is not an integer (default {default})") from None
    if n < 1:
        raise InvalidArgumentError(
            f"{HEAL_MAX_MOVES_CONF}={n} is not usable: it must be 1 or more (default "
            f"{default}); to stop healing set {HEAL_ENABLED_CONF}=false")
    return n


def _task_usage_error(e: Exception) -> InvalidArgumentError | None:
    """The InvalidArgumentError a Spark task raised (a misconfigured host), out of the error
    Spark wraps it in; None if the task failed otherwise."""
    cause = root_cause(str(e))
    prefix = "InvalidArgumentError: "
    return InvalidArgumentError(cause.removeprefix(prefix)) if cause.startswith(prefix) else None


def _warn_without_server(servers: Sequence[TabletServerLocation]) -> None:
    missing = sorted(s.host for s in servers if not s.address)
    if missing:
        _log.warning(
            "no resident tablet server on %s: scan tasks on other hosts cannot read the "
            "replicas there (they read other replicas instead). Start sessions with "
            "spark.python.daemon.module=pyspark_kudu.spark.host.daemon (SESSION_CONF)",
            ", ".join(missing))
