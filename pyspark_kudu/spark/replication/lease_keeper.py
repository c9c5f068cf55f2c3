"""One client's side of tablet leadership leases (:mod:`pyspark_kudu.master.leases`).

Before leading a tablet (electing itself, proposing, changing its config) a client asks the
master for the tablet's lease: granted, it leads as before; held by another live client, it
*forwards* the work to that client's session service (``lead_commit``, ``lead_read``,
``lead_heal``, :mod:`~pyspark_kudu.spark.api.session_service`) instead of electing itself and
fencing the holder. So two writers of one tablet share one leader, as Kudu's clients share the
tablet server that leads
it, and a long config change (a tablet copy) is not fenced by another client's next write.

A lease this client holds is trusted without asking the master again while at least a
third of it is left, counted from *before* the request that granted or renewed it (so this
client stops trusting it before the master, which counts from when it received the
request, can grant it to another): routing a write costs no master request then.

The keeper renews, every third of the lease, the leases of tablets used in the last
``idle_s`` (or in use now); an idle tablet's lease is left to lapse so that a client that
stopped writing does not stay every other client's leader. When the client takes such a
lease back and the master says no other client held it meanwhile (``continued``), the
leader it kept goes on without an election: measured at 50M rows, a 1-row write to a
tablet idle for over ``idle_s`` (2 minutes by default) took 13-16 s, six rounds, instead of
0.6-0.9 s. :meth:`close` releases them all
(another client takes over at once), and leases stop being renewed once ``alive()`` says
the client can no longer lead (its SparkContext stopped without the context being closed),
so they lapse. If the master cannot be asked, the client leads the tablet itself: terms
still fence (the behaviour without leases).

Thread-safety: thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pyspark_kudu.errors import KuduError
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.spark.replication.session_client import SessionAddress

__all__ = ["DEFAULT_LEASE_S", "LEASE_CONF", "LeaseKeeper", "by_holder"]

_log = logging.getLogger(__name__)

LEASE_CONF = "spark.kudu.leaderLeaseSec"
DEFAULT_LEASE_S = 10.0


class LeaseKeeper:
    """Acquires, renews and releases one client's tablet leases; ``ttl_s`` 0 turns leases
    off (every tablet is led by this client, as without a lease table)."""

    def __init__(self, master: MasterClient, client_id: str, endpoint: SessionAddress,
                 ttl_s: float = DEFAULT_LEASE_S, idle_s: float | None = None,
                 alive: Callable[[], bool] = lambda: True) -> None:
        self.master = master
        self.alive = alive
        self.client_id = client_id
        self.endpoint = endpoint
        self.ttl_s = ttl_s
        self.idle_s = idle_s if idle_s is not None else 12 * ttl_s
        self._lock = threading.Lock()
        self._last_used: dict[str, float] = {}  # held tablets -> when last routed
        self._valid_until: dict[str, float] = {}  # held tablets -> trusted until (monotonic)
        self._busy: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if ttl_s > 0:
            self._thread = threading.Thread(target=self._run, name="kudu-leases", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def route(self, tablet_ids: Sequence[str], continued: set[str] | None = None
              ) -> dict[str, SessionAddress | None]:
        """Each tablet's leader client: None for this client (the lease is now held),
        else the session service of the client that holds it. ``continued``: gets the
        tablets whose lease this client got back with no other client holding it since
        it last did (the master's ``continued``): a leader kept from before may go on."""
        if not self.enabled or not tablet_ids:
            return dict.fromkeys(tablet_ids)
        sent = time.monotonic()
        with self._lock:
            if all(self._valid_until.get(t, 0.0) > sent + self.ttl_s / 3 for t in tablet_ids):
                for tid in tablet_ids:
                    self._last_used[tid] = sent
                return dict.fromkeys(tablet_ids)
        try:
            got = self.master.tablet_lease(self.client_id, tablet_ids, ttl_s=self.ttl_s,
                                           endpoint=self.endpoint.public_dict())
        except KuduError as e:  # no master to ask: lead ourselves, terms still fence
            _log.warning("could not ask the master for the leases of %d tablets (%s): "
                         "leading them without one", len(tablet_ids), e)
            now = time.monotonic()
            with self._lock:  # as if held: renewal asks again once the master is back
                for tid in tablet_ids:
                    self._last_used[tid] = now
            return dict.fromkeys(tablet_ids)
        now = time.monotonic()
        out: dict[str, SessionAddress | None] = {}
        with self._lock:
            for tid in tablet_ids:
                lease = got.get(tid)
                if lease is None or lease["client"] == self.client_id:
                    self._last_used[tid] = now
                    self._trust(tid, lease, sent)
                    out[tid] = None
                    if continued is not None and lease is not None and lease.get("continued"):
                        continued.add(tid)
                else:
                    self._drop(tid)
                    # The master never learns a secret: call the holder with this
                    # application's own credential (it must share it to forward).
                    out[tid] = SessionAddress.from_dict(
                        {**lease["endpoint"], "secret": self.endpoint.secret})
        return out

    def _trust(self, tid: str, lease: dict[str, Any] | None, sent: float) -> None:
        if lease is None:
            self._valid_until.pop(tid, None)
        else:
            self._valid_until[tid] = sent + min(self.ttl_s, float(lease["expires_in_s"]))

    def _drop(self, tid: str) -> None:
        self._last_used.pop(tid, None)
        self._valid_until.pop(tid, None)

    @contextlib.contextmanager
    def using(self, tablet_ids: Sequence[str]) -> Iterator[None]:
        """Keep renewing these tablets' leases while the block runs, however long."""
        with self._lock:
            for tid in tablet_ids:
                self._busy[tid] = self._busy.get(tid, 0) + 1
        try:
            yield
        finally:
            now = time.monotonic()
            with self._lock:
                for tid in tablet_ids:
                    self._busy[tid] -= 1
                    if not self._busy[tid]:
                        del self._busy[tid]
                    if tid in self._last_used:
                        self._last_used[tid] = now

    def distrust(self, tablet_id: str) -> None:
        """Ask the master again on the next :meth:`route` (e.g. this client was fenced: a
        new leader master may have granted the tablet to another client)."""
        with self._lock:
            self._valid_until.pop(tablet_id, None)

    def holds(self, tablet_id: str) -> bool:
        """Whether this client leads the tablet as far as it knows: it was granted the lease
        (or could not ask the master) and has not seen another client take it since."""
        with self._lock:
            return tablet_id in self._last_used

    def _renew(self) -> None:
        if not self.alive():  # cannot lead any more: let every lease lapse
            with self._lock:
                self._last_used.clear()
                self._valid_until.clear()
            return
        now = time.monotonic()
        with self._lock:
            keep = [t for t, used in self._last_used.items()
                    if t in self._busy or now - used < self.idle_s]
            idle = [t for t in self._last_used if t not in keep]
            for t in idle:
                self._drop(t)
        if idle:
            with contextlib.suppress(KuduError):
                self.master.tablet_lease(self.client_id, idle, release=True)
        if not keep:
            return
        sent = time.monotonic()
        try:
            got = self.master.tablet_lease(self.client_id, keep, ttl_s=self.ttl_s,
                                           endpoint=self.endpoint.public_dict())
        except KuduError as e:  # the next route() asks again
            _log.info("renewing %d tablet leases failed: %s", len(keep), e)
            return
        with self._lock:
            for tid in keep:
                lease = got.get(tid)
                if lease is not None and lease["client"] != self.client_id:
                    self._drop(tid)  # lapsed and taken: the holder leads
                elif tid in self._last_used:
                    self._trust(tid, lease, sent)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._renew()
            except Exception:  # never let the keeper die: leases would lapse mid-copy
                _log.exception("tablet lease renewal failed")

    def close(self) -> None:
        """Stop renewing and release every held lease (other clients take over at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            held = list(self._last_used)
            self._last_used.clear()
            self._valid_until.clear()
        if held:
            with contextlib.suppress(KuduError):
                self.master.tablet_lease(self.client_id, held, release=True, timeout_s=5.0)


def by_holder(remote: Mapping[str, SessionAddress]) -> dict[SessionAddress, list[str]]:
    """The tablets of ``remote`` (tablet -> holder, as :meth:`LeaseKeeper.route` answers)
    grouped by holder: one forwarded call per holder."""
    out: dict[SessionAddress, list[str]] = {}
    for tid, addr in remote.items():
        out.setdefault(addr, []).append(tid)
    return out
