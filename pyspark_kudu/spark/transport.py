"""Transports that run replication rounds (see :class:`~pyspark_kudu.spark.leader.PeerTransport`).

:class:`DirectTransport` calls the replica handlers in this process, one data root per tablet
server (staged batches are read straight from their files): it is what unit tests and
single-process tools use, and the reference the Spark transport (a barrier stage of pinned
tasks, :mod:`pyspark_kudu.spark.rounds`) must match.

Thread-safety: ``DirectTransport`` may be shared; per-replica exclusion is the replica lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark_kudu.spark.dataplane import read_staged, refs_in
from pyspark_kudu.spark.peer import PeerRequest, PeerResponse, handle_requests
from pyspark_kudu.wal import WalOptions

__all__ = ["DirectTransport"]


class DirectTransport:
    """Runs every tablet server's requests in this process. ``down`` simulates dead hosts."""

    def __init__(self, roots: Mapping[str, str], options: WalOptions | None = None) -> None:
        self.roots = dict(roots)
        self.options = options
        self.down: set[str] = set()
        self.rounds = 0

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]) -> dict[
        str, list[PeerResponse] | None
    ]:
        self.rounds += 1
        out: dict[str, list[PeerResponse] | None] = {}
        for ts, reqs in requests.items():
            if ts in self.down:
                out[ts] = None
                continue
            delivered = {ref.path: data for r in reqs for ref in refs_in(r.messages, r.entries)
                         if (data := read_staged(ref)) is not None}
            out[ts] = handle_requests(self.roots[ts], reqs, host=ts, options=self.options,
                                      delivered=delivered)
        return out

    def unreachable(self) -> set[str]:
        return set(self.down)
