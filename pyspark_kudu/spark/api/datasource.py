"""``format("kudu")``: the DataFrame API as a pyspark Python Data Source.

Usage (a :class:`~pyspark_kudu.spark.api.context.KuduContext` registers the source through
:func:`pyspark_kudu.spark.api.session_service.register`; options follow kudu-spark, see
:mod:`pyspark_kudu.spark.api.source_options`)::

    df.write.format("kudu").option("kudu.table", "t").mode("append").save()
    spark.read.format("kudu").option("kudu.table", "t").load().where("id = 7")
    df.writeStream.format("kudu").option("kudu.table", "t")
      .option("checkpointLocation", ckpt).start()

Where each piece runs (DESIGN §4) and what it does:

- ``schema()``, ``reader()``, ``pushFilters()``, ``partitions()``, ``writer()`` and
  ``streamWriter()`` run in Python workers on the driver host during planning. They ask
  the session service (:mod:`~pyspark_kudu.spark.api.session_service`) to ``describe`` the table and
  validate options and columns there, so mistakes fail the query before any task runs.
- **Writes**: each writer task (an executor) routes its Arrow batches to tablets and stages
  them as encoded write batches on its host
  (:func:`~pyspark_kudu.spark.host.dataplane.stage_batches`), returning small refs in its
  commit message (or, when its batches total at most ``kudu.smallWriteBytes``, the
  batches themselves: the small-write path, one round without a shuffle). ``commit()``
  runs in *another* Python worker on the driver host and hands the refs to the session
  service, which replicates them through the context's leaders (one round per tablet,
  majority-committed) and removes the staging. ``abort()`` only
  removes the staging: nothing staged is visible before it is committed. A failing task
  removes what it staged on its own host.
- **Reads**: one Spark partition per tablet left after pruning with the pushed predicates,
  carrying a scan token (:class:`~pyspark_kudu.spark.host.replica_reader.TabletScan`).
  Python data source partitions have no preferred locations, so a scan task runs wherever
  Spark puts it and reads the closest replica that serves it, on its own host or through
  that replica's host's resident tablet server
  (:func:`~pyspark_kudu.spark.host.replica_reader.read_tablet`: order, read-your-writes,
  fail-over). ``kudu.scanLocality=leader_only`` keeps only the reported leader;
  ``kudu.readMode=linearizable`` asks the session service for each tablet's read point
  (its leading client commits an empty entry, ``KuduContext.read_points``) and reads only
  that leader replica, up to that index. A task fails only when no replica serves its
  tablet, naming the table, the tablet, the host and each replica's reason. Batches are
  cast to exactly the declared schema (types, time zone ``UTC``, nullability).
- **Streaming sink**: micro-batches are staged like writes; ``commit(messages, batchId)``
  asks the service for ``commit_stream``, which commits each ``(table, stream id, batch
  id)`` once, also across query restarts (window and replay semantics in the session
  module). Stream id: ``kudu.streamId``, else the query id Spark keeps in
  ``<checkpointLocation>/metadata`` (stable across restarts from that checkpoint, new for
  a new checkpoint). pyspark gives a stream writer no query id of its own, so without a
  ``checkpointLocation`` option ``kudu.streamId`` is required.

Known limits: save mode ``append`` only (Spark refuses ``errorifexists``/``ignore`` for
Python sources; ``overwrite`` and streaming ``complete`` mode are refused here: Kudu tables
are not truncated by a write, as in kudu-spark). ``kudu.repartition`` has no effect on
``format("kudu")`` writes (the writer receives the partitions as Spark planned them; it
works in ``KuduContext.write``). ``kudu.splitSizeBytes`` is refused: a scan is one partition
per tablet (why: see :mod:`~pyspark_kudu.spark.api.source_options`). Spark does not push
column pruning into Python sources: every column is scanned unless the reader is given a
narrower schema (``spark.read.schema(...)``).
``kudu.ignoreNull=true`` stages one batch per (null pattern, tablet) of each Arrow batch
(:func:`without_null_values`): correct, but many small batches when nulls are scattered.

Thread-safety: instances are used by one Spark worker at a time; they hold no shared state.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pyspark_kudu.errors import (
    IllegalStateError,
    InvalidArgumentError,
    NotSupportedError,
)
from pyspark_kudu.partitioning import Partitioner, PartitionSchema
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.spark.api.source_options import (
    ReadOptions,
    WriteOptions,
    check_master,
    check_write_columns,
    parse_read_options,
    parse_write_options,
    translate_filters,
    warn_repartition,
)
from pyspark_kudu.spark.replication.session_client import (
    SessionAddress,
    SessionClient,
    TableInfo,
    read_point_replicas,
)
from pyspark_kudu.tablet import OpType

if TYPE_CHECKING:
    from pyspark_kudu.spark.host.replica_reader import ReplicaChoice, TabletScan

# The executor-side parts (staging, reading replicas) are imported where they run: the
# driver's Python workers that plan and commit a write, or plan a read, start fresh after a
# minute without work (PySpark's idle timeout) and import this module; with those parts
# (the tablet, WAL and replication code, pyarrow's dataset module and pandas) a 1-row write
# after a minute idle cost ~0.4 s more per worker on an idle host, ~0.9 CPU-s under load.

__all__ = [
    "KuduCommitMessage",
    "KuduDataSource",
    "KuduReader",
    "KuduScanReader",
    "KuduStreamWriter",
    "KuduWriter",
    "TabletPartition",
    "bound_source",
    "without_null_values",
]

_log = logging.getLogger(__name__)
_DELETES = (OpType.DELETE, OpType.DELETE_IGNORE)


# == the source ==================================================================================


class KuduDataSource(DataSource):
    """The ``kudu`` format. Use the subclass :func:`bound_source` creates for a session;
    this base class is bound to none and says so."""

    session: ClassVar[SessionAddress | None] = None

    @classmethod
    def name(cls) -> str:
        return "kudu"

    def _client(self) -> SessionClient:
        address = type(self).session
        if address is None:
            raise IllegalStateError(
                "the kudu data source is not bound to a KuduContext: create one with "
                "KuduContext(spark, ...), which registers format('kudu'), or call "
                "pyspark_kudu.spark.api.session_service.register(kudu)")
        return SessionClient(address)

    def _describe(self, table: str, master: str | None, *, write: bool = False
                  ) -> tuple[SessionClient, TableInfo]:
        client = self._client()
        check_master(master, client.address.masters)
        return client, client.describe(table, write=write)

    def schema(self) -> StructType:
        opts = parse_read_options(self.options)
        _, info = self._describe(opts.table, opts.master)
        return info.schema.to_spark()

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(self.options)
        client, info = self._describe(opts.table, opts.master)
        out = _read_schema(schema, info.schema, opts.table)
        # pyspark refuses a reader with pushFilters when pushdown is off: offer one without.
        cls = KuduReader if info.filter_pushdown else KuduScanReader
        return cls(info, opts, out, client.address)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        opts = parse_write_options(self.options)
        if overwrite:
            raise NotSupportedError(
                f"table {opts.table}: save mode 'overwrite' is not supported: Kudu tables are "
                f"not truncated by a write (kudu-spark supports only 'append'); use "
                f"mode('append') with kudu.operation=upsert, or delete the rows first")
        return KuduWriter(self._write_plan(schema, opts))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        opts = parse_write_options(self.options)
        if overwrite:
            raise NotSupportedError(
                f"table {opts.table}: streaming output mode 'complete' would rewrite the "
                f"table each micro-batch, which Kudu tables do not support; use outputMode "
                f"'append' or 'update'")
        checkpoint = (self.options.get("checkpointlocation")
                      or self.options.get("checkpointLocation"))
        if opts.stream_id is None and not checkpoint:
            raise InvalidArgumentError(
                f"table {opts.table}: a streaming write needs a stable stream id to commit each "
                f"micro-batch exactly once: set option checkpointLocation (its query id is "
                f"used) or kudu.streamId")
        return KuduStreamWriter(self._write_plan(schema, opts), opts.stream_id,
                                None if checkpoint is None else str(checkpoint))

    def _write_plan(self, schema: StructType, opts: WriteOptions) -> _WritePlan:
        """What every writer task needs, once the DataFrame's columns fit the table."""
        client, info = self._describe(opts.table, opts.master, write=True)
        check_write_columns(schema.names, info.schema, opts.table, opts.handle_schema_drift,
                            struct=schema)
        warn_repartition(opts)
        return _WritePlan.of(client.address, info, opts)


