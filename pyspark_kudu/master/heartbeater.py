"""A tablet server's heartbeats to the master group (seed: kudu-multi-master, the plan).

- Heartbeat to *every* master, not only the leader: followers keep the server's liveness
  warm, so a newly elected leader can place replicas at once (KUDU-1358).
- Reports are edge-triggered (``reports(full=False)`` returns only what changed), except
  that a master which is leader for the first time in our eyes (new address or new term), or
  which says ``needs_full_report``, gets a *full* report right away -- that is what lets a
  new leader re-drive work its predecessor left unfinished (KUDU-1374). The leader's answer
  carries the actions (see :mod:`pyspark_kudu.master.redrive`), handed to ``on_actions``.

In this project tablet servers have no daemons: the process that owns the tablet servers'
state (the driver) runs one heartbeater per server.

Thread-safety: :meth:`heartbeat_once` must not run concurrently with itself; ``start`` runs
it on a daemon thread every ``interval_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pyspark_kudu.errors import KuduError, UsageError
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.entities import TServerMeta

__all__ = ["TabletServerHeartbeater"]

_log = logging.getLogger(__name__)
Body = dict[str, Any]


class TabletServerHeartbeater:
    """Heartbeats one tablet server to all masters; see the module rules."""

    def __init__(
        self,
        client: MasterClient,
        tserver: TServerMeta,
        *,
        reports: Callable[[bool], list[Body]] | None = None,
        on_actions: Callable[[list[Body]], None] | None = None,
        interval_s: float = 1.0,
        rpc_timeout_s: float = 2.0,
    ) -> None:
        self.client = client
        self.tserver = tserver
        # The sender's round-trip estimate to the server's host, sent with every heartbeat
        # when set (``MasterClient.heartbeat_to``); the owner updates it between heartbeats.
        self.round_trip: Body | None = None
        self._reports = reports or (lambda full: [])
        self._on_actions = on_actions or (lambda actions: None)
        self.interval_s = interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.leader: tuple[str, int] | None = None  # (address, term) we last saw leading
        self.full_reports_sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def heartbeat_once(self) -> list[Body]:
        """One round to every master; returns the leader's actions (empty if none answered)."""
        incremental = self._reports(False)
        actions: list[Body] = []
        for addr in self.client.addresses:
            try:
                out = self.client.heartbeat_to(addr, self.tserver, incremental,
                                               timeout_s=self.rpc_timeout_s,
                                               round_trip=self.round_trip)
                if out.get("leader"):
                    new = (addr, int(out.get("term", 0)))
                    if new != self.leader or out.get("needs_full_report"):
                        self.leader = new
                        out = self.client.heartbeat_to(addr, self.tserver, self._reports(True),
                                                       full=True, timeout_s=self.rpc_timeout_s,
                                                       round_trip=self.round_trip)
                        self.full_reports_sent += 1
                    actions = list(out.get("actions", []))
            except UsageError:
                raise
            except KuduError as e:
                _log.debug("heartbeat of %s to %s failed: %s", self.tserver.uuid, addr, e)
        if actions:
            self._on_actions(actions)
        return actions

    def start(self) -> TabletServerHeartbeater:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"heartbeat-{self.tserver.uuid}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.heartbeat_once()
            except KuduError:
                _log.warning("heartbeats of %s failed", self.tserver.uuid, exc_info=True)
            self._stop.wait(self.interval_s)
