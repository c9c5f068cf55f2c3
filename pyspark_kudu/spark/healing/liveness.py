"""Tablet-server liveness, reported to the master by the driver (there are no daemons).

A tablet server is alive while its host has an executor of this application: the driver
knows that from the block manager (:func:`~pyspark_kudu.spark.pinned.executor_hosts`).
:class:`LivenessReporter` heartbeats, every ``interval_s``, each tablet server whose host
has an executor, to every master (through
:class:`~pyspark_kudu.master.heartbeater.TabletServerHeartbeater`, so a new master leader
gets full reports). A server whose executor is gone is simply not heartbeated: the master
sees it go quiet, which is what its failure detection and re-replication act on. Each
heartbeat also carries this driver's round-trip estimate to the server's host, when its
replication rounds have one (``round_trips``, :mod:`~pyspark_kudu.spark.replication.latency`),
for ``cluster ksck``. ``on_lost`` is told, once, of the tablet servers whose executors were
heartbeated last time and are gone now (the client fails over the tablets it led from them,
``_servers_lost`` in ``spark/api/tablet_servers``); ``on_found`` of those heartbeated now
and not last time (a host whose executor came back; not on the first beat): the client
looks up their new resident servers at once (``_servers_found``). Neither may block.

Known limit: tablet servers are discovered when the ``KuduContext`` starts; an executor
host that appears later is not registered until a new context starts.

Thread-safety: one daemon thread; ``stop`` may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from pyspark_kudu.errors import KuduError
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.heartbeater import TabletServerHeartbeater
from pyspark_kudu.spark.replication.latency import RoundTrip

__all__ = ["LivenessReporter"]

_log = logging.getLogger(__name__)


class LivenessReporter:
    """Heartbeats the tablet servers whose hosts ``live_hosts()`` names."""

    def __init__(self, client: MasterClient, servers: Sequence[TServerMeta],
                 live_hosts: Callable[[], set[str]], interval_s: float = 1.0,
                 round_trips: Callable[[], Mapping[str, RoundTrip]] | None = None,
                 on_lost: Callable[[set[str]], None] | None = None,
                 on_found: Callable[[set[str]], None] | None = None) -> None:
        self._beaters = [TabletServerHeartbeater(client, s, interval_s=interval_s)
                         for s in servers]
        self._live_hosts = live_hosts
        self._round_trips = round_trips or dict
        self._on_lost = on_lost
        self._on_found = on_found
        self.interval_s = interval_s
        self.rounds = 0
        self.last_live: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="kudu-tserver-liveness")

    def start(self) -> LivenessReporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def update(self, server: TServerMeta) -> None:
        """Heartbeat ``server`` (a new registration of a known uuid: its tablet server's
        address changed) from now on."""
        for b in self._beaters:
            if b.tserver.uuid == server.uuid:
                b.tserver = server

    def beat_once(self) -> set[str]:
        """One round; returns the UUIDs of the tablet servers heartbeated."""
        hosts = self._live_hosts()
        rtt = self._round_trips()
        beaten = set()
        for b in self._beaters:
            if b.tserver.host in hosts:
                est = rtt.get(b.tserver.host)
                b.round_trip = None if est is None else est.to_dict()
                b.heartbeat_once()
                beaten.add(b.tserver.uuid)
        first = self.rounds == 0
        self.rounds += 1
        lost, found = self.last_live - beaten, beaten - self.last_live
        self.last_live = beaten
        if lost and self._on_lost is not None:
            self._on_lost(lost)
        if found and not first and self._on_found is not None:
            self._on_found(found)
        return beaten

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat_once()
            except KuduError as e:
                _log.warning("tablet-server heartbeats failed: %s", e)
            except Exception as e:  # the SparkContext may be stopping under us
                _log.debug("tablet-server liveness round failed: %s", e)
