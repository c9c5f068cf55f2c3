"""``KuduContext``: tables on Spark executors, written through pinned tasks, read anywhere.

The client-side entry point of DESIGN §1-3. A context

1. connects to the master: an embedded one under the warehouse directory by default (1
   replica), or the standalone group named by ``master="h1:7051,h2:7052,h3:7053"``;
2. discovers tablet servers: one per executor host on a cluster (a pinned job creates or
   reads each host's ``instance`` file and reports its resident tablet server's address),
   or ``local_tablet_servers`` virtual servers with their own data roots in ``local[*]``
   mode; and registers them with the master (which resolves their locations). The
   resident servers' credential is set up first (:func:`_cluster_secret`);
3. writes (:mod:`~pyspark_kudu.spark.api.writes`): rows are routed to tablets, each
   tablet's batch is encoded once, and all tablets are replicated through one
   :class:`~pyspark_kudu.spark.replication.write_service.ReplicationService` (barrier
   stages of pinned tasks, rounds shared by concurrent writers); a write returns once
   committed on a majority, with Kudu's per-row errors;
4. reads (:mod:`~pyspark_kudu.spark.api.reads`): one scan token per (pruned) tablet,
   preferring its replicas' hosts; a task reads the closest replica, locally or through
   its host's resident tablet server. A tablet this client leads is read at the client's
   commit index, so a write that returned is visible to the next read.

Leadership: before leading a tablet the context takes its lease from the master
(:mod:`~pyspark_kudu.spark.replication.lease_keeper`); a tablet another live client leads is
not elected but *forwarded to* (writes, linearizable read points and replication actions
go to that client's session service), so writers of one tablet share one leader instead of
fencing each other.

Tablet-server liveness: a driver thread heartbeats every server whose host has an executor
(:mod:`~pyspark_kudu.spark.healing.liveness`, ``spark.kudu.heartbeatIntervalSec``, default
1 s). Settings: :mod:`~pyspark_kudu.spark.api.settings`.

Healing and replica management (the healer's target, sweeps, unsafe recovery) are the
:class:`~pyspark_kudu.spark.healing.replica_management.ReplicaManagement` part of the
context. Replica files a deleted table left on hosts unreachable at the time are removed by
a later sweep.

Thread-safety: ``KuduContext`` methods may be called from several threads; writes share
rounds through the service, and leader elections are serialised by a lock.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pyspark_kudu.errors import (
    InvalidArgumentError,
    KuduError,
    RoundFailedError,
)
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.partitioning import PartitionSchema
from pyspark_kudu.rpc.auth import SECRET_ENV, new_secret
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.spark.api import reads
from pyspark_kudu.spark.api.group_report import GroupReport
from pyspark_kudu.spark.api.registration import register
from pyspark_kudu.spark.api.session_service import FILTER_PUSHDOWN_CONF
from pyspark_kudu.spark.api.settings import (
    AUTO_REBALANCE_CONF,
    HEAL_ENABLED_CONF,
    HEAL_INTERVAL_CONF,
    HEARTBEAT_CONF,
    ROUND_TIMEOUT_CONF,
    WAREHOUSE_CONF,
    embedded_master_settings,
    heal_max_moves,
    raise_arrow_batch,
    restore_arrow_batch,
    seconds,
)
from pyspark_kudu.spark.api.source_options import parse_bool
from pyspark_kudu.spark.api.tablet_servers import TabletServers
from pyspark_kudu.spark.api.writes import WritePath
from pyspark_kudu.spark.healing.healer import Healer
from pyspark_kudu.spark.healing.liveness import LivenessReporter
from pyspark_kudu.spark.healing.replica_management import ReplicaManagement
from pyspark_kudu.spark.host.dataplane import (
    StagingJanitor,
)
from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind
from pyspark_kudu.spark.host.identity import (
    CONF_DATA_ROOT_ENV,
    DATA_ROOT_CONF,
)
from pyspark_kudu.spark.host.replica_reader import TabletScan
from pyspark_kudu.spark.replication.lease_keeper import (
    DEFAULT_LEASE_S,
    LEASE_CONF,
    LeaseKeeper,
)
from pyspark_kudu.spark.replication.session_client import (
    TableInfo,
    TabletInfo,
)
from pyspark_kudu.spark.replication.spark_rounds import (
    DEFAULT_ROUND_TIMEOUT_S,
    SparkTransport,
    root_cause,
)
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader
from pyspark_kudu.spark.replication.write_service import (
    ReplicationService,
    WriteProgress,
    WriteSummary,
)
from pyspark_kudu.wal import WalOptions

__all__ = ["KuduContext", "WriteProgress", "WriteSummary"]

_log = logging.getLogger(__name__)



class KuduContext(TabletServers, WritePath, ReplicaManagement):
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
        embedded_kwargs = embedded_master_settings(
            conf, master, location_mapping_cmd, location_mapping_timeout_s, failed_after_s)
        round_timeout = seconds(conf, ROUND_TIMEOUT_CONF, DEFAULT_ROUND_TIMEOUT_S,
                                 "round_timeout_s", round_timeout_s)
        lease_ttl = seconds(conf, LEASE_CONF, DEFAULT_LEASE_S, "lease_s", lease_s,
                             zero_ok=True)
        heal_interval = seconds(conf, HEAL_INTERVAL_CONF, 5.0, "heal_interval_s",
                                 heal_interval_s)
        heartbeat = seconds(conf, HEARTBEAT_CONF, 1.0)
        max_moves = heal_max_moves(conf)
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
        self.transport.pull_addresses = self._current_addresses
        self.transport.secret = self._secret.encode()  # for its calls to resident servers
        self._service = ReplicationService(self.transport)
        self._janitor = StagingJanitor(
            sc, [s.host for s in self.servers], self.warehouse if self._local else None,
            addresses=self._current_addresses, secret=self._secret.encode(),
            conf_root=sc.getConf().get("spark.kudu.dataRoot", None))
        self._leaders: dict[str, TabletLeader] = {}
        self._leader_tables: dict[str, str] = {}
        self._acked: dict[str, tuple[str, int, int]] = {}
        self._failed_reported: set[tuple[str, str]] = set()
        self._commit_reports = GroupReport(self._send_commit_reports)
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._closed = False
        self._refresh_wanted = False
        self._refresher: threading.Thread | None = None
        self._to_warm: set[str] = set()
        #: Per host, how many warm-up tasks started its SQL Python daemon (``_servers_found``).
        self.warmed: dict[str, int] = {}
        self.liveness = LivenessReporter(
            self.master, [s.meta() for s in self.servers],
            self._live_hosts, interval_s=heartbeat,
            round_trips=self.transport.host_rtt, on_lost=self._servers_lost,
            on_found=self._servers_found).start()
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
        # Writes' staging tasks take their rows in batches of the writer's size (settings).
        self._arrow_batch_replaced = raise_arrow_batch(spark)

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
        restore_arrow_batch(self.spark, self._arrow_batch_replaced)

    def __enter__(self) -> KuduContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def credential(self) -> str:
        """This application's ``PYSPARK_KUDU_SECRET``: its resident tablet servers' and its
        session service's credential (see :func:`_cluster_secret`)."""
        return self._secret

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
        tablets = []
        for t in locs.tablets:
            leader, known, term = self.known_commit(t.tablet_id, t.leader, t.committed_index)
            # Voters only: a NON_VOTER may still be receiving its tablet copy.
            tablets.append(TabletInfo(t.tablet_id, tuple(t.voters), leader, known, term))
        return TableInfo(
            table=table, schema=locs.table.schema,
            partition_schema=dict(locs.table.partition_schema),
            tablets=tuple(tablets),
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

        The catalog deletion is what makes the table gone. Each host's resident tablet server
        deletes its replicas' files (``ReplicaManagement._delete_replicas``); a host that
        cannot now (no executor) keeps them, and a warning names them; the healer's sweep
        deletes them once the host is back (the catalog keeps the tablets' tombstones).
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
        left = self._delete_replicas({ts: tuple(tids) for ts, tids in by_ts.items()})
        if left:
            _log.warning("table %s: replica files stay on tablet servers %s (not reachable "
                         "now)", name, sorted(left))

    # -- reads -------------------------------------------------------------------------------
    def read_table(self, name: str, columns: Sequence[str] | None = None,
                   predicates: Sequence[Predicate] = (), snapshot: int | None = None,
                   locality: str = "closest_replica", read_mode: str = "read_latest"
                   ) -> DataFrame:
        """A lazy DataFrame over ``name``: one partition per tablet left after pruning with
        ``predicates``, preferring the hosts of the replicas it may read; a task placed
        elsewhere reads through the replica host's tablet server (:mod:`.reads`).

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
        return reads.read_table(self, name, columns, predicates, snapshot, locality, read_mode,
                                self.session_service.address)

    def scan_tokens(self, name: str, columns: Sequence[str] | None = None,
                    predicates: Sequence[Predicate] = (), snapshot: int | None = None,
                    locality: str = "closest_replica", read_mode: str = "read_latest"
                    ) -> list[TabletScan]:
        """The scan :meth:`read_table` would run, as one token per tablet (kudu-spark's
        ``KuduScanToken``): its eligible replicas, read point and preferred hosts. Run one
        anywhere with :func:`~pyspark_kudu.spark.host.replica_reader.read_tablet`."""
        return reads.scan_tokens(self, name, columns, predicates, snapshot, locality,
                                read_mode)[0]

    def server_locations(self) -> dict[str, str | None]:
        """Every registered tablet server's location (None: it has none)."""
        return {str(t["uuid"]): t.get("location") for t in self.master.list_tservers()}

    def known_commit(self, tablet_id: str, reported_leader: str, reported_commit: int
                     ) -> tuple[str, int | None, int | None]:
        """The replica leading ``tablet_id``, the commit index a read must see and that
        entry's term when known: this client's own leader's (with the term, so a follower
        holding the entry can serve the read), else the last one any client reported
        (entries up to it are committed for good; no term), else None (each replica serves
        what it knows committed).

        Never below this client's own acknowledged writes (read-your-writes): the last
        entry of those (``_acked``, with the replica that committed it and its term) is the
        floor, also when the leader that committed it was abandoned since (a failed round,
        an executor lost) or a new leader has not yet learnt the commit; without it such a
        read would let a follower that missed the write serve what it had."""
        with self._lock:
            lead = self._leaders.get(tablet_id)
            acked = self._acked.get(tablet_id)
        if lead is not None and lead.node is not None:
            commit = lead.node.commit_index
            term = lead.node.log.term_or_zero(commit)
            if acked is None or commit >= acked[1]:
                return lead.leader_id, commit, term or None
        if (reported_leader and reported_commit
                and reported_leader not in self.transport.unreachable()
                and (acked is None or reported_commit > acked[1])):
            return reported_leader, reported_commit, None
        if acked is not None:
            return acked
        return reported_leader, None, None

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


def _task_usage_error(e: Exception) -> InvalidArgumentError | None:
    """The InvalidArgumentError a Spark task raised (a misconfigured host), out of the error
    Spark wraps it in; None if the task failed otherwise."""
    cause = root_cause(str(e))
    prefix = "InvalidArgumentError: "
    return InvalidArgumentError(cause.removeprefix(prefix)) if cause.startswith(prefix) else None

