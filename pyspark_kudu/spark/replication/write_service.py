"""Group commit at round level: concurrent writes from one client share replication rounds.

A round costs a Spark stage (~0.1-0.3 s, DESIGN §4) whatever it carries, so a client with
many writer threads must not run one stage per write. :class:`ReplicationService` owns the
client's :class:`~pyspark_kudu.spark.replication.tablet_leader.TabletLeader`s and one round
thread: writers :meth:`~ReplicationService.submit` batches and wait on a future; the round
thread takes
*everything* queued, appends it to the tablets' leaders and replicates all of it with
:func:`~pyspark_kudu.spark.replication.multitablet.replicate` (one stage per round for all
tablets). Writes
that arrive while a round runs ride the next one: the same shape as the WAL's group commit,
one level up.

**Lingering.** Writers that share rounds come back together: when a round ends, each of its
writers prepares its next write (reads its DataFrame, routes and encodes it in this driver)
while the one write that queued during the round is already there. Taking the queue at once
would run that write alone and the others in the round after: rounds of 1 and 15 writes
alternating for 16 writers (measured on the 6-worker cluster, ``benchmarks/replication.py``).
So the round thread counts the *writers* (threads) of the last round and of the writes
queued behind it, and before the next round waits until that many writers have queued
again: while they keep arriving (no gap of ``linger_idle_s``, :data:`DEFAULT_LINGER_IDLE_S`),
at most ``linger_s`` (:data:`DEFAULT_LINGER_S`). Their driver-side work is serialised by the
GIL: 16 writers came back over 0.2-0.3 s, 15-20 ms apart. A lone writer never waits (one
writer was expected and it is there), and after a round that found fewer writers the
expectation drops to what came.

The writers of the *first* round are not known from a previous one: 16 writers starting
together ran a round of the first write alone and the other 15 in the next. A writer that
announced its write (:meth:`ReplicationService.expect_write` with ``writer``: a
``KuduContext`` write does, from the thread that will submit it) less than ``linger_s``
ago and has not submitted it yet is expected too, by any round. Older announcements are not
waited for (a large write's staging job takes seconds; a small write beside it waits at
most ``linger_idle_s``, once, for a writer announced less than ``linger_s`` earlier).

A write's future resolves to its batches' ``(index, term)`` once committed on a majority, or
to the error that stopped its tablet (the other tablets of the round are unaffected).
Before futures resolve, each leader releases the entries of the finished writes from its
driver-side log mirror (:meth:`~pyspark_kudu.spark.replication.tablet_leader.TabletLeader.release`)
and a
leader whose write failed is abandoned, so a writer may remove its staged batches as soon
as its future resolved (:mod:`pyspark_kudu.spark.host.dataplane`).

Thread-safety: thread-safe. ``submit`` may be called from any thread; only the round thread
touches the leaders (they are not thread-safe themselves).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pyspark_kudu.errors import IllegalStateError, KuduError
from pyspark_kudu.spark.replication.multitablet import (
    UncommittedError,
    collect_results,
    replicate,
    run_round,
)
from pyspark_kudu.spark.replication.peer_transport import PeerTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader
from pyspark_kudu.spark.replication.write_summary import WriteProgress, WriteSummary
from pyspark_kudu.tablet import WriteResult

__all__ = ["DEFAULT_LINGER_IDLE_S", "DEFAULT_LINGER_S", "DEFAULT_SETTLE_DELAY_S",
           "DEFAULT_WRITE_HOLD_S", "ReplicationService", "WriteOutcome", "WriteProgress",
           "WriteSummary"]


WriteOutcome = list[tuple[int, int, WriteResult | None]]
"""Per batch: (index, term, per-row result or None if results were not asked for)."""


DEFAULT_SETTLE_DELAY_S = 2.0
"""Idle time before a commit-only round tells replicas the commit index. A write that
arrives while that round runs waits for it, so it is not short: with 0.5 s, writes one
second apart each waited for one (``benchmarks/replication.py``). Scans do not need it
(they apply what they know is committed, ``replica_apply.catch_up``)."""

DEFAULT_WRITE_HOLD_S = 10.0
"""The longest a write announced as being prepared
(:meth:`ReplicationService.expect_write`) holds the settle round back."""


DEFAULT_LINGER_S = 0.5
"""The longest a round waits for writers expected back (module docstring): about a round of
many tablets on the test cluster (0.4-0.7 s), which those not waited for would need."""

DEFAULT_LINGER_IDLE_S = 0.1
"""A round stops waiting when no expected writer queued for this long (a writer that stopped
writing costs the next round this much, once)."""


@dataclass
class _Write:
    leader: TabletLeader
    batches: tuple[bytes, ...]
    want_results: bool
    future: Future[WriteOutcome] = field(default_factory=Future)
    writer: int = field(default_factory=threading.get_ident)  # the submitting thread


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


class ReplicationService:
    """Runs rounds for queued writes on a background thread until :meth:`close`."""

    def __init__(self, transport: PeerTransport,
                 settle_delay_s: float = DEFAULT_SETTLE_DELAY_S,
                 linger_s: float = DEFAULT_LINGER_S,
                 linger_idle_s: float = DEFAULT_LINGER_IDLE_S) -> None:
        self._transport = transport
        self.settle_delay_s = settle_delay_s
        self.write_hold_s = DEFAULT_WRITE_HOLD_S
        self._settle_at = 0.0  # monotonic time of the next settle round (if unsettled)
        self._hold_until = 0.0  # an announced write holds the settle round until then
        self._preparing: dict[int, float] = {}  # writer -> when it announced (not submitted)
        self.linger_s = linger_s
        self.linger_idle_s = linger_idle_s
        self._expected = 0  # writers the next round waits for (module docstring)
        self.lingered = 0  # rounds that waited for expected writers
        self._queue: list[_Write] = []
        self._calls: list[_Call] = []
        self._cv = threading.Condition()
        self._closed = False
        self.rounds = 0
        self.writes = 0
        self.settle_rounds = 0
        self._thread = threading.Thread(target=self._loop, name="kudu-replication",
                                        daemon=True)
        self._thread.start()

    def submit(self, leader: TabletLeader, batches: Sequence[bytes],
               want_results: bool = False) -> Future[WriteOutcome]:
        """Queue ``batches`` for ``leader``'s tablet; the future resolves once committed
        (and, with ``want_results``, once a replica reported their per-row results)."""
        w = _Write(leader, tuple(batches), want_results)
        with self._cv:
            if self._closed:
                raise IllegalStateError("the replication service is closed")
            self._queue.append(w)
            self._hold_until = 0.0  # the announced write (if this is it) has come
            self._preparing.pop(w.writer, None)
            self._cv.notify()
        return w.future

    def expect_write(self, writer: int | None = None) -> None:
        """A write is being prepared (planned; its rows read, encoded or staged by a Spark
        job) and will be submitted soon: the settle round waits for it, since its round
        carries the commit index anyway, until a write is submitted or
        :meth:`expected_write_ended`, at most :attr:`write_hold_s`. ``writer``: the ident
        of the thread that will :meth:`submit` it, if known; rounds starting less than
        ``linger_s`` after the announcement then wait for it like for a writer of the last
        round (module docstring, "Lingering").

        Without it, a write whose preparation spanned the end of the settle delay found the
        settle round running when it was submitted and waited for it: a ``format("kudu")``
        write stages its rows in a Spark job first (0.3 s for 10,000 rows on the 6-worker
        cluster), so writes about ``settle_delay_s`` apart (a loop writing and doing
        something else for ~1.5 s, a 2 s streaming trigger) met a settle round on half
        their tries (``benchmarks/paced_writes.py``: 9-11 of 18 writes 1.4-2.2 s apart;
        2-5 with this). Any submitted write ends every announced one's hold: with writes
        from several threads the settle round may come sooner than the last announced
        write, never later than ``write_hold_s`` after it."""
        with self._cv:
            now = time.monotonic()
            self._hold_until = now + self.write_hold_s
            if writer is not None:
                self._preparing[writer] = now
                if len(self._preparing) > 1:  # forget writers that never came (bounded)
                    for w, at in list(self._preparing.items()):
                        if now - at > self.write_hold_s:
                            del self._preparing[w]

    def expected_write_ended(self, writer: int | None = None) -> None:
        """The write announced by :meth:`expect_write` (by ``writer``, if given there) was
        submitted or will not be (it failed, or had no rows): the settle round no longer
        waits for it, nor does a round."""
        with self._cv:
            self._hold_until = 0.0
            if writer is not None:
                self._preparing.pop(writer, None)
            self._cv.notify()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on the round thread between rounds (it may drive leaders: membership
        changes, tablet copies); the future resolves to its result or exception."""
        c = _Call(fn)
        with self._cv:
            if self._closed:
                raise IllegalStateError("the replication service is closed")
            self._calls.append(c)
            self._cv.notify()
        return c.future

    def _run_calls(self) -> None:
        with self._cv:
            calls, self._calls = self._calls, []
        for c in calls:
            try:
                c.future.set_result(c.fn())
            except BaseException as e:  # handed to the caller, whatever it is
                c.future.set_exception(e)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    def __enter__(self) -> ReplicationService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        unsettled: set[TabletLeader] = set()
        while True:
            batch: list[_Write] | None
            self._run_calls()
            with self._cv:
                if unsettled:
                    self._wait_to_settle()  # a next write would carry the commit
                if self._calls:
                    continue
                if unsettled and not self._queue and not self._closed:
                    batch = None
                else:
                    while not self._queue and not self._closed and not self._calls:
                        self._cv.wait()
                    if self._calls:
                        continue
                    if not self._queue and self._closed:
                        batch = None
                    else:
                        self._linger()
                        if self._calls:
                            continue
                        batch, self._queue = self._queue, []
            if batch is None and self._closed:
                if unsettled:  # closing: replicas must still learn what committed
                    self._settle(unsettled)
                self._run_calls()
                return
            if batch is None:
                self._settle(unsettled)
                unsettled = set()
                continue
            self._run(batch)
            unsettled |= {w.leader for w in batch}
            with self._cv:
                self._expected = len({w.writer for w in batch} |
                                     {w.writer for w in self._queue})
                self._settle_at = time.monotonic() + self.settle_delay_s

    def _wait_to_settle(self) -> None:
        """With the lock held: wait until the settle round is due (``settle_delay_s`` after
        the last round, and no announced write holds it, :meth:`expect_write`), or until
        something else is to be done."""
        while not self._queue and not self._closed and not self._calls:
            left = max(self._settle_at, self._hold_until) - time.monotonic()
            if left <= 0:
                return
            self._cv.wait(left)

    def _awaited(self) -> tuple[int, int]:
        """With the lock held: how many writers have queued, and how many the next round
        waits for: as many as the last round had with those queued behind it, or the
        queued ones and those that announced a write less than ``linger_s`` ago, whichever
        is more (module docstring)."""
        queued = {w.writer for w in self._queue}
        now = time.monotonic()
        fresh = {w for w, at in self._preparing.items() if now - at <= self.linger_s}
        return len(queued), max(self._expected, len(queued | fresh))

    def _linger(self) -> None:
        """With the lock held and writes queued: wait until every writer expected
        (:meth:`_awaited`) queued, while they keep coming (module docstring)."""
        arrived, expected = self._awaited()
        if self.linger_s <= 0 or arrived >= expected:
            return
        self.lingered += 1
        now = time.monotonic()
        deadline, idle = now + self.linger_s, now + self.linger_idle_s
        while arrived < expected and not self._closed and not self._calls:
            left = min(deadline, idle) - time.monotonic()
            if left <= 0:
                return
            self._cv.wait(left)
            count, expected = self._awaited()
            if count > arrived:
                arrived, idle = count, time.monotonic() + self.linger_idle_s

    def _settle(self, leaders: set[TabletLeader]) -> None:
        """After ``settle_delay_s`` without writes: one commit-only round, so that replicas
        learn the new commit index and apply it (a write returns once *committed*; applying
        is what makes replicas' own tablets current for scans). A write arriving sooner
        carries the commit index itself. Results nobody asked for are dropped."""
        live = [lead for lead in leaders if lead.node is not None]
        for lead in live:
            assert lead.node is not None
            lead.node.broadcast_heartbeat()
        try:
            errors = run_round(self._transport, live) if live else {}
        except KuduError:
            errors = {}
        self.settle_rounds += 1
        for lead in live:
            if lead in errors:
                lead.abandon(str(errors[lead]))
            elif lead.node is not None:
                # Every proposed entry belongs to a finished write now: release what the
                # round's apply made releasable (``_run`` could only go as far as applied).
                lead.release(lead.node.commit_index)
            lead.drop_results()

    def _run(self, writes: list[_Write]) -> None:
        per_leader: dict[TabletLeader, list[_Write]] = {}
        for w in writes:
            per_leader.setdefault(w.leader, []).append(w)
        proposals = {lead: [b for w in ws for b in w.batches] for lead, ws in per_leader.items()}
        self.rounds += 1
        self.writes += len(writes)
        try:
            results = replicate(self._transport, proposals)
        except KuduError as e:  # a failure of the whole call fails every write in it
            for w in writes:
                w.future.set_exception(e)
            return
        wanted: dict[TabletLeader, list[int]] = {}
        for lead, ws in per_leader.items():
            res = results[lead]
            if isinstance(res, Exception):
                continue
            offset = 0
            for w in ws:
                if w.want_results:
                    wanted.setdefault(lead, []).extend(
                        i for i, _ in res[offset:offset + len(w.batches)])
                offset += len(w.batches)
        row_results = collect_results(self._transport, wanted) if wanted else {}
        for lead in per_leader:
            res = results[lead]
            if isinstance(res, Exception):
                lead.abandon(str(res))
            elif res:
                lead.release(max(i for i, _ in res))
        for lead, ws in per_leader.items():
            res = results[lead]
            per_row = row_results.get(lead, {})
            offset = 0
            for w in ws:
                if isinstance(res, UncommittedError):  # each write gets its batches' part
                    w.future.set_exception(res.part(offset, len(w.batches)))
                elif isinstance(res, Exception):
                    w.future.set_exception(res)
                elif w.want_results and isinstance(per_row, Exception):
                    w.future.set_exception(per_row)
                else:
                    mine = res[offset:offset + len(w.batches)]
                    got = per_row if isinstance(per_row, dict) else {}
                    w.future.set_result([(i, t, got.get(i)) for i, t in mine])
                offset += len(w.batches)
