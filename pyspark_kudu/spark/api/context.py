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
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pyspark_kudu.errors import (
    InvalidArgumentError,
    KuduError,
    LocationMappingError,
    RoundFailedError,
    ServiceUnavailableError,
    TimedOutError,
)
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.partitioning import PartitionSchema
from pyspark_kudu.rpc.auth import SECRET_ENV, new_secret
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.spark.api import reads
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
    seconds,
)
from pyspark_kudu.spark.api.source_options import parse_bool
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
    TabletServerInfo,
    current_host,
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
)
from pyspark_kudu.spark.replication.session_client import (
    TableInfo,
    TabletInfo,
)
from pyspark_kudu.spark.replication.spark_rounds import (
    DEFAULT_ROUND_TIMEOUT_S,
    SparkTransport,
    TabletServerLocation,
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
# Discovery jobs per call before a host whose pinned task keeps running elsewhere is left
# for the next look (each job waits spark.locality.wait for the host's executor).
_DISCOVERY_ATTEMPTS = 3



class KuduContext(WritePath, ReplicaManagement):
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
        self._service = ReplicationService(self.transport)
        self._janitor = StagingJanitor(sc, [s.host for s in self.servers],
                                       self.warehouse if self._local else None)
        self._leaders: dict[str, TabletLeader] = {}
        self._leader_tables: dict[str, str] = {}
        self._acked: dict[str, tuple[str, int, int]] = {}
        self._failed_reported: set[tuple[str, str]] = set()
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

    def _live_hosts(self) -> set[str]:
        if self._local:
            return {s.host for s in self.servers}
        # A suspect host (not answering, though Spark still lists its executor) is not
        # reported live: if it stays away, the master declares its tablet server failed.
        return set(executor_hosts(self.spark.sparkContext)) - self.transport.suspect_hosts()

    def _servers_lost(self, lost: set[str]) -> None:
        """Liveness found the executors of tablet servers ``lost`` gone: the tablets this
        client leads from their replicas fail over now (:meth:`fail_over`, on the round
        thread, not waited for here), while the master's failure detection and the healer's
        re-replication go on at their own pace."""
        try:
            fut = self._service.call(lambda: self.fail_over(lost))
        except KuduError:  # the service is closing
            return
        fut.add_done_callback(_log_failover)

    def _servers_found(self, found: set[str]) -> None:
        """Executors came back on the hosts of tablet servers ``found``: look up their new
        resident servers now, in the background (:meth:`refresh_servers`: a discovery job
        pinned there, which also starts each new executor's Python daemon and resident
        server). Otherwise the first task to land there pays for that start, 2.5-4.5 s under
        load: a replication round that includes the host, or a user's task Spark gives the
        idle new executor. One refresh thread at a time; a host found meanwhile is looked
        at by the same thread once the current refresh returns."""
        hosts = {s.host for s in self.servers if s.uuid in found}
        with self._lock:
            self._refresh_wanted = True
            self._to_warm |= hosts
            if self._refresher is None and not self._closed:
                self._refresher = threading.Thread(target=self._refresh_while_wanted,
                                                   daemon=True, name="kudu-server-refresh")
                self._refresher.start()

    def _refresh_while_wanted(self) -> None:
        while True:
            with self._lock:
                if not self._refresh_wanted or self._closed:
                    self._refresher = None
                    return
                self._refresh_wanted = False
                hosts, self._to_warm = sorted(self._to_warm), set()
            try:
                self.refresh_servers()
                for h in self._warm_sql_workers(hosts) if hosts else ():
                    self.warmed[h] = self.warmed.get(h, 0) + 1
            except Exception as e:  # e.g. the SparkContext stopping under it
                _log.warning("looking up the tablet servers of returned executors failed: %s",
                             e)

    def _warm_sql_workers(self, hosts: Sequence[str]) -> list[str]:
        """Start, on each of ``hosts``, the Python daemon of Spark SQL's Python tasks (a
        ``format("kudu")`` writer, ``mapInArrow``): one tiny ``mapInArrow`` task pinned
        there. Spark keeps a daemon per kind of Python runner (their environments differ),
        and the discovery job starts only the one of plain RDD tasks; a user's writer task
        landing first on a new executor waited 4-6 s for the other in the chaos runs.
        Returns the hosts whose task ran there (pinning is a preference)."""
        rdd = pinned_rdd(self.spark.sparkContext, [(h, [h]) for h in hosts])
        df = self.spark.createDataFrame(rdd.map(lambda h: (h,)), "host string")
        return [r["host"] for r in df.mapInArrow(_host_batch, "host string").collect()]

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
        """The tablet server of each of ``hosts``, from a task pinned there. A pinned task
        is only a preference: one Spark ran on another host (the host's executor was busy
        or not yet offered for ``spark.locality.wait``) reports nothing, and its host is
        asked again, up to ``_DISCOVERY_ATTEMPTS`` jobs. Hosts never reached are left out
        (the caller looks again later); trusting the misplaced task would give its host's
        server twice and the requested host's an old address."""
        sc = self.spark.sparkContext
        want = list(hosts)
        found: dict[str, tuple[TabletServerInfo, str]] = {}
        for _ in range(_DISCOVERY_ATTEMPTS):
            got = pinned_rdd(sc, [(h, [h]) for h in want]).map(
                partial(_identify, conf_root=self._data_root_conf)).collect()
            found.update((h, r) for h, r in zip(want, got, strict=True) if r is not None)
            want = [h for h in want if h not in found]
            if not want:
                break
        if want:
            _log.warning("tablet server discovery did not reach %s: its tasks ran on other "
                         "hosts %d times", ", ".join(want), _DISCOVERY_ATTEMPTS)
        out = [TabletServerLocation(i.uuid, i.host, None, a)
               for i, a in (found[h] for h in hosts if h in found)]
        _warn_without_server(out)
        return out

    def refresh_servers(self) -> None:
        """Learn the new tablet server address of every host whose executor was replaced
        since the last look (a new executor runs a new resident server on a new port) and
        register it with the master. Cheap when nothing changed: one look at the executors.

        One refresh at a time (``_refresh_lock``): every scan task that found its replicas'
        addresses stale asks at about the same moment, and unserialized refreshes both ran
        one discovery job each and could apply an older job's addresses after a newer one's
        (the master's registration flipped back to a dead port). A caller that waited finds
        the hosts already looked at. A host whose executor changed again while its
        discovery job ran, or that discovery did not reach, is looked at again next time."""
        if self._local:
            return
        with self._refresh_lock:
            sc = self.spark.sparkContext
            now = executor_hosts(sc)
            changed = sorted(h for h, ids in now.items() if self._executors.get(h) != ids)
            if not changed:
                return
            try:
                fresh = {s.uuid: s for s in self._discover_hosts(changed)}
            except Exception as e:  # an executor lost meanwhile: the next read looks again
                _log.warning("refreshing tablet server addresses failed: %s",
                             root_cause(str(e)))
                return
            with self._lock:
                self.servers = [fresh.get(s.uuid, s) for s in self.servers]
            after = executor_hosts(sc)
            reached = {s.host for s in fresh.values()}
            for h in changed:
                if h in reached and after.get(h) == now[h]:
                    self._executors[h] = now[h]
            for s in fresh.values():
                self.liveness.update(s.meta())

    def _current_addresses(self) -> dict[str, str]:
        """``{host: address}`` of the resident servers whose executor is still the one they
        were discovered on (rounds pull staged batches from them, ``SparkTransport``).
        Takes no lock: a round may run while this thread holds the context's lock (an
        election in ``_leaders_for`` that catches a follower up with log refs), and the
        server list is replaced whole, never changed in place."""
        servers = list(self.servers)
        if self._local:
            return {s.host: s.address for s in servers if s.address}
        now = executor_hosts(self.spark.sparkContext)
        return {s.host: s.address for s in servers
                if s.address and now.get(s.host) == self._executors.get(s.host)}

    def server_addresses(self) -> dict[str, str]:
        """``{tablet server: address of its resident server}``, refreshed first (what a scan
        task whose token's addresses no longer answer asks the session service for)."""
        self.refresh_servers()
        with self._lock:
            return {s.uuid: s.address for s in self.servers if s.address}

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

def _identify(host: str, conf_root: str | None = None) -> tuple[TabletServerInfo, str] | None:
    """Executor side of discovery on a cluster: this host's tablet server and its resident
    server, or None if the task meant for ``host`` runs on another host. The data root is
    the host's ``PYSPARK_KUDU_DATA_ROOT``, else ``conf_root`` (the application's
    ``spark.kudu.dataRoot``); never the local-mode default, which is refused before anything
    is written (:func:`~pyspark_kudu.spark.host.identity.local_data_root`)."""
    if current_host() != host:
        return None
    root = local_data_root(None, conf_root, cluster=True)
    return ensure_instance(root), os.environ.get(ADDRESS_ENV, "")


def _host_batch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A warm-up task's whole work: the host it ran on (``_warm_sql_workers``)."""
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"host": [current_host()]})


def _log_failover(fut: Future[Any]) -> None:
    """A fail-over's failure, logged (each tablet's own failure is logged in
    ``fail_over``; this is a bug or the Spark context stopping under it)."""
    e = fut.exception()
    if e is not None:
        _log.warning("failing over tablets from lost tablet servers failed: %s", e)


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
