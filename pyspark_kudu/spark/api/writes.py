"""The write path of a ``KuduContext``: rows routed, encoded and staged on the executors
that hold them, then replicated by this client's tablet leaders -- or forwarded to the client
holding a tablet's leadership lease -- with Kudu's per-row errors.

:class:`WritePath` is a mixin over the context's master client, tablet servers, replication
service and leaders (the same shape as
:class:`~pyspark_kudu.spark.healing.replica_management.ReplicaManagement`).

Thread-safety: as ``KuduContext``: writes from several threads share rounds; leaders are
looked up and elected under the context's lock.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pyspark_kudu.errors import (
    FencedError,
    InvalidArgumentError,
    KuduError,
    NotFoundError,
    NotLeaderError,
    RoundFailedError,
    RowWriteError,
    SessionUnreachableError,
)
from pyspark_kudu.master.client import MasterClient, TableLocations
from pyspark_kudu.master.records import TabletReport
from pyspark_kudu.partitioning import Partitioner, PartitionSchema
from pyspark_kudu.schema import Schema
from pyspark_kudu.spark.api.group_report import GroupReport
from pyspark_kudu.spark.api.local_input import local_batches
from pyspark_kudu.spark.api.ride_through import MAY_FAIL_PER_ROW, Restager, RideThrough
from pyspark_kudu.spark.api.source_options import OPERATIONS, check_write_columns
from pyspark_kudu.spark.host.dataplane import (
    SMALL_WRITE_BYTES,
    InlineOverflowError,
    Staged,
    StagedRef,
    StagingJanitor,
    decode_staged,
    stage_batches,
    staging_schema,
)
from pyspark_kudu.spark.replication.lease_keeper import LeaseKeeper, by_holder
from pyspark_kudu.spark.replication.multitablet import (
    UncommittedError,
    elect_all,
    spread_leaders,
)
from pyspark_kudu.spark.replication.session_client import (
    ReadPoint,
    SessionAddress,
    SessionClient,
)
from pyspark_kudu.spark.replication.spark_rounds import (
    SparkTransport,
    TabletServerLocation,
    root_cause,
)
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.replication.write_service import (
    ReplicationService,
    WriteOutcome,
    WriteProgress,
    WriteSummary,
)
from pyspark_kudu.tablet import OpType

__all__ = ["WritePath"]

_log = logging.getLogger(__name__)

_MAX_BATCH_ROWS = 65536
_SMALL_WRITE_TOTAL = 64 << 20  # bytes a small write may carry through the driver, in all
_LOCAL_PLAN_FACTOR = 8  # a local relation is read in the driver up to this x the threshold


_FORWARD_GRACE_S = 15.0  # past the lease: how long a forward that found no leader re-routes
_FORWARD_RETRY_S = 0.5


class _Tally:
    """What one write committed so far, from this client's rounds and forwards.
    Thread-safety: confined to the thread running ``commit_staged``."""

    def __init__(self, progress: Callable[[WriteProgress], None] | None) -> None:
        self.progress = progress
        self.errors: list[tuple[str, dict[str, object], str, str]] = []
        self.written = self.rows_done = self.batches_done = 0
        self.rows_total = self.batches_total = 0
        self.failure: KuduError | None = None

    def fail(self, e: KuduError) -> None:
        self.failure = self.failure or e

    def own_done(self, tid: str, outcome: WriteOutcome, refs: Sequence[Staged]) -> None:
        for (_, _, result), ref in zip(outcome, refs, strict=True):
            if result is None:
                self.written += ref.rows
            else:
                self.written += result.num_rows - len(result.errors)
                self.errors.extend((tid, e.key or {}, e.status, e.message)
                                   for e in result.errors)
            self.rows_done += ref.rows
            self.batches_done += 1
        self._report()

    def remote_done(self, tids: Sequence[str], refs: dict[str, list[Staged]],
                    written: int, errors: Sequence[tuple[str, dict[str, object], str, str]]
                    ) -> None:
        self.written += written
        self.errors.extend(errors)
        self.rows_done += sum(r.rows for t in tids for r in refs[t])
        self.batches_done += sum(len(refs[t]) for t in tids)
        self._report()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(WriteProgress(self.rows_done, self.rows_total, self.batches_done,
                                        self.batches_total))


class _Restager:
    """Stages input partitions of a write's staging DataFrame again (Spark recomputes them
    from the lineage, on live executors) for one tablet at a time; a partition staged again
    serves every tablet that lost it (cached). Not for a write that repartitioned its rows:
    a shuffle's partition ids may differ between two runs (adaptive execution coalesces)."""

    def __init__(self, staging: DataFrame) -> None:
        self.staging = staging
        self._done: dict[int, list[Staged]] = {}

    def __call__(self, parts: Sequence[int], tablet: int) -> list[Staged]:
        todo = sorted(set(parts) - self._done.keys())
        if todo:
            rdd = self.staging.rdd
            got = self.staging.sparkSession.sparkContext.runJob(
                rdd, _refs_of_partition, partitions=todo)
            for part, raw in got:
                ref = decode_staged(raw)
                if ref is not None:
                    self._done.setdefault(part, []).append(ref)
            for p in todo:
                self._done.setdefault(p, [])
        return [r for p in sorted(set(parts)) for r in self._done[p] if r.tablet == tablet]


