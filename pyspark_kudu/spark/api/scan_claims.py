"""Which tablet each task of a ``format("kudu")`` scan reads, chosen on the host it runs on.

A Python data source's partitions have no preferred locations (Spark 4's
``InputPartition`` carries none), so Spark runs the task of tablet ``i`` on whichever
executor is free, and on a 6-host RF=3 table half the tasks land where their tablet has no
replica: their rows are then streamed by another host's tablet server, which decodes them
for the task (:mod:`~pyspark_kudu.spark.host.shared_scan` explains what that costs).

So the planner registers the scan's tokens with the session service, and each task asks,
once it runs, for a tablet: the service hands out every tablet exactly once, preferring one
with a replica on the asking task's host (:meth:`ScanClaims.claim`). Each task still reads
exactly one tablet and the tablets are covered exactly once, as with a fixed assignment. A
task asking again for the same partition (Spark's retry or a speculative copy) gets the
tablet given the first time, so a retry never reads another tablet.

Registrations are kept for :data:`KEEP_S` seconds, and at most :data:`KEEP_TOKENS` tokens
in all (~1.4 KB each; the oldest scans are dropped first): a task of a scan dropped
meanwhile (e.g. a cached DataFrame recomputing a lost partition a day later) fails with
``NotFoundError`` naming the scan, rather than read a tablet another task read.

Thread-safety: :class:`ScanClaims` is safe to call from the service's threads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError

__all__ = ["KEEP_S", "KEEP_TOKENS", "ScanClaims"]

#: Seconds a scan's registration is kept (its tasks must have asked by then).
KEEP_S = 24 * 3600.0
#: Tokens of all registrations kept at most (the oldest scans are dropped first).
KEEP_TOKENS = 100_000


@dataclass
class _Scan:
    hosts: tuple[frozenset[str], ...]  # per tablet: its replicas' hosts
    tokens: tuple[str, ...]
    at: float
    given: dict[int, int] = field(default_factory=dict)  # partition -> tablet
    taken: set[int] = field(default_factory=set)


class ScanClaims:
    """The session service's registry of ``format("kudu")`` scans (module docstring)."""

    def __init__(self, keep_s: float = KEEP_S, keep_tokens: int = KEEP_TOKENS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keep_s = keep_s
        self._keep_tokens = keep_tokens
        self._tokens = 0
        self._lock = threading.Lock()
        self._scans: OrderedDict[str, _Scan] = OrderedDict()

    def register(self, scan_id: str, hosts: Sequence[Sequence[str]],
                 tokens: Sequence[str]) -> None:
        """Register a scan: per tablet, its replicas' hosts and its (opaque) token."""
        if len(hosts) != len(tokens) or not tokens:
            raise InvalidArgumentError(
                f"scan {scan_id}: {len(hosts)} host lists for {len(tokens)} tokens")
        now = self._clock()
        with self._lock:
            if scan_id in self._scans:
                raise InvalidArgumentError(f"scan {scan_id} is registered already")
            self._scans[scan_id] = _Scan(tuple(frozenset(h) for h in hosts), tuple(tokens), now)
            self._tokens += len(tokens)
            while len(self._scans) > 1:  # the new one stays, whatever its size
                oldest = next(iter(self._scans.values()))
                if self._tokens <= self._keep_tokens and now - oldest.at <= self._keep_s:
                    break
                self._scans.popitem(last=False)
                self._tokens -= len(oldest.tokens)

    def claim(self, scan_id: str, part: int, host: str) -> tuple[int, str]:
        """The tablet partition ``part`` of ``scan_id`` reads, asked from ``host``: the one
        given to ``part`` before, else an unread one with a replica on ``host`` (``part``'s
        own first), else ``part``'s own if unread, else any unread one. Returns its index
        and token.

        Raises:
            NotFoundError: the scan is not (or no longer) registered.
            InvalidArgumentError: ``part`` is not one of the scan's partitions.
        """
        with self._lock:
            scan = self._scans.get(scan_id)
            if scan is None:
                raise NotFoundError(
                    f"format('kudu') scan {scan_id} is not registered with this session (it "
                    f"was planned more than {self._keep_s:.0f} s ago, or scans of more than "
                    f"{self._keep_tokens} tablets were planned since): run the query again")
            n = len(scan.tokens)
            if not 0 <= part < n:
                raise InvalidArgumentError(f"scan {scan_id} has partitions 0..{n - 1}, not {part}")
            j = scan.given.get(part)
            if j is None:
                j = self._choose(scan, part, host)
                scan.given[part] = j
                scan.taken.add(j)
            return j, scan.tokens[j]

    @staticmethod
    def _choose(scan: _Scan, part: int, host: str) -> int:
        free = [j for j in range(len(scan.tokens)) if j not in scan.taken]
        local = [j for j in free if host in scan.hosts[j]]
        if part in local:
            return part
        if local:
            return local[0]
        return part if part in free else free[0]

    def given(self, scan_id: str) -> dict[int, int]:
        """Which tablet each partition of ``scan_id`` that asked was given (empty if the
        scan is not registered)."""
        with self._lock:
            scan = self._scans.get(scan_id)
            return dict(scan.given) if scan is not None else {}

    def scan_ids(self) -> list[str]:
        """The registered scans, oldest first."""
        with self._lock:
            return list(self._scans)

    def __len__(self) -> int:
        with self._lock:
            return len(self._scans)
