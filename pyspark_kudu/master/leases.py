"""Tablet leadership leases: which client leads each tablet's writes, so the others forward.

A tablet's Raft leader state machine lives in a *client's* driver (DESIGN §3), so two
clients writing one tablet would each elect themselves and fence the other by term, every
write: correct (terms fence), but half the writes fail and a config change (a tablet copy
that takes seconds) may never finish while another client keeps writing. Kudu has one leader
per tablet that every client sends its writes to; here the master grants a *lease* per
tablet to one client (its id and the endpoint of its session service, where others forward
their writes, reads and replication actions,
:mod:`pyspark_kudu.spark.replication.lease_keeper`), and the holder keeps renewing it while it
lives.

Leases are a liveness aid, never a safety mechanism: they live in the leader master's
memory only (a new leader master starts with none, and two clients may then both lead for a
moment: Raft terms still fence the older one), and a client whose lease lapsed but who still
writes as leader is fenced by the next holder's election like any stale leader.

Thread-safety: not thread-safe; the master service calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_LEASE_S", "Lease", "LeaseTable"]

MAX_LEASE_S = 300.0  # a longer lease would leave a crashed client's tablets leaderless too long


@dataclass(frozen=True)
class Lease:
    """``client`` leads the tablet until ``expires`` (master clock); ``endpoint`` is where
    other clients forward to (opaque to the master)."""

    client: str
    endpoint: Mapping[str, Any]
    expires: float
    #: No other client held the tablet's lease since ``client`` last did (as far as this
    #: leader master knows): a leader the client kept from then was fenced by no one, so it
    #: may go on leading without an election (terms still fence if that was wrong).
    continued: bool = False


class LeaseTable:
    """The leases of one leader master."""

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._last: dict[str, str] = {}  # tablet -> the client of its latest lease

    def acquire(self, client: str, endpoint: Mapping[str, Any], tablet_ids: Iterable[str],
                ttl_s: float, now: float) -> dict[str, Lease]:
        """Grant or renew ``client``'s lease on each tablet that has no live lease of another
        client; returns every tablet's current lease (another client's where it holds one).
        A grant is ``continued`` when the tablet's previous lease was this client's too
        (renewed, or lapsed or released with no one taking it since)."""
        ttl = min(max(ttl_s, 0.0), MAX_LEASE_S)
        out: dict[str, Lease] = {}
        for tid in tablet_ids:
            cur = self._leases.get(tid)
            if cur is None or cur.client == client or cur.expires <= now:
                continued = self._last.get(tid) == client
                cur = self._leases[tid] = Lease(client, dict(endpoint), now + ttl, continued)
                self._last[tid] = client
            out[tid] = cur
        return out

    def release(self, client: str, tablet_ids: Iterable[str]) -> None:
        """Drop ``client``'s leases on these tablets (another client's are kept)."""
        for tid in tablet_ids:
            cur = self._leases.get(tid)
            if cur is not None and cur.client == client:
                del self._leases[tid]

    def expire(self, now: float) -> None:
        """Forget lapsed leases (bounds the table by the live ones)."""
        for tid in [t for t, lease in self._leases.items() if lease.expires <= now]:
            del self._leases[tid]
