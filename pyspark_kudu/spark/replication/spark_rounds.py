"""Replication rounds as Spark barrier stages of pinned tasks (DESIGN §3, §4).

:class:`SparkTransport` is the
:class:`~pyspark_kudu.spark.replication.peer_transport.PeerTransport` of a real
cluster: one round = one barrier stage with **one task per executor host**, pinned to that
host, serving the requests of every tablet server on it (one per host on a cluster; all the
virtual tablet servers of ``local[*]`` mode on its single host). Responses come back as task
results, never through ``allGather`` (each costs ~1 s, DESIGN §4).

Each task checks every tablet server's instance file before touching it; a request that
landed on the wrong host comes back as "task failed" for that tablet server, exactly like a
dead host, and nothing is written (DESIGN §1).

If any task dies, Spark aborts the barrier stage without retrying it (measured, DESIGN §4):
the round reports every tablet server as failed and :class:`TabletLeader` retries without the
hosts that have lost their executor. A round's job that has not finished after
``round_timeout_s`` (``spark.kudu.roundTimeoutSec``) is cancelled through its job group and
counts as failed the same way: a job Spark never finishes (a stage waiting on an executor the
driver has not yet declared lost) must not block a tablet's writes forever. Sooner than
that, a round is cancelled as soon as the driver loses an executor one of its hosts had
when it started (its watcher polls every ``watch_interval_s``): a barrier task not yet
launched there would otherwise wait for the timeout (measured: a round in flight when a
worker was SIGKILLed waited the whole 300 s default; the others failed within ~5 s). Cancelling is
safe: a killed task is a crashed replica mid-write, which the WAL's torn-tail recovery and
Raft's re-sends already cover.

A host can stop answering without its executor being lost (a network partition from the
driver, a paused or swapping process): Spark keeps it until its heartbeats time out
(``spark.network.timeout``, 120 s), so every round would wait on it. After a timed-out round
each host of that round is *probed* (its resident tablet server pinged from the driver, or,
without one, a one-task pinned job; ``probe_timeout_s``); a host whose probe does not
answer in time is **suspect** for ``suspect_s`` and counts as
unreachable meanwhile -- rounds go on without it (a majority suffices), scans avoid it, and
the liveness reports leave it out, so the master can declare it failed if it stays away.

Write batches do not travel inside the tasks: the driver's entries carry staged-batch refs.
When every host that staged a batch of the round runs a resident tablet server (the usual
case), the round stays one barrier stage and each host's server *pulls* the batches its
replicas need: from its own disk, or from the staging host's server
(:class:`~pyspark_kudu.spark.host.round_tasks.PulledPayloads`). Otherwise (or with
``pull_batches=False``) the round is one job of two stages, a pinned map stage on the
staging hosts and the barrier stage zipped with the shuffle that delivers the batches to
every replica's host (:mod:`pyspark_kudu.spark.host.dataplane`, :meth:`SparkTransport.run`).
Measured on a 10M-row composite-key ingest (6 one-core workers): the shuffle's map stage
alone took 2.4-5.8 s and the bytes crossed Python and the JVM four times.

Every round is also a sample of the driver's round trip to each of its hosts
(:meth:`SparkTransport.host_rtt`, :mod:`~pyspark_kudu.spark.replication.latency`).

Thread-safety: ``SparkTransport.run`` may be called from several driver threads (Spark
schedules concurrent jobs); the registry is read-only after construction.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from pyspark import SparkContext
from pyspark.serializers import BatchedSerializer, CPickleSerializer

from pyspark_kudu.errors import InvalidArgumentError, KuduError
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.spark.host.dataplane import StagedRef, refs_of
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse
from pyspark_kudu.spark.host.round_tasks import (
    HostTask,
    barrier_partition,
    barrier_with_data,
    destination,
    emit_staged,
    land,
    where,
)
from pyspark_kudu.spark.jvm import scala_context
from pyspark_kudu.spark.pinned import barrier_collect, executor_hosts, pinned_rdd
from pyspark_kudu.spark.replication.latency import RoundTrip, RoundTrips, spark_task_delays
from pyspark_kudu.wal import WalOptions

__all__ = ["DEFAULT_ROUND_TIMEOUT_S", "SparkTransport", "TabletServerLocation", "root_cause"]

_log = logging.getLogger(__name__)

#: Seconds a replication round's Spark job may run before it is cancelled and counted as a
#: failed round. Generous: a tablet copy's round moves the whole tablet (~6 s per 400 MB
#: measured on the test machine, ``benchmarks/recovery.py``).
DEFAULT_ROUND_TIMEOUT_S = 300.0
_PREFETCH_TIMEOUT_S = 10.0  # asking a server to prefetch a copy (it answers at once)
#: Seconds a host that did not answer a probe stays out of rounds (it is probed again then).
DEFAULT_SUSPECT_S = 30.0

@dataclass(frozen=True)
class TabletServerLocation:
    """Where a tablet server lives. ``root`` is set only for local-mode virtual servers;
    on a cluster the task resolves its host's own data root. ``address``: its host's
    resident tablet server (``host:port``, "" if none runs)."""

    uuid: str
    host: str
    root: str | None = None
    address: str = ""

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2]) if self.address else 0

    def meta(self) -> TServerMeta:
        """What heartbeats tell the master about this server (its registration)."""
        return TServerMeta(self.uuid, self.host, self.port, self.root or "")

_PY_ERROR = re.compile(r"(?<![\w.$])(?:[a-z_]\w*\.)*([A-Z]\w*(?:Error|Exception)): ([^\n]*)")

def root_cause(message: str) -> str:
    """The Python exception a failed stage carries (e.g. ``ModuleNotFoundError: ...``),
    else the first line: Spark wraps task errors in pages of JVM stack trace."""
    found = _PY_ERROR.findall(message)
    if found:
        name, text = found[-1]
        return f"{name}: {text.strip()}"
    return (message.strip().splitlines() or [""])[0]

@contextmanager
def _job_group(sc: SparkContext, group: str, description: str) -> Iterator[str]:
    """Run this thread's jobs meanwhile in ``group`` (so they can be cancelled together),
    restoring the thread's own local properties afterwards. PySpark pins each Python
    thread to a JVM thread, so local properties are per calling thread. Four Py4J calls
    (a copy of the thread's properties, set as one group, put back), not nine (each of
    three properties read, set and restored): every round runs in one."""
    ssc = scala_context(sc)
    saved = ssc.getLocalProperties().clone()
    # Cancelling interrupts the task threads: a Python worker blocked on a lock or a
    # disk is killed rather than waited for.
    ssc.setJobGroup(group, description, True)
    try:
        yield group
    finally:
        ssc.setLocalProperties(saved)


class SparkTransport:
    """Runs rounds as barrier stages over the tablet servers in ``servers``."""

    def __init__(self, sc: SparkContext, servers: Sequence[TabletServerLocation],
                 options: WalOptions | None = None,
                 round_timeout_s: float = DEFAULT_ROUND_TIMEOUT_S) -> None:
        if not round_timeout_s > 0:
            raise InvalidArgumentError(
                f"round timeout must be a positive number of seconds, got {round_timeout_s!r}")
        self._sc = sc
        self._servers = {s.uuid: s for s in servers}
        self._options = options
        self._local = (sc.master or "").startswith("local")
        self.round_timeout_s = round_timeout_s
        self.probe_timeout_s = min(10.0, round_timeout_s)
        self.suspect_s = DEFAULT_SUSPECT_S
        self.rounds = 0
        self.data_rounds = 0  # rounds that carried staged batches
        self.pulled_rounds = 0  # ... of which the servers pulled them (one stage)
        self.pull_batches = True  # False: always deliver staged batches by shuffle
        #: ``{host: address}`` of the resident tablet servers known to be current (the
        #: context's; an executor replaced since its server was discovered is left out,
        #: so rounds from its host shuffle); None: the addresses given at construction.
        self.pull_addresses: Callable[[], Mapping[str, str]] | None = None
        #: The application's credential, for calls to the resident servers
        #: (:meth:`prefetch_copy`); b"": none made.
        self.secret = b""
        self.prefetches = 0  # tablet copies a target's server was asked to prefetch
        #: The last asks (:meth:`prefetch_copy`): tablet, host, wall-clock times asked and
        #: answered, and whether the server started fetching (None: the ask failed).
        self.prefetch_asks: deque[tuple[str, str, float, float, bool | None]] = deque(
            maxlen=64)
        self.failed_rounds = 0
        self.timed_out_rounds = 0
        self.lost_executor_rounds = 0
        self.watch_interval_s = 0.5  # how often a round's watcher checks the executors
        self.last_error = ""
        self._suspects: dict[str, float] = {}  # host -> monotonic time it stops being one
        self._suspects_lock = threading.Lock()
        self.round_trips = RoundTrips(spark_task_delays(sc))

    def host_rtt(self) -> dict[str, RoundTrip]:
        """The driver's round-trip estimate to each host that served a round
        (:mod:`~pyspark_kudu.spark.replication.latency`)."""
        return self.round_trips.estimates()

    def suspect_hosts(self) -> set[str]:
        """Hosts that did not answer a probe after a timed-out round, for ``suspect_s``."""
        now = time.monotonic()
        with self._suspects_lock:
            for h in [h for h, until in self._suspects.items() if until <= now]:
                del self._suspects[h]
            return set(self._suspects)

    def _addresses(self) -> dict[str, str]:
        """``{host: address}`` of the resident tablet servers known to be current."""
        return (dict(self.pull_addresses()) if self.pull_addresses is not None else
                {s.host: s.address for s in self._servers.values() if s.address})

    def prefetch_copy(self, ts: str, tablet_id: str, manifest: bytes, index: int) -> None:
        """Ask tablet server ``ts``'s resident server, straight from the driver and in the
        background, to start fetching the served tablet copy ``manifest`` (to be installed
        at ``index``) before the install round reaches it
        (:func:`~pyspark_kudu.spark.host.copy_fetch.prefetch_served`). Best effort: without
        a current address or credential nothing is asked, and a refusal or an unreachable
        server only means the install round fetches the copy itself."""
        loc = self._servers.get(ts)
        addresses = self._addresses()
        address = addresses.get(loc.host) if loc is not None else None
        if loc is None or not address or not self.secret:
            return
        self.prefetches += 1

        def ask() -> None:
            from pyspark_kudu.spark.host.tserver_client import prefetch_copy

            asked = time.time()
            started: bool | None = None
            try:
                started = prefetch_copy(address, self.secret, ts, loc.root, manifest, index,
                                        timeout_s=_PREFETCH_TIMEOUT_S)
            except KuduError as e:
                _log.info("tablet %s: prefetching its copy on %s failed (the install "
                          "round fetches it): %s", tablet_id, loc.host, e)
            self.prefetch_asks.append((tablet_id, loc.host, asked, time.time(), started))

        threading.Thread(target=ask, daemon=True, name="kudu-copy-prefetch-ask").start()

    def unreachable(self) -> set[str]:
        if self._local:
            return set()
        live = set(executor_hosts(self._sc)) - self.suspect_hosts()
        return {u for u, s in self._servers.items() if s.host not in live}

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]) -> dict[
        str, list[PeerResponse] | None
    ]:
        self.rounds += 1
        by_host: dict[str, list[tuple[str, str | None, tuple[PeerRequest, ...]]]] = {}
        for ts, reqs in requests.items():
            loc = self._servers.get(ts)
            if loc is None:
                # A tablet server this application never saw (its host had no executor
                # when the context started, e.g. it died before): like a dead one.
                continue
            by_host.setdefault(loc.host, []).append((ts, loc.root, tuple(reqs)))
        tasks = [(HostTask(h, tuple(items), self._options), [h])
                 for h, items in sorted(by_host.items())]
        result: dict[str, list[PeerResponse] | None] = {ts: None for ts in requests}
        if not tasks:
            return result
        description = (f"pyspark-kudu replication round {self.rounds}: "
                       f"{sum(len(r) for r in requests.values())} requests to "
                       f"{len(requests)} tablet servers")
        timed_out = threading.Event()
        lost: list[str] = []  # round hosts whose executor the driver lost meanwhile
        done = threading.Event()
        try:
            with _job_group(self._sc, f"pyspark-kudu-round-{uuid.uuid4().hex}",
                            description) as group:
                self._watch(group, sorted(by_host), done, timed_out, lost)
                refs = self._refs_by_source(requests, [h for h, _ in sorted(by_host.items())])
                sources = self._pull_sources(refs, [h for h, _ in sorted(by_host.items())])
                if refs:
                    self.data_rounds += 1
                if refs and sources is not None:
                    self.pulled_rounds += 1
                    pulling = [(replace(t, pull=True, sources=sources), prefs)
                               for t, prefs in tasks]
                    collected = barrier_collect(self._sc, pulling, barrier_partition)
                elif refs:
                    collected = self._run_with_data(tasks, refs)
                else:
                    collected = barrier_collect(self._sc, tasks, barrier_partition)
        except Exception as e:  # a failed stage is a failed round, by design
            self.failed_rounds += 1
            if lost:
                self.lost_executor_rounds += 1
                self.last_error = (f"the round's job was cancelled: the executor of "
                                   f"{', '.join(lost)} was lost during the round")
            elif timed_out.is_set():
                self.timed_out_rounds += 1
                self.last_error = (f"the round's job did not finish within "
                                   f"{self.round_timeout_s:g} s and was cancelled")
            else:
                self.last_error = root_cause(str(e))
            _log.warning("replication round failed as a whole: %s", self.last_error)
        else:
            for host_results in collected:
                for ts, resps, misplaced in host_results:
                    if misplaced:
                        _log.warning("tablet server %s: %s", ts, misplaced)
                    result[ts] = resps
            # A sample per host of the barrier stage; a misplaced task is none of its own.
            self.round_trips.note_round(group, [
                "" if any(m for _, _, m in host_results) else task.host
                for (task, _), host_results in zip(tasks, collected, strict=True)])
        finally:
            done.set()
        if timed_out.is_set() and not self._local:
            self._mark_suspects(sorted(by_host))
        return result

    def _watch(self, group: str, hosts: Sequence[str], done: threading.Event,
               timed_out: threading.Event, lost: list[str]) -> None:
        """Cancel the round's job group once ``round_timeout_s`` passed (``timed_out``) or,
        on a cluster, once the driver lost an executor that a host of the round had when
        it started (``lost``): a barrier task that had not launched there would wait for a
        slot that never comes, and one that had is failing anyway."""
        deadline = time.monotonic() + self.round_timeout_s
        before = {} if self._local else {
            h: set(ids) for h, ids in executor_hosts(self._sc).items() if h in hosts}

        def watch() -> None:
            while True:
                left = deadline - time.monotonic()
                # Without executors to watch (local mode) only the deadline matters.
                if done.wait(min(self.watch_interval_s, left) if before else left):
                    return  # the round ended
                if time.monotonic() >= deadline:
                    timed_out.set()
                    break
                try:
                    now = executor_hosts(self._sc)
                except Exception:  # the SparkContext is stopping: the round ends with it
                    return
                lost.extend(h for h, ids in before.items() if not ids <= set(now.get(h, ())))
                if lost:
                    break
            if not done.is_set():
                self._sc.cancelJobGroup(group)

        threading.Thread(target=watch, daemon=True, name=f"kudu-{group}").start()

    def _mark_suspects(self, hosts: Sequence[str]) -> None:
        """Probe ``hosts`` at once; those that do not run a task in time become suspect."""
        answered: dict[str, bool] = {}
        threads = [threading.Thread(target=lambda h=h: answered.__setitem__(h, self._probe(h)),
                                    daemon=True, name=f"kudu-probe-{h}") for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.probe_timeout_s + 5.0)
        silent = [h for h in hosts if not answered.get(h, False)]
        if silent:
            _log.warning("hosts %s did not answer within %g s after a timed-out round: left "
                         "out of rounds for %g s", silent, self.probe_timeout_s, self.suspect_s)
        until = time.monotonic() + self.suspect_s
        with self._suspects_lock:
            for h in silent:
                self._suspects[h] = until

    def _probe(self, host: str) -> bool:
        """Whether ``host`` answers within ``probe_timeout_s``: its resident tablet server's
        ping, when its address and the credential are known, else a task pinned there.
        The ping needs no task slot: after a round that timed out on *another* host, this
        host's only slot may still be held by the cancelled round's task for a while, and
        a pinned probe then ran elsewhere or late -- replays of a fault run left a healthy host out
        of rounds for 30 s that way (a paused host timed the round out), and the tablets
        whose majority needed it could elect no leader meanwhile."""
        addresses = self._addresses()
        address = addresses.get(host)
        if address and self.secret:
            from pyspark_kudu.spark.host.tserver_client import ping

            try:
                ping(address, self.secret, timeout_s=self.probe_timeout_s)
            except Exception:  # refused, timed out, or answered with an error: silent
                return False
            return True
        done = threading.Event()
        try:
            with _job_group(self._sc, f"pyspark-kudu-probe-{uuid.uuid4().hex}",
                            f"pyspark-kudu: is {host} answering?") as group:
                def cancel() -> None:
                    if not done.is_set():
                        self._sc.cancelJobGroup(group)

                timer = threading.Timer(self.probe_timeout_s, cancel)
                timer.daemon = True
                timer.start()
                try:
                    got: list[str] = (pinned_rdd(self._sc, [(host, [host])]).map(where)
                                      .collect())
                finally:
                    done.set()
                    timer.cancel()
        except Exception:  # cancelled, or the job failed: no answer
            return False
        return got == [host]

    def _refs_by_source(self, requests: Mapping[str, Sequence[PeerRequest]],
                        hosts: Sequence[str]
                        ) -> dict[str, list[tuple[StagedRef, tuple[int, ...]]]]:
        """Staged batches this round must deliver: per staging host, each batch with the
        indexes (in ``hosts``) of the hosts whose requests carry it."""
        idx = {h: i for i, h in enumerate(hosts)}
        dests: dict[str, tuple[StagedRef, set[int]]] = {}
        for ts, reqs in requests.items():
            if ts not in self._servers:
                continue
            d = idx[self._servers[ts].host]
            for ref in refs_of(reqs):
                dests.setdefault(ref.path, (ref, set()))[1].add(d)
        by_src: dict[str, list[tuple[StagedRef, tuple[int, ...]]]] = {}
        for ref, ds in dests.values():
            by_src.setdefault(ref.host, []).append((ref, tuple(sorted(ds))))
        return by_src

    def _pull_sources(self, refs: Mapping[str, Sequence[tuple[StagedRef, tuple[int, ...]]]],
                      hosts: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
        """The resident tablet servers the round's hosts pull staged batches from, or None
        when the round must shuffle them: pulling is off, or a source host that sends a
        batch to another host runs no resident server."""
        if not refs or not self.pull_batches:
            return None
        address = self._addresses()
        for src, items in refs.items():
            elsewhere = any(hosts[d] != src for _, dests in items for d in dests)
            if elsewhere and src not in address:
                return None
        return tuple(sorted((h, a) for h, a in address.items() if h in refs))

    def _run_with_data(self, tasks: list[tuple[HostTask, list[str]]],
                       refs: Mapping[str, Sequence[tuple[StagedRef, tuple[int, ...]]]]
                       ) -> list[list[tuple[str, Any, str]]]:
        """One job: map tasks pinned to the staging hosts emit each batch once per
        destination host; the shuffle has one partition per destination host, zipped with
        the pinned barrier tasks. A zipped partition has no location of its own, so the
        scheduler takes the first parent's: the pinned side, i.e. the destination host."""
        sc = self._sc
        source = pinned_rdd(sc, [(tuple(items), [src]) for src, items in sorted(refs.items())])
        # One element per partition on both sides, with serializers pyspark's zip accepts
        # as they are: it then zips the JVM RDDs directly instead of re-serializing both
        # sides in two more Python workers per task (each a process start under load).
        shuffled = (source.flatMap(emit_staged)
                    .partitionBy(len(tasks), destination)
                    .mapPartitions(land)
                    ._reserialize(BatchedSerializer(CPickleSerializer(), 1)))  # type: ignore[no-untyped-call]
        out: list[list[tuple[str, Any, str]]] = (
            pinned_rdd(sc, tasks).zip(shuffled).barrier()
            .mapPartitions(barrier_with_data).collect())
        return out