def bound_source(address: SessionAddress) -> type[KuduDataSource]:
    """A ``kudu`` data source class bound to the session service at ``address``.

    It is created at run time with a qualified name no module defines, so cloudpickle
    pickles it *by value*, class attributes included, when Spark ships it to its workers.
    """
    cls = type("KuduDataSource", (KuduDataSource,), {
        "session": address, "__module__": __name__,
        "__qualname__": "bound_source.<locals>.KuduDataSource",
        "__doc__": f"The kudu data source bound to the session service on "
                   f"{address.host}:{address.port}.",
    })
    return cls


def _read_schema(given: StructType, schema: Schema, table: str) -> StructType:
    """The schema a read produces: the table's, or a user-given projection of it (same
    types; a nullable column may not be declared non-null)."""
    full = schema.to_spark()
    by_name = {f.name: f for f in full.fields}
    for f in given.fields:
        col = by_name.get(f.name)
        if col is None:
            raise InvalidArgumentError(
                f"table {table}: the read schema names column {f.name!r}, which the table "
                f"lacks (columns: {schema.names})")
        if col.dataType != f.dataType:
            raise InvalidArgumentError(
                f"table {table}: column {f.name!r} is {col.dataType.simpleString()} in the "
                f"table, not {f.dataType.simpleString()}; drop .schema(...) or fix the type")
        if col.nullable and not f.nullable:
            raise InvalidArgumentError(
                f"table {table}: column {f.name!r} is nullable in the table; declare it "
                f"nullable in the read schema")
    return given


