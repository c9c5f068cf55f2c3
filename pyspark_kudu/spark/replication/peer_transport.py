"""Replication rounds' transport contract, its errors, and the in-process transport.

:class:`PeerTransport` runs one round (requests per tablet server in, responses out);
:func:`run_with_retries` runs one, retrying without the servers that became unreachable.
:class:`DirectTransport` calls the replica handlers in this process, one data root per tablet
server (staged batches are read straight from their files): it is what unit tests and
single-process tools use, and the reference the Spark transport (a barrier stage of pinned
tasks, :mod:`pyspark_kudu.spark.replication.spark_rounds`) must match.

Thread-safety: ``DirectTransport`` may be shared; per-replica exclusion is the replica lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from pyspark_kudu.spark.host.copy_fetch import ServedCopy, prefetch_served
from pyspark_kudu.spark.host.dataplane import StagedBatches, refs_of
from pyspark_kudu.spark.host.handlers import (
    PeerRequest,
    PeerResponse,
    handle_requests,
    tablet_dir,
)
from pyspark_kudu.wal import WalOptions

__all__ = [
    "MAX_ROUNDS",
    "MAX_ROUND_ATTEMPTS",
    "DirectTransport",
    "PeerTransport",
    "run_with_retries",
]

MAX_ROUND_ATTEMPTS = 3  # a round failed as a whole is tried this often, skipping lost servers
MAX_ROUNDS = 8  # rounds a leader runs to get one thing done (a commit, results, a quiet node)


class PeerTransport(Protocol):
    """Runs one round: requests per tablet server in, responses per tablet server out.

    A tablet server whose task failed maps to ``None``. ``unreachable()`` names the tablet
    servers the transport knows cannot run a task now (their host has no executor).

    Optionally, ``prefetch_copy(ts, tablet_id, manifest, index)`` has tablet server ``ts``
    start fetching a served tablet copy before the round that installs it (best effort,
    returns at once; :meth:`SparkTransport.prefetch_copy
    <pyspark_kudu.spark.replication.spark_rounds.SparkTransport.prefetch_copy>`). A
    transport without it installs copies with the fetch inside the install round.
    """

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]) -> dict[
        str, list[PeerResponse] | None
    ]: ...

    def unreachable(self) -> set[str]: ...



def run_with_retries(transport: PeerTransport, reqs: Mapping[str, Sequence[PeerRequest]]
                      ) -> dict[str, list[PeerResponse] | None]:
    """Run a round; when the stage fails as a whole, retry without unreachable servers."""
    out: dict[str, list[PeerResponse] | None] = {}
    for _ in range(MAX_ROUND_ATTEMPTS):
        skip = transport.unreachable()
        live = {ts: rs for ts, rs in reqs.items() if ts not in skip}
        if not live:
            return {}
        out = transport.run(live)
        if any(v is not None for v in out.values()):
            return out
    return out




class DirectTransport:
    """Runs every tablet server's requests in this process. ``down`` simulates dead hosts.
    With ``prefetch`` on, ``prefetch_copy`` fetches a served copy at once, in this process,
    as a resident server would in the background (``prefetched`` records each)."""

    def __init__(self, roots: Mapping[str, str], options: WalOptions | None = None) -> None:
        self.roots = dict(roots)
        self.options = options
        self.down: set[str] = set()
        self.rounds = 0
        self.prefetch = False
        self.prefetched: list[tuple[str, str, int]] = []

    def prefetch_copy(self, ts: str, tablet_id: str, manifest: bytes, index: int) -> None:
        copy = ServedCopy.decode(manifest)
        if not self.prefetch or ts in self.down or copy is None:
            return
        self.prefetched.append((ts, tablet_id, index))
        prefetch_served(tablet_dir(self.roots[ts], tablet_id), copy).join()

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]) -> dict[
        str, list[PeerResponse] | None
    ]:
        self.rounds += 1
        out: dict[str, list[PeerResponse] | None] = {}
        for ts, reqs in requests.items():
            if ts in self.down:
                out[ts] = None
                continue
            out[ts] = handle_requests(self.roots[ts], reqs, host=ts, options=self.options,
                                      delivered=StagedBatches(refs_of(reqs)))
        return out

    def unreachable(self) -> set[str]:
        return set(self.down)
