"""Riding through a failed replication round: a tablet's part of a write finishes under a
new leader when its leader replica's host died or the round's stage failed as a whole.

:class:`RideThrough` is a mixin of :class:`~pyspark_kudu.spark.api.writes.WritePath` (the
same shape as the write path itself): :meth:`RideThrough._ride_through` is called for each
tablet whose round raised :class:`~pyspark_kudu.spark.replication.multitablet.UncommittedError`.

Why it is safe (Raft's Log Matching): an entry the failed round appended sits in a new
leader's log at its (index, term) exactly when it can still commit; it then commits with the
next entry that leader commits. An entry missing there can never commit, so proposing its
batch again applies it once (``docs/design.md`` §3.1, "Riding through").

Thread-safety: as the write path: several tablets may ride through at once; leaders are
looked up and dropped under the context's lock.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from pyspark_kudu.errors import KuduError, NotLeaderError, RoundFailedError
from pyspark_kudu.master.client import MasterClient, TableLocations
from pyspark_kudu.spark.host.dataplane import Staged, StagedRef
from pyspark_kudu.spark.replication.multitablet import UncommittedError
from pyspark_kudu.spark.replication.spark_rounds import SparkTransport, TabletServerLocation
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader
from pyspark_kudu.spark.replication.write_service import ReplicationService, WriteOutcome
from pyspark_kudu.tablet import OpType, WriteResult

__all__ = ["MAY_FAIL_PER_ROW", "Restager", "RideThrough"]

_log = logging.getLogger(__name__)

#: The operations that can fail per row (their rounds wait for the replicas' results).
MAY_FAIL_PER_ROW = (int(OpType.INSERT), int(OpType.UPDATE), int(OpType.DELETE))
Restager = Callable[[Sequence[int], int], list[Staged]]
"""Stages some input partitions' rows again for one tablet: (Spark partition ids of the
DataFrame, the tablet's partition index) -> the new batches. :meth:`WritePath.write` gives
one (it has the DataFrame's lineage)."""
_RIDE_RETRY_S = 1.0  # between attempts to finish a tablet's part after a failed round


class RideThrough:
    """The ride-through part of the write path (see the module docstring)."""

    master: MasterClient
    servers: list[TabletServerLocation]
    transport: SparkTransport
    _service: ReplicationService
    _lock: threading.Lock
    _leaders: dict[str, TabletLeader]
    #: How long a tablet's part of a write keeps trying after its round failed (a lost
    #: leader host, a stage aborted by a dying executor) before the write raises.
    ride_through_s: float = 60.0

    #: This client's leader of each tablet (``WritePath._leaders_for``, electing if needed).
    _leaders_for: Callable[[TableLocations, Sequence[str]], dict[str, TabletLeader]]

    def _ride_through(self, table: str, tid: str, staged: Sequence[Staged],
                      err: UncommittedError, restage: Restager | None = None
                      ) -> tuple[list[Staged], WriteOutcome]:
        """Finish a tablet's part of a write whose round failed (its leader replica's host
        died, or the round's stage failed as a whole), within ``ride_through_s``.

        Each attempt elects a leader among the reachable voters and asks which of the
        write's entries its log holds at their index *and* term: those commit with the next
        entry this leader commits; the others can never commit (Log Matching), so they are
        proposed again, or an empty entry is when there is none. Only once that commit
        returned is a batch's outcome settled; a failure before leaves it to the next
        attempt. So each batch is applied exactly once. A write that needs per-row results
        (insert, update, delete) gets those of its held entries from the new leader
        replica, which applies them with the commit (:meth:`_held_results`).

        Batches staged on a host that is gone and not held are staged again by ``restage``
        (from the DataFrame's lineage, :meth:`_restage`) when the write has one. Returns
        the tablet's batches (``staged``, with such replacements) and their outcomes.

        Raises:
            RoundFailedError: no leader could commit for ``ride_through_s`` (the error names
                the tablet, its voters' hosts and the unreachable ones), a batch's staging
                host is gone and it cannot be staged again, or the per-row results are
                unknown (see above).
        """
        deadline = time.monotonic() + self.ride_through_s
        refs = list(staged)
        positions: list[tuple[int, int] | None] = (
            [None] * len(refs) if err.positions is None else list(err.positions))
        want_results = any(r.op in MAY_FAIL_PER_ROW for r in refs)
        last: KuduError = err
        while time.monotonic() < deadline:
            try:
                lead = self._leaders_for(self.master.get_table(table), [tid])[tid]
                known = [p[0] for p in positions if p is not None]
                terms = (self._service.call(functools.partial(lead.terms_at, known)).result()
                         if known else {})
            except (RoundFailedError, NotLeaderError) as e:
                last = e
                self._retry_pause(tid)
                continue
            held = [p is not None and terms.get(p[0]) == p[1] for p in positions]
            redo = [k for k, h in enumerate(held) if not h]
            down = self._unreachable_hosts()
            lost = [k for k in redo if isinstance(r := refs[k], StagedRef) and r.host in down]
            if lost:
                keep = [k for k in range(len(refs)) if k not in set(lost)]
                refs = [refs[k] for k in keep] + self._restage(table, tid, refs, lost, held,
                                                               restage)
                positions = [positions[k] for k in keep] + [None] * (len(refs) - len(keep))
                continue
            try:
                done = self._service.submit(
                    lead, [refs[k].entry_data() for k in redo] or [b""],
                    want_results=want_results and bool(redo)).result()
            except UncommittedError as e:
                # Where the proposed batches now sit (for the next attempt's check); with
                # nothing to redo, the one proposed entry was the empty one: no batch moved.
                again: list[tuple[int, int] | None] = (
                    [None] * len(redo) if e.positions is None or not redo
                    else list(e.positions))
                for k, p in zip(redo, again, strict=True):
                    positions[k] = p
                last = e
                self._retry_pause(tid)
                continue
            except RoundFailedError as e:
                last = e
                self._retry_pause(tid)
                continue
            held_results = (self._held_results(table, tid, lead, [
                p[0] for p, h in zip(positions, held, strict=True) if h and p is not None])
                if want_results else {})
            out: WriteOutcome = [(p[0], p[1], held_results.get(p[0])) if p is not None
                                 else (0, 0, None) for p in positions]
            for k, got in zip(redo, done, strict=False):  # done: [b""]'s when redo is empty
                out[k] = got
            _log.info("table %s: tablet %s rode through a failed round (%d of %d batches "
                      "proposed again)", table, tid, len(redo), len(refs))
            return refs, out
        voters = self.master.get_table(table).tablets
        hosts = {s.uuid: s.host for s in self.servers}
        members = next((t.voters for t in voters if t.tablet_id == tid), ())
        raise RoundFailedError(
            f"table {table}: tablet {tid} had no leader that could commit for "
            f"{self.ride_through_s:g} s (voters on {sorted(hosts.get(v, v) for v in members)}; "
            f"unreachable now: {sorted(self._unreachable_hosts())}); last error: "
            f"{last}. Its rows may or may not have been applied, so retry the write (an "
            f"upsert retry is harmless)")

    def _restage(self, table: str, tid: str, refs: Sequence[Staged], lost: Sequence[int],
                 held: Sequence[bool], restage: Restager | None) -> list[Staged]:
        """The batches that replace ``refs[k]`` for ``k`` in ``lost`` (staged on hosts that
        are gone, none of them committed): the rows of their input partitions, staged again
        for this tablet by ``restage``. Only whole partitions are staged again, so a
        partition of which some batch is held (it will commit) is not: its rows would be
        applied twice.

        Raises:
            RoundFailedError: the batches cannot be staged again (no ``restage``, a file not
                named after its partition, a partly held partition), or staging failed.
        """
        lost_refs = [r for k in lost if isinstance(r := refs[k], StagedRef)]
        parts = {r.part for r in lost_refs}
        partly_held = {r.part for r, h in zip(refs, held, strict=True)
                       if h and isinstance(r, StagedRef)} & parts
        where = sorted({r.host for r in lost_refs})
        if restage is None or None in parts or partly_held:
            why = ("this writer has no lineage to stage them again from" if restage is None
                   else "some of their input partitions' batches committed already")
            raise RoundFailedError(
                f"table {table}: tablet {tid}: batches staged on {', '.join(where)} were lost "
                f"with its executor before they committed, and {why}; retry the write")
        tablet = lost_refs[0].tablet
        try:
            again = restage(sorted(p for p in parts if p is not None), tablet)
        except Exception as e:
            raise RoundFailedError(
                f"table {table}: tablet {tid}: batches staged on {', '.join(where)} were lost "
                f"with its executor, and staging their rows again failed ({e}); retry the "
                f"write") from e
        _log.warning("table %s: tablet %s: %d batches staged on %s were lost with its "
                     "executor; input partitions %s staged again (%d batches)", table, tid,
                     len(lost_refs), ", ".join(where), sorted(p for p in parts if p is not None),
                     len(again))
        return again

    def _held_results(self, table: str, tid: str, lead: TabletLeader,
                      indexes: Sequence[int]) -> dict[int, WriteResult]:
        """Per-row results of the write's entries ``indexes`` that the new leader's log
        held, now committed. No replica had applied them before the failed round's commit
        was learnt, so the new leader replica applies them with (or right after) the commit
        that just returned and reports their results, keyed by index: the entries at those
        indexes are the write's own (same term). A replica that had applied them already
        (it learnt the commit from the lost leader) no longer has their results: then the
        rows' outcome is unknown.

        Raises:
            RoundFailedError: the results could not be had (see above).
        """
        if not indexes:
            return {}
        try:
            got: dict[int, WriteResult] = self._service.call(
                functools.partial(lead.take_results, indexes)).result()
        except RoundFailedError as e:
            raise RoundFailedError(
                f"table {table}: tablet {tid} lost its leader during the write; its batches "
                f"committed, but the per-row results of some were lost with it ({e}), so "
                f"the outcome of their rows is unknown: retry the write") from e
        return got

    def _retry_pause(self, tid: str) -> None:
        with self._lock:
            self._leaders.pop(tid, None)  # elect again: maybe among other voters
        time.sleep(_RIDE_RETRY_S)

    def _unreachable_hosts(self) -> set[str]:
        down = self.transport.unreachable()
        return {s.host for s in self.servers if s.uuid in down}