# == writes ======================================================================================


@dataclass(frozen=True)
class _WritePlan:
    """Everything a writer task and its commit need, fixed when the write is planned."""

    address: SessionAddress
    table: str
    schema: Schema
    partition_schema: dict[str, Any]
    operation: OpType
    ignore_null: bool
    batch_size: int
    staging_root: str | None
    small_write_bytes: int | None  # None: dataplane.SMALL_WRITE_BYTES
    write_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def of(cls, address: SessionAddress, info: TableInfo, opts: WriteOptions) -> _WritePlan:
        return cls(address, opts.table, info.schema, dict(info.partition_schema),
                   opts.operation, opts.ignore_null, opts.batch_size, info.staging_root,
                   opts.small_write_bytes)


@dataclass
class KuduCommitMessage(WriterCommitMessage):
    """What one writer task staged: encoded refs, rows no range covers, its staging id."""

    write_id: str
    refs: list[bytes]
    bad_rows: list[str]
    rows: int


def without_null_values(batch: pa.RecordBatch, keys: Sequence[str]) -> list[pa.RecordBatch]:
    """``kudu.ignoreNull``: ``batch`` as batches whose null non-key values are *absent*.

    A column absent from a write batch keeps its stored value on UPDATE and on the update
    path of UPSERT (and takes its default on insert), which is Kudu's meaning of ignoring a
    null; a present null would *set* null. Rows are grouped by which non-key columns are
    null. Grouping reorders rows, which only matters when a key repeats in the batch; then
    consecutive runs are used instead, which keeps the order.
    """
    cols = [n for n in batch.schema.names if n not in keys and batch.column(n).null_count]
    if not cols or batch.num_rows == 0:
        return [batch]
    nulls = np.column_stack([
        np.asarray(batch.column(n).is_null().to_numpy(zero_copy_only=False), dtype=bool)
        for n in cols])
    patterns, inverse = np.unique(nulls, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    key_table = pa.Table.from_batches([batch.select(list(keys))])
    distinct = key_table.group_by(list(keys)).aggregate([]).num_rows == batch.num_rows
    if distinct:
        groups = [np.flatnonzero(inverse == p) for p in range(len(patterns))]
    else:
        cuts = np.flatnonzero(np.diff(inverse)) + 1
        groups = np.split(np.arange(batch.num_rows), cuts)
    out = []
    for idx in groups:
        pattern = patterns[inverse[idx[0]]]
        drop = {c for c, is_null in zip(cols, pattern, strict=True) if is_null}
        keep = [n for n in batch.schema.names if n not in drop]
        out.append(batch.take(pa.array(idx)).select(keep))
    return out


class _StagingWriter:
    """Staging shared by the batch and the streaming writer (see the module docstring)."""

    def __init__(self, plan: _WritePlan) -> None:
        self.plan = plan

    def _task_write_id(self) -> str:
        return self.plan.write_id

    def _stage(self, batches: Iterator[pa.RecordBatch]) -> KuduCommitMessage:
        from pyspark_kudu.spark.host.dataplane import (
            INLINE_MAGIC,
            SMALL_WRITE_BYTES,
            StagedRef,
            stage_batches,
        )
        from pyspark_kudu.spark.host.identity import current_host, local_data_root

        p = self.plan
        wid = self._task_write_id()
        partitioner = Partitioner(p.schema, PartitionSchema.from_dict(p.partition_schema,
                                                                      p.schema))
        refs: list[bytes] = []
        bad: list[str] = []
        rows = 0

        # One budget for the task's inline batches.
        inline_left = SMALL_WRITE_BYTES if p.small_write_bytes is None else p.small_write_bytes

        def collect(out: Iterator[pa.RecordBatch]) -> None:
            nonlocal inline_left
            for rb in out:
                got = [r for r in rb.column(0).to_pylist() if r is not None]
                inline_left -= sum(len(r) for r in got if r.startswith(INLINE_MAGIC))
                refs.extend(got)
                bad.extend(b for b in rb.column(1).to_pylist() if b is not None)

        def stage(parts: Iterator[pa.RecordBatch]) -> None:
            collect(stage_batches(p.schema, partitioner, p.operation, wid, p.staging_root,
                                  p.batch_size, max(0, inline_left))(parts))

        def counted(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            nonlocal rows
            for b in it:
                rows += b.num_rows
                yield b

        try:
            if p.ignore_null and p.operation not in _DELETES:
                for batch in counted(batches):
                    # Parts have different columns: each is staged on its own.
                    for part in without_null_values(batch, p.schema.primary_key):
                        stage(iter([part]))
            else:
                stage(counted(batches))
        except BaseException:
            # Remove only this task's own files: other tasks of the write may have staged in
            # the same directory on this host, and their refs are still to be committed.
            # Whatever is left goes when the commit or abort discards the write's staging.
            for raw in refs:
                ref = StagedRef.decode(raw)
                if ref is not None:
                    try:
                        os.remove(os.path.join(local_data_root(ref.root), ref.path))
                    except OSError as e:  # pragma: no cover - best effort on a failing task
                        _log.warning("could not remove staged %s on %s: %s", ref.path,
                                     current_host(), e)
            raise
        return KuduCommitMessage(wid, refs, bad, rows)

    @staticmethod
    def _collect(messages: Sequence[WriterCommitMessage | None]
                 ) -> tuple[list[bytes], list[str], list[str]]:
        refs: list[bytes] = []
        bad: list[str] = []
        ids: list[str] = []
        for m in messages:
            if isinstance(m, KuduCommitMessage):
                refs.extend(m.refs)
                bad.extend(m.bad_rows)
                ids.append(m.write_id)
        return refs, bad, ids


class KuduWriter(_StagingWriter, DataSourceArrowWriter):
    """``df.write.format("kudu")``: stage in tasks, replicate in ``commit``."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KuduCommitMessage:
        return self._stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        refs, bad, ids = self._collect(messages)
        summary = SessionClient(self.plan.address).commit(
            self.plan.table, refs, bad, [self.plan.write_id, *ids])
        _log.info("table %s: %s", self.plan.table, summary)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _, _, ids = self._collect(messages)
        SessionClient(self.plan.address).abort([self.plan.write_id, *ids])


class KuduStreamWriter(_StagingWriter, DataSourceStreamArrowWriter):
    """``df.writeStream.format("kudu")``: each micro-batch committed exactly once."""

    def __init__(self, plan: _WritePlan, stream_id: str | None, checkpoint: str | None) -> None:
        super().__init__(plan)
        self.stream_id = stream_id
        self.checkpoint = checkpoint

    def _task_write_id(self) -> str:
        # One writer serves every micro-batch, and write() is not told the batch id: the
        # stage id (unique in the application) keeps each batch's staging apart.
        from pyspark import TaskContext

        tc = TaskContext.get()
        suffix = str(tc.stageId()) if tc is not None else uuid.uuid4().hex
        return f"{self.plan.write_id}-{suffix}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KuduCommitMessage:
        return self._stage(iterator)

    def resolve_stream_id(self) -> str:
        """``kudu.streamId``, else the query id in the checkpoint's ``metadata`` file."""
        if self.stream_id is not None:
            return self.stream_id
        assert self.checkpoint is not None
        path = self.checkpoint
        if path.startswith("file:") and not path.startswith("file://"):
            path = path[len("file:"):]  # Hadoop's "file:/x" form
        from pyspark_kudu.fileio import FileIO

        try:
            doc = json.loads(FileIO(path).read_bytes("metadata"))
            query_id = str(doc["id"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidArgumentError(
                f"table {self.plan.table}: cannot read the streaming query id from "
                f"{self.checkpoint}/metadata ({e}); set option kudu.streamId") from e
        return f"q-{query_id}"

    def commit(self, messages: list[WriterCommitMessage | None],
               batchId: int) -> None:
        refs, bad, ids = self._collect(messages)
        out = SessionClient(self.plan.address).commit_stream(
            self.plan.table, self.resolve_stream_id(), batchId, refs, bad, ids)
        _log.info("table %s, micro-batch %d: %s", self.plan.table, batchId,
                  "replay, already committed" if out is None else out)

    def abort(self, messages: list[WriterCommitMessage | None],
              batchId: int) -> None:
        _, _, ids = self._collect(messages)
        if ids:
            SessionClient(self.plan.address).abort(ids)


# == reads =======================================================================================


class TabletPartition(InputPartition):
    """One tablet to scan: its scan token (replicas, read point, columns, predicates). With
    a ``scan_id`` the tablet is the one the session service hands partition ``index`` on
    the host its task runs on (:mod:`~pyspark_kudu.spark.api.scan_claims`); ``scan`` is
    then the token of tablet ``index``, for reading without the service."""

    def __init__(self, scan: TabletScan, scan_id: str = "", index: int = -1) -> None:
        super().__init__(scan.tablet_id)
        self.scan = scan
        self.scan_id = scan_id
        self.index = index

    @property
    def tablet_id(self) -> str:
        return self.scan.tablet_id


class KuduScanReader(DataSourceReader):
    """Reads a table without predicate pushdown (when Spark's pushdown conf is off)."""

    def __init__(self, info: TableInfo, opts: ReadOptions, out: StructType,
                 session: SessionAddress | None = None) -> None:
        self.info = info
        self.opts = opts
        self.session = session
        self.columns = tuple(out.names)
        self.arrow_schema = to_arrow_schema(out, timezone="UTC")  # what Spark checks
        self.predicates: list[Predicate] = []

    def _choice(self, ts: str, leader: bool) -> ReplicaChoice:
        from pyspark_kudu.spark.host.replica_reader import ReplicaChoice

        host, root, address, location = self.info.tservers.get(ts, ("", None, "", None))
        return ReplicaChoice(ts, root, leader, host, address, location)

    def _token(self, tablet_id: str, replicas: Sequence[ReplicaChoice], snapshot: int | None,
               known: int | None, require: bool = False, commit_term: int | None = None
               ) -> TabletPartition:
        from pyspark_kudu.spark.host.replica_reader import TabletScan

        info = self.info
        return TabletPartition(TabletScan(
            self.opts.table, tablet_id, tuple(replicas), self.columns, tuple(self.predicates),
            snapshot, known, require, self.opts.batch_size, info.data_root_conf,
            {h: loc for h, _, _, loc in info.tservers.values()},
            {c.name: c.type for c in info.schema.columns}, commit_term))

    def partitions(self) -> list[InputPartition]:
        info, opts = self.info, self.opts
        partitioner = Partitioner(info.schema, PartitionSchema.from_dict(
            info.partition_schema, info.schema))
        out: list[InputPartition] = []
        pruned = partitioner.prune(self.predicates)
        if opts.read_mode == "linearizable":
            if self.session is None:
                raise IllegalStateError("a linearizable read needs the session service")
            points = SessionClient(self.session).read_points(
                opts.table, [info.tablets[p].tablet_id for p in pruned])
            for pidx in pruned:
                tid = info.tablets[pidx].tablet_id
                ts, index, term = points[tid]
                chosen = [self._choice(r, lead) for r, lead in
                          read_point_replicas(ts, info.tablets[pidx].replicas, term)]
                out.append(self._token(tid, chosen, None, index, True, commit_term=term))
            return out
        for pidx in pruned:
            t = info.tablets[pidx]
            ordered = sorted(t.replicas, key=lambda r: r != t.leader)  # leader first
            if opts.scan_locality == "leader_only" and t.leader:
                # A tablet with no reported leader has no committed writes reported, so
                # any replica serves it.
                ordered = [t.leader]
            snapshot = opts.snapshot_index
            if snapshot is None and opts.fault_tolerant:
                snapshot = t.known_commit
            out.append(self._token(t.tablet_id, [self._choice(r, r == t.leader)
                                                 for r in ordered], snapshot, t.known_commit,
                                   commit_term=t.commit_term))
        return self._claimed(out)

    def _claimed(self, parts: list[InputPartition]) -> list[InputPartition]:
        """``parts`` registered with the session service, which hands each task a tablet
        with a replica on its host (:mod:`~pyspark_kudu.spark.api.scan_claims`)."""
        tokens = [p.scan for p in parts if isinstance(p, TabletPartition)]
        if self.session is None or len(tokens) < 2 or len(tokens) != len(parts):
            return parts
        scan_id = uuid.uuid4().hex
        SessionClient(self.session).register_scan(
            scan_id, [[r.host for r in t.replicas] for t in tokens],
            [base64.b64encode(pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL)).decode()
             for t in tokens])
        return [TabletPartition(t, scan_id, i) for i, t in enumerate(tokens)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TabletPartition):
            return  # Spark's stand-in partition when pruning left no tablet
        from pyspark_kudu.spark.host.identity import current_host
        from pyspark_kudu.spark.host.replica_reader import read_tablet_refreshing

        scan = partition.scan
        if partition.scan_id and self.session is not None:
            _, token = SessionClient(self.session).claim_tablet(
                partition.scan_id, partition.index, current_host())
            scan = pickle.loads(base64.b64decode(token))
        refresh = (SessionClient(self.session).server_addresses
                   if self.session is not None else None)
        for rb in read_tablet_refreshing(scan, refresh):
            yield self._conform(rb)

    def _conform(self, rb: pa.RecordBatch) -> pa.RecordBatch:
        """``rb`` with exactly the declared Arrow schema (order, types, nullability)."""
        target = self.arrow_schema
        arrays = [pc.cast(rb.column(f.name), f.type) for f in target]
        return pa.RecordBatch.from_arrays(arrays, schema=target)


class KuduReader(KuduScanReader):
    """Reads a table, pushing supported filters into tablet pruning and replica scans."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        handled, rest = translate_filters(filters, self.info.schema)
        self.predicates.extend(handled)
        return rest
