"""The tablet servers of a ``KuduContext``: discovery, registration, and the executors that go
and come back.

:class:`TabletServers` is the part of
:class:`~pyspark_kudu.spark.api.context.KuduContext` that knows where its tablet servers are
(a mixin, as :class:`~pyspark_kudu.spark.api.writes.WritePath`):

- **discovery** (``_discover``): one tablet server per executor host on a cluster, its
  identity read (or created) by a task pinned there, with the address of the host's
  resident tablet server; ``local_tablet_servers`` virtual servers in ``local[*]`` mode;
- **registration** with the master (``_register``), which resolves their locations;
- **executors lost** (``_servers_lost``, told by the liveness reporter within about one
  heartbeat): the tablets this client leads from their replicas fail over at once
  (:meth:`~pyspark_kudu.spark.api.writes.WritePath.fail_over`);
- **executors back** (``_servers_found``): the new resident servers are looked up
  (``refresh_servers``) and Spark SQL's Python daemon is started there, in the background,
  before any task needs them.

Thread-safety: as ``KuduContext``; ``refresh_servers`` runs one at a time
(``_refresh_lock``), one refresher thread at a time handles returned executors, and the
server list is replaced whole, never changed in place.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import SparkSession

from pyspark_kudu.errors import (
    KuduError,
    LocationMappingError,
    ServiceUnavailableError,
    TimedOutError,
)
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.spark.healing.liveness import LivenessReporter
from pyspark_kudu.spark.host.identity import (
    TabletServerInfo,
    current_host,
    ensure_instance,
    local_data_root,
)
from pyspark_kudu.spark.host.tserver_protocol import ADDRESS_ENV
from pyspark_kudu.spark.pinned import executor_hosts, pinned_rdd
from pyspark_kudu.spark.replication.spark_rounds import (
    SparkTransport,
    TabletServerLocation,
    root_cause,
)
from pyspark_kudu.spark.replication.write_service import ReplicationService

__all__ = ["TabletServers"]

_log = logging.getLogger(__name__)
# Discovery jobs per call before a host whose pinned task keeps running elsewhere is left
# for the next look (each job waits spark.locality.wait for the host's executor).
_DISCOVERY_ATTEMPTS = 3


class TabletServers:
    """Where a ``KuduContext``'s tablet servers are (see the module docstring)."""

    spark: SparkSession
    servers: list[TabletServerLocation]
    master: MasterClient
    transport: SparkTransport
    liveness: LivenessReporter
    warehouse: str
    warmed: dict[str, int]
    _service: ReplicationService
    _local: bool
    _data_root_conf: str | None
    _executors: dict[str, list[str]]
    _lock: threading.Lock
    _refresh_lock: threading.Lock
    _closed: bool
    _refresh_wanted: bool
    _refresher: threading.Thread | None
    _to_warm: set[str]

    if TYPE_CHECKING:  # provided by WritePath
        def fail_over(self, lost: Collection[str]) -> list[str]: ...

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


def _warn_without_server(servers: Sequence[TabletServerLocation]) -> None:
    missing = sorted(s.host for s in servers if not s.address)
    if missing:
        _log.warning(
            "no resident tablet server on %s: scan tasks on other hosts cannot read the "
            "replicas there (they read other replicas instead). Start sessions with "
            "spark.python.daemon.module=pyspark_kudu.spark.host.daemon (SESSION_CONF)",
            ", ".join(missing))
