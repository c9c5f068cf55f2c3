"""Shared rounds: several threads each driving one tablet's leader, one stage per round.

Membership changes and tablet copies
(:meth:`~pyspark_kudu.spark.replication.tablet_leader.TabletLeader.add_replica`) are written as
straight-line code per tablet: propose, run a round, look at the answers, run
the next. Healing several tablets at once with one thread each would make every thread's
round its own Spark job (~0.3 s of scheduling each, DESIGN §4), and on a small cluster the
jobs compete rather than overlap.

:class:`SharedRounds` is a :class:`~pyspark_kudu.spark.replication.peer_transport.PeerTransport`
for a fixed
party of such threads. A thread's ``run`` waits until every party member still working has
asked for its next round (or left, :meth:`SharedRounds.leave`); the last one to arrive runs
all their requests as ONE round of the underlying transport (requests for the same tablet
server are concatenated in one task, as
:func:`~pyspark_kudu.spark.replication.multitablet.run_round` does
for write rounds) and hands each thread its own responses. Tablets therefore advance in
lock-step: healing N tablets costs about as many stages as healing one.

A member must only block in ``run`` (or leave): one that waited on something a fellow member
does would deadlock the party. Healing threads only run rounds, so that holds.

Thread-safety: the point of the class; ``run`` and ``leave`` may be called from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse
from pyspark_kudu.spark.replication.peer_transport import PeerTransport

__all__ = ["SharedRounds"]

_Out = dict[str, list[PeerResponse] | None]


@dataclass
class _Slot:
    requests: Mapping[str, Sequence[PeerRequest]]
    result: _Out = field(default_factory=dict)
    error: BaseException | None = None
    done: bool = False


class SharedRounds:
    """Merges the rounds of ``parties`` threads into one call of ``inner`` per round."""

    def __init__(self, inner: PeerTransport, parties: int) -> None:
        if parties < 1:
            raise ValueError(f"a party needs at least one member, not {parties}")
        self._inner = inner
        self._active = parties
        self._waiting: list[_Slot] = []
        self._cond = threading.Condition()
        self.rounds = 0  # merged rounds run
        self.requests = 0  # member rounds they carried

    def unreachable(self) -> set[str]:
        return self._inner.unreachable()

    def prefetch_copy(self, ts: str, tablet_id: str, manifest: bytes, index: int) -> None:
        """The inner transport's, if it prefetches copies (see ``PeerTransport``)."""
        prefetch = getattr(self._inner, "prefetch_copy", None)
        if prefetch is not None:
            prefetch(ts, tablet_id, manifest, index)

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]) -> _Out:
        if not requests:
            return {}
        slot = _Slot(requests)
        with self._cond:
            if self._active <= 0:
                raise RuntimeError("SharedRounds.run called by a member that has left")
            self._waiting.append(slot)
            batch = self._take_if_complete()
            while batch is None and not slot.done:
                self._cond.wait()
                batch = self._take_if_complete()
        if batch is not None:
            self._execute(batch)
        with self._cond:
            while not slot.done:
                self._cond.wait()
        if slot.error is not None:
            raise slot.error
        return slot.result

    def leave(self) -> None:
        """A member is done: the others no longer wait for its next round."""
        with self._cond:
            self._active -= 1
            batch = self._take_if_complete()
        if batch is not None:
            self._execute(batch)

    def _take_if_complete(self) -> list[_Slot] | None:
        """(Lock held.) Every active member is waiting: take their requests."""
        if not self._waiting or len(self._waiting) < self._active:
            return None
        batch, self._waiting = self._waiting, []
        return batch

    def _execute(self, batch: list[_Slot]) -> None:
        merged: dict[str, list[PeerRequest]] = {}
        spans: list[list[tuple[str, int, int]]] = []  # per slot: (ts, start, count)
        for slot in batch:
            mine = []
            for ts, reqs in slot.requests.items():
                lst = merged.setdefault(ts, [])
                mine.append((ts, len(lst), len(reqs)))
                lst.extend(reqs)
            spans.append(mine)
        error: BaseException | None = None
        out: _Out = {}
        try:
            out = self._inner.run(merged)
        except BaseException as e:  # every member must wake up and see it
            error = e
        with self._cond:
            self.rounds += 1
            self.requests += len(batch)
            for slot, mine in zip(batch, spans, strict=True):
                if error is not None:
                    slot.error = error
                else:
                    for ts, start, count in mine:
                        resps = out.get(ts)
                        slot.result[ts] = None if resps is None else list(
                            resps[start:start + count])
                slot.done = True
            self._cond.notify_all()