def _refs_of_partition(rows: Iterable[Any]) -> list[tuple[int, bytes]]:
    from pyspark import TaskContext

    task = TaskContext.get()
    part = task.partitionId() if task is not None else -1
    return [(part, bytes(r["ref"])) for r in rows if r["ref"] is not None]


class WritePath(RideThrough):
    """Writes of a ``KuduContext`` (see the module docstring)."""

    spark: SparkSession
    master: MasterClient
    servers: list[TabletServerLocation]
    transport: SparkTransport
    warehouse: str
    client_id: str
    leases: LeaseKeeper
    _local: bool
    _service: ReplicationService
    _janitor: StagingJanitor
    _lock: threading.Lock
    _leaders: dict[str, TabletLeader]
    _leader_tables: dict[str, str]  # tablet -> its table, for each tablet ever led here
    _failed_reported: set[tuple[str, str]]
    _commit_reports: GroupReport[TabletLeader]  # of _send_commit_reports
    #: Per tablet, the last entry of this client's acknowledged writes: (the leader replica
    #: that committed it, its index, its term). Reads must see it (read-your-writes) even
    #: after that leader was abandoned (``KuduContext.known_commit``).
    _acked: dict[str, tuple[str, int, int]]

    # -- writes ------------------------------------------------------------------------------
    def insert_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "insert")

    def insert_ignore_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "insert_ignore")

    def upsert_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "upsert")

    def update_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "update")

    def update_ignore_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "update_ignore")

    def delete_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "delete")

    def delete_ignore_rows(self, df: DataFrame, table: str) -> WriteSummary:
        return self.write(df, table, "delete_ignore")

    def write(self, df: DataFrame, table: str, operation: str = "upsert", *,
              progress: Callable[[WriteProgress], None] | None = None,
              batch_rows: int = _MAX_BATCH_ROWS, repartition: bool = False,
              repartition_sort: bool = True,
              small_write_bytes: int = SMALL_WRITE_BYTES) -> WriteSummary:
        """Write ``df``'s rows to ``table`` with Kudu's ``operation``; returns once every
        batch is committed on a majority of its tablet's replicas.

        The rows are routed and encoded on the executors that hold them and shuffled to the
        replicas' hosts (:mod:`~pyspark_kudu.spark.host.dataplane`); only small refs reach the
        driver. A small write (a staging task's encoded batches total at most
        ``small_write_bytes``, and the whole write at most ``_SMALL_WRITE_TOTAL``) skips the
        shuffle: its batches travel inside the Raft entries of one replication round.
        ``small_write_bytes=0`` always stages and shuffles. ``progress`` is called as
        tablets' batches commit.

        ``repartition=True`` (kudu-spark's ``kudu.repartition``) first shuffles the rows so
        that each staging task holds one tablet's rows, sorted by primary key unless
        ``repartition_sort=False`` (``kudu.repartition.sort``): each tablet then receives
        batches of up to ``batch_rows`` rows from one task instead of a batch from every
        input partition (:mod:`~pyspark_kudu.spark.api.repartition`).

        Raises:
            InvalidArgumentError: unknown operation, a column the table lacks, a missing key
                column, or values that do not fit the schema; nothing is written.
            RowWriteError: some rows were rejected (e.g. duplicate keys for ``insert``); the
                others are written and the error lists the rejected rows' keys.
        """
        op = OPERATIONS.get(operation)
        if op is None:
            raise InvalidArgumentError(
                f"Unsupported operation type {operation!r}: use one of {sorted(OPERATIONS)}")
        if batch_rows < 1:
            raise InvalidArgumentError(f"batch_rows must be >= 1, got {batch_rows}")
        if small_write_bytes < 0:
            raise InvalidArgumentError(
                f"small_write_bytes must be >= 0, got {small_write_bytes}")
        # Reading or staging the rows may take a while; this thread submits the batches.
        writer = threading.get_ident()
        self._service.expect_write(writer)
        try:
            return self._write(df, table, op, progress, batch_rows, repartition,
                               repartition_sort, small_write_bytes)
        finally:
            self._service.expected_write_ended(writer)  # submitted by now, or failed

    def _write(self, df: DataFrame, table: str, op: OpType,
               progress: Callable[[WriteProgress], None] | None, batch_rows: int,
               repartition: bool, repartition_sort: bool, small_write_bytes: int
               ) -> WriteSummary:
        locs = self.master.get_table(table)
        schema = locs.table.schema
        check_write_columns(df.columns, schema, table, struct=df.schema)
        partitioner = Partitioner(schema, PartitionSchema.from_dict(
            locs.table.partition_schema, schema))
        write_id = uuid.uuid4().hex
        staging_root = self.warehouse if self._local else None
        if repartition:
            # Imported here: only this method of the context uses it.
            from pyspark_kudu.spark.api.repartition import repartition_by_tablet

            df = repartition_by_tablet(df, partitioner,
                                       schema.primary_key if repartition_sort else ())
        staged = None if repartition or not small_write_bytes else self._encode_local(
            df, table, schema, partitioner, op, write_id, batch_rows, small_write_bytes)
        restager = None
        if staged is None:
            staging, staged = self._staging_job(df, table, schema, partitioner, op, write_id,
                                                staging_root, batch_rows, small_write_bytes)
            restager = None if repartition else _Restager(staging)
        refs = [decode_staged(bytes(r["ref"])) for r in staged if r["ref"] is not None]
        bad = [str(r["bad_row"]) for r in staged if r["bad_row"] is not None]
        try:
            return self.commit_staged(
                table, [r for r in refs if r is not None], bad, progress=progress,
                locations=locs, restage=restager)
        finally:
            if any(isinstance(r, StagedRef) for r in refs):
                self.discard_staged(write_id)  # an all-inline write staged no file

    def expect_write(self) -> None:
        """A ``format("kudu")`` write of this client is being planned: the settle round
        waits for it
        (:meth:`~pyspark_kudu.spark.replication.write_service.ReplicationService.expect_write`;
        :meth:`write` announces its own, with the thread that will submit it)."""
        self._service.expect_write()

    def expected_write_ended(self) -> None:
        """The write announced by :meth:`expect_write` was submitted or will not be."""
        self._service.expected_write_ended()

    def _encode_local(self, df: DataFrame, table: str, schema: Schema,
                      partitioner: Partitioner, op: OpType, write_id: str, batch_rows: int,
                      small_write_bytes: int) -> list[Any] | None:
        """The staging rows of a small write of a local DataFrame, encoded in the driver
        (:mod:`~pyspark_kudu.spark.api.local_input`: no Spark job), or ``None`` when ``df``
        is not local or its batches outgrow ``small_write_bytes`` (the staging job then
        encodes it)."""
        # Spark's size estimate of the relation is not the encoded size: read rows from a
        # relation up to a few times the threshold, and let the encoded batches decide.
        batches = local_batches(df, _LOCAL_PLAN_FACTOR * small_write_bytes)
        if batches is None:
            return None
        encode = stage_batches(schema, partitioner, op, write_id, None, batch_rows,
                               small_write_bytes, files=False)
        try:
            return [row for out in encode(iter(batches)) for row in out.to_pylist()]
        except InlineOverflowError:
            return None
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"table {table}: {e}") from None

    def _staging_job(self, df: DataFrame, table: str, schema: Schema,
                     partitioner: Partitioner, op: OpType, write_id: str,
                     staging_root: str | None, batch_rows: int, small_write_bytes: int
                     ) -> tuple[DataFrame, list[Any]]:
        """Route, encode and stage ``df``'s rows where they are (the module's step 1);
        returns the staging DataFrame (its lineage restages lost batches) and its rows."""
        if small_write_bytes:  # the driver carries at most _SMALL_WRITE_TOTAL inline
            tasks = max(1, df._jdf.rdd().getNumPartitions())
            small_write_bytes = min(small_write_bytes, _SMALL_WRITE_TOTAL // tasks)
        staging = df.mapInArrow(
            stage_batches(schema, partitioner, op, write_id, staging_root, batch_rows,
                          small_write_bytes), staging_schema())
        try:
            return staging, staging.collect()
        except Exception as e:  # the staging job failed: nothing was proposed
            self._janitor.remove(write_id)
            cause = root_cause(str(e))
            if cause.startswith("InvalidArgumentError: "):
                raise InvalidArgumentError(
                    f"table {table}: {cause.removeprefix('InvalidArgumentError: ')}") from None
            raise

    def discard_staged(self, write_id: str) -> None:
        """Remove a write's staged batches on every host (in the background)."""
        self._janitor.remove(write_id)

    def commit_staged(self, table: str, staged: Sequence[Staged],
                      bad_rows: Sequence[str] = (), *,
                      progress: Callable[[WriteProgress], None] | None = None,
                      locations: TableLocations | None = None,
                      forwarded: bool = False,
                      restage: Restager | None = None) -> WriteSummary:
        """Replicate batches staged by :func:`~pyspark_kudu.spark.host.dataplane.stage_batches`
        (by :meth:`write`, or by the ``kudu`` data source's writer tasks): staged refs, or
        small batches inline; returns once all are committed. ``bad_rows`` are the JSON
        rows staging found in no range partition, reported as per-row ``NotFound`` errors.
        The caller removes the staging afterwards (:meth:`discard_staged`).

        Tablets another client leads are forwarded to it (``lead_commit``); a forward that
        could not be delivered, or reached a client that no longer leads, is routed again
        until the lease it found lapses. ``forwarded``: this call is such a forward; a tablet
        this client does not lead is refused (``NotLeaderError``) before anything is
        proposed. ``restage`` stages the rows of batches lost with their staging host again
        (:meth:`write` gives one; without it such a loss fails the write)."""
        locs = locations or self.master.get_table(table)
        tally = _Tally(progress)
        tally.errors.extend(("", json.loads(row), "NotFound", "row is in no range partition")
                            for row in bad_rows)
        refs: dict[int, list[Staged]] = {}
        for ref in staged:
            if not 0 <= ref.tablet < len(locs.tablets):
                what = ref.path if isinstance(ref, StagedRef) else f"of {ref.rows} rows"
                raise InvalidArgumentError(
                    f"table {table}: staged batch {what} names tablet {ref.tablet}, the "
                    f"table has {len(locs.tablets)}; was it staged for another table?")
            refs.setdefault(ref.tablet, []).append(ref)
        tally.rows_total = sum(r.rows for rs in refs.values() for r in rs)
        tally.batches_total = sum(len(rs) for rs in refs.values())
        by_tid = {locs.tablets[p].tablet_id: refs[p] for p in sorted(refs)}
        pending = list(by_tid)
        deadline = time.monotonic() + self.leases.ttl_s + _FORWARD_GRACE_S
        while pending:
            # A tablet no voter can lead now (no live majority yet) rides through like one
            # whose round failed: it keeps trying until ``ride_through_s``, then fails
            # naming its hosts. A forward is refused at once instead (its sender retries).
            leaderless: dict[str, KuduError] = {}
            own, remote = self._route(locs, pending, forwarded=forwarded,
                                      leaderless=None if forwarded else leaderless)
            groups = by_holder(remote)
            retry: list[str] = []
            mine = [*own, *leaderless]
            with self.leases.using(mine), ThreadPoolExecutor(
                    max(1, len(groups)), thread_name_prefix="kudu-forward") as pool:
                forwards = {pool.submit(SessionClient(addr).lead_commit, table,
                                        [r.encode() for t in tids for r in by_tid[t]]): tids
                            for addr, tids in groups.items()}
                self._commit_own(table, {t: by_tid[t] for t in mine}, own, tally, restage,
                                 leaderless)
                for fut in as_completed(forwards):
                    tids = forwards[fut]
                    try:
                        summary = fut.result()
                    except RowWriteError as e:
                        tally.remote_done(tids, by_tid, e.rows_written, e.errors)
                    except (SessionUnreachableError, NotLeaderError) as e:
                        if time.monotonic() < deadline:  # nothing was proposed: route again
                            retry.extend(tids)
                        else:
                            tally.fail(RoundFailedError(
                                f"table {table}: tablets {tids} are led by another client "
                                f"that did not take the write ({e}); nothing was written "
                                f"to them"))
                    except KuduError as e:
                        tally.fail(RoundFailedError(
                            f"table {table}: the write to tablets {tids}, forwarded to the "
                            f"client leading them, was not acknowledged ({e}); its rows "
                            f"may or may not have been applied, so retry the write (an "
                            f"upsert retry is harmless)"))
                    else:
                        tally.remote_done(tids, by_tid, summary.rows_written, [])
            pending = retry
            if pending:
                time.sleep(_FORWARD_RETRY_S)  # the holder's lease lapses within the deadline
        if tally.failure is not None:
            raise tally.failure
        summary = WriteSummary(tally.written, len(tally.errors), len(by_tid))
        if tally.errors:
            sample = "; ".join(f"{s} {r}" for _, r, s, _ in tally.errors[:3])
            raise RowWriteError(
                f"failed to write {len(tally.errors)} rows to table {table} "
                f"({tally.written} written); sample errors: {sample}", tally.errors,
                tally.written)
        return summary

    def _commit_own(self, table: str, refs: dict[str, list[Staged]],
                    leaders: dict[str, TabletLeader], tally: _Tally,
                    restage: Restager | None,
                    leaderless: dict[str, KuduError] | None = None) -> None:
        """Replicate the batches of tablets this client leads, into ``tally``; those of
        ``leaderless`` tablets (no leader could be elected) ride through from the start."""
        if not refs:
            return
        futures: dict[Future[WriteOutcome], tuple[str, list[Staged]]] = {}
        lost: list[tuple[str, list[Staged], UncommittedError]] = [
            (tid, refs[tid], UncommittedError(
                f"tablet {tid}: no leader could be elected ({err}); nothing was proposed",
                None)) for tid, err in (leaderless or {}).items()]
        for tid, batch_refs in refs.items():
            if tid not in leaders:
                continue  # leaderless
            # Only insert, update and delete can fail per row; the others return once
            # committed, without waiting a round for the replicas' per-row results.
            fut = self._service.submit(leaders[tid], [r.entry_data() for r in batch_refs],
                                       want_results=any(r.op in MAY_FAIL_PER_ROW
                                                        for r in batch_refs))
            futures[fut] = (tid, batch_refs)
        failed = False
        for fut in as_completed(futures):
            tid, batch_refs = futures[fut]
            try:
                outcome = fut.result()
            except KuduError as e:  # fenced by another writer, or no majority
                self._drop_leader(tid, leaders[tid])  # elect again next time
                if isinstance(e, UncommittedError):
                    lost.append((tid, batch_refs, e))  # ridden through below
                    continue
                failed = True
                if isinstance(e, FencedError):
                    self.leases.distrust(tid)  # someone else led: is the lease still ours?
                kind = FencedError if isinstance(e, FencedError) else RoundFailedError
                tally.fail(kind(
                    f"table {table}: the write to tablet {tid} was not acknowledged ({e}); "
                    f"its rows may or may not have been applied, so retry the write (an "
                    f"upsert retry is harmless)"))
                continue
            tally.own_done(tid, outcome, batch_refs)
            self._note_acked(tid, leaders[tid].leader_id, outcome)
        for tid, batch_refs, lost_err in lost:
            try:
                batch_refs, outcome = self._ride_through(table, tid, batch_refs, lost_err,
                                                         restage)
            except KuduError as err:
                failed = True
                tally.fail(err)
                continue
            tally.own_done(tid, outcome, batch_refs)
            with self._lock:
                rider = self._leaders.get(tid)  # elected by the ride-through, or later
            if rider is not None:
                self._note_acked(tid, rider.leader_id, outcome)
        self._report_failed(leaders[t] for t in refs if t in leaders)
        if not failed:
            with self._lock:
                now = [lead for t in refs
                       if (lead := self._leaders.get(t) or leaders.get(t)) is not None]
            self._report_commits(now)

    def _drop_leader(self, tid: str, failed: TabletLeader) -> None:
        """Forget ``failed`` as ``tid``'s leader, so that the next use elects again -- unless
        another leader replaced it meanwhile (a fail-over at executor loss, another write's
        ride-through): that one is kept, not elected over."""
        with self._lock:
            if self._leaders.get(tid) is failed:
                del self._leaders[tid]

    def _note_acked(self, tid: str, leader_id: str, outcome: WriteOutcome) -> None:
        """Remember the last entry of an acknowledged write to ``tid`` (``_acked``).
        ``leader_id`` committed it or was elected after (its log holds every committed
        entry), so it may serve a read up to it without checking the term."""
        last = max(((i, t) for i, t, _ in outcome if i > 0), default=None)
        if last is None:
            return
        with self._lock:
            cur = self._acked.get(tid)
            if cur is None or cur[1] < last[0]:
                self._acked[tid] = (leader_id, last[0], last[1])

    def _report_failed(self, leaders: Iterable[TabletLeader]) -> None:
        """Tell the master about replicas that answered "failed" (corrupt files, full disk):
        it marks them REPLACE and the healer replaces them (peer.py, failed replicas)."""
        for lead in leaders:
            for ts, why in list(lead.failed_replicas.items()):
                key = (lead.tablet.tablet_id, ts)
                if key in self._failed_reported:
                    continue
                try:
                    self.master.set_replace(lead.tablet.tablet_id, ts)
                except NotFoundError:  # already out of the config (replaced): nothing to do
                    self._failed_reported.add(key)
                    continue
                except KuduError as e:  # retried with the next write or healing pass
                    _log.warning("could not report failed replica %s of tablet %s: %s", ts,
                                 lead.tablet.tablet_id, e)
                    continue
                self._failed_reported.add(key)
                _log.warning("replica %s of tablet %s failed (%s): marked for replacement",
                             ts, lead.tablet.tablet_id, why)

    def _report_commits(self, leaders: Sequence[TabletLeader]) -> None:
        """Record each tablet's leader, term and commit index in the master (DESIGN §3: scans
        and tools read what is committed from there) before the write returns. Concurrent
        writers' reports go together (:class:`~pyspark_kudu.spark.api.group_report.GroupReport`):
        one heartbeat per leader replica's tablet server for all of them."""
        self._commit_reports.report(leaders)

    def _send_commit_reports(self, leaders: Sequence[TabletLeader]) -> None:
        """One heartbeat per leader replica's tablet server, carrying all its tablets (each
        leader's term and commit index as they are now: at least what its writers saw)."""
        newest: dict[str, tuple[int, int, TabletLeader]] = {}  # tablet -> term, commit
        for lead in leaders:
            node = lead.node
            if node is None:
                continue
            tid = lead.tablet.tablet_id
            # A tablet twice (several writers; a leader replaced meanwhile): its newest view.
            if tid not in newest or newest[tid][:2] < (node.term, node.commit_index):
                newest[tid] = (node.term, node.commit_index, lead)
        by_ts: dict[str, list[dict[str, Any]]] = {}
        for tid, (term, commit, lead) in newest.items():
            by_ts.setdefault(lead.leader_id, []).append(TabletReport(
                tid, term, leader=lead.leader_id, committed_index=commit).to_dict())
        if not by_ts:
            return
        servers = {s.uuid: s for s in self.servers}
        address = self.master.leader_address()
        for ts, reports in by_ts.items():
            loc = servers[ts]
            self.master.heartbeat_to(address, loc.meta(), reports)

    def _leaders_for(self, locs: TableLocations, tablet_ids: Sequence[str],
                     exclude: frozenset[str] = frozenset(),
                     leaderless: dict[str, KuduError] | None = None
                     ) -> dict[str, TabletLeader]:
        """This client's leader of each tablet, electing the missing ones together
        (:func:`elect_all`: four shared rounds), trying each reachable voter in turn.
        A leader acting for a replica in ``exclude`` is given up and another elected.
        A tablet no voter could lead raises ``RoundFailedError``, or, given ``leaderless``,
        is left out of the result and put there with the last election's error."""
        with self._lock:
            for tid in tablet_ids:
                cur = self._leaders.get(tid)
                if cur is not None and cur.leader_id in exclude:
                    cur.abandon(f"replica {cur.leader_id} is leaving tablet {tid}")
            wanted = set(tablet_ids)
            missing = [t for t in locs.tablets if t.tablet_id in wanted
                       and (self._leaders.get(t.tablet_id) is None
                            or self._leaders[t.tablet_id].node is None)]
            # Asked only for an election: it costs Py4J calls to the driver JVM, under this
            # lock, and every write of every thread routes here (16 concurrent 1-row
            # writers spent 30-90 ms each waiting for it, benchmarks/replication.py).
            unreachable = (self.transport.unreachable() | exclude) if missing else exclude
            candidates = spread_leaders(
                {t.tablet_id: [v for v in t.voters if v not in unreachable] for t in missing},
                [lead.leader_id for lead in self._leaders.values() if lead.node is not None])
            voters = {t.tablet_id: t.voters for t in missing}
            errors: dict[str, KuduError] = {}
            while candidates:
                batch = [TabletLeader(TabletReplicas(tid, voters[tid]), cands.pop(0),
                                      self.transport)
                         for tid, cands in candidates.items() if cands]
                if not batch:
                    break
                elected = elect_all(self.transport, batch)
                self._report_failed(batch)
                for lead, res in elected.items():
                    tid = lead.tablet.tablet_id
                    if isinstance(res, Exception):
                        errors[tid] = res
                    else:
                        self._leaders[tid] = lead
                        self._leader_tables[tid] = locs.table.name
                        candidates.pop(tid, None)
                candidates = {tid: c for tid, c in candidates.items() if c}
            failed = [tid for tid in tablet_ids if tid not in self._leaders
                      or self._leaders[tid].node is None]
            if failed and leaderless is not None:
                for tid in failed:
                    leaderless[tid] = errors.get(tid) or RoundFailedError(
                        f"tablet {tid}: no reachable replica could become leader")
                return {tid: self._leaders[tid] for tid in tablet_ids if tid not in failed}
            if failed:
                raise RoundFailedError(
                    f"tablets {failed}: no replica could become leader (last errors: "
                    + "; ".join(str(errors.get(t, "no reachable replica")) for t in failed[:3])
                    + ")")
            return {tid: self._leaders[tid] for tid in tablet_ids}

    def fail_over(self, lost: Collection[str]) -> list[str]:
        """Elect, on reachable voters, new leaders for the tablets this client leads from a
        replica on one of the ``lost`` tablet servers (their executors are gone), as Kudu's
        followers elect a new leader after a few missed heartbeats: long before the master
        declares the server failed, and without waiting for the next write to find the
        leader gone. Returns the tablets now led from another replica. A tablet no voter
        can lead yet (no live majority) is left without a leader: the next write or healing
        action elects again. Runs on the replication service's round thread (called from
        :meth:`~pyspark_kudu.spark.api.tablet_servers.TabletServers._servers_lost`), so no
        round of the old leader is in flight."""
        gone = frozenset(lost)
        with self._lock:
            moved = [tid for tid, lead in self._leaders.items()
                     if lead.node is not None and lead.leader_id in gone]
            tables = {tid: self._leader_tables.get(tid, "") for tid in moved}
        by_table: dict[str, list[str]] = {}
        for tid, table in tables.items():
            by_table.setdefault(table, []).append(tid)
        done: list[str] = []
        for table, tids in sorted(by_table.items()):
            try:
                locs = self.master.get_table(table)
                present = {t.tablet_id for t in locs.tablets}
                own, _ = self._route(locs, [t for t in tids if t in present], exclude=gone)
            except KuduError as e:
                _log.warning("table %s: failing over tablets %s from lost tablet servers %s "
                             "failed (the next write elects again): %s", table, tids,
                             sorted(gone), e)
                continue
            done.extend(tid for tid, lead in own.items() if lead.leader_id not in gone)
        if done:
            _log.info("tablets %s: new leaders elected after losing tablet servers %s",
                      done, sorted(gone))
        return done

    def _route(self, locs: TableLocations, tablet_ids: Sequence[str], *,
               forwarded: bool = False, exclude: frozenset[str] = frozenset(),
               leaderless: dict[str, KuduError] | None = None
               ) -> tuple[dict[str, TabletLeader], dict[str, SessionAddress]]:
        """Split ``tablet_ids`` into the ones this client leads (their leaders, elected as
        needed, see :meth:`_leaders_for`) and the ones another client holds the lease of
        (its session service). A cached leader of a tablet whose lease this client did not
        hold is dropped (another client may have led it meanwhile: elect again rather than
        fail the next write as fenced), unless the master says no other client held the
        lease since this one did (``LeaseKeeper.route``'s ``continued``). ``forwarded``:
        another client sent this work here, so every tablet must be this client's
        (``NotLeaderError`` otherwise). ``leaderless`` as for :meth:`_leaders_for`."""
        fresh = {t for t in tablet_ids
                 if self.leases.enabled and not self.leases.holds(t)}
        continued: set[str] = set()
        holders = self.leases.route(tablet_ids, continued)
        fresh -= continued  # no other client held them since: the cached leader goes on
        remote = {t: a for t, a in holders.items() if a is not None}
        if remote and forwarded:
            raise NotLeaderError(
                f"client {self.client_id} does not lead tablets {sorted(remote)} (their "
                f"leases are another client's now): route the request again")
        with self._lock:
            for t in remote.keys() | fresh:
                self._leaders.pop(t, None)
        own = [t for t in tablet_ids if t not in remote]
        return (self._leaders_for(locs, own, exclude=exclude, leaderless=leaderless)
                if own else {}), remote

    def read_points(self, table: str, tablet_ids: Sequence[str], *, forwarded: bool = False
                    ) -> dict[str, ReadPoint]:
        """Per tablet: its leader replica, the index of an empty entry committed after this
        call began (see ``read_table``'s ``linearizable``) and that entry's term (a
        follower whose log holds the entry at that term may serve the read too); tablets
        another client leads are asked of it. ``forwarded`` as for :meth:`commit_staged`."""
        return self._read_points(self.master.get_table(table), tablet_ids, forwarded=forwarded)

    def _read_points(self, locs: TableLocations, tablet_ids: Sequence[str], *,
                     forwarded: bool = False) -> dict[str, ReadPoint]:
        """:meth:`read_points`. A leader fenced by another writer meanwhile is elected
        again, and a forward that found no leader is routed again, once."""
        failure: KuduError | None = None
        for _ in range(2):
            own, remote = self._route(locs, tablet_ids, forwarded=forwarded)
            futures = {tid: self._service.submit(lead, [b""]) for tid, lead in own.items()}
            points: dict[str, ReadPoint] = {}
            failure = None
            for addr, tids in by_holder(remote).items():
                try:
                    points.update(SessionClient(addr).lead_read(locs.table.name, tids))
                except KuduError as e:
                    failure = failure or e
            for tid, fut in futures.items():
                try:
                    ((index, term, _),) = fut.result()
                except KuduError as e:  # fenced, or no majority: elect again
                    self._drop_leader(tid, own[tid])
                    failure = failure or e
                    continue
                points[tid] = (own[tid].leader_id, index, term)
            if failure is None:
                return points
        assert failure is not None
        raise failure
