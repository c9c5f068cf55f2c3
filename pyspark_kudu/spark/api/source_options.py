"""Options and filters of the ``kudu`` DataFrame source: parsed, validated, translated.

Pure functions (no SparkSession, no I/O), so the rules below are unit-tested on their own
(``tests/unit/test_datasource_options.py``) and every mistake is reported when the query is
planned, before any task runs.

Decisions (DESIGN §6: names and defaults follow kudu-spark):

- Spark hands a Python data source its options in a case-insensitive map whose keys are
  lower-cased; lookups here are by lower-cased name and errors print kudu-spark's spelling.
- ``kudu.table`` is required; a missing one is reported with kudu-spark's exact text.
- An option starting with ``kudu.`` that no mode knows is an error naming it (a typo must
  not silently fall back to a default). An option known to another mode (``kudu.operation``
  on a read) is ignored, as kudu-spark does. Options without the prefix (``path``,
  ``checkpointLocation``, ``queryName``) belong to Spark and are left alone.
- ``kudu.operation`` (default ``upsert``); ``kudu.ignoreDuplicateRowErrors=true`` turns
  ``insert`` into ``insert_ignore`` (kudu-spark's deprecated spelling of the same thing).
- ``kudu.batchSize``: rows per staged write batch (default 65536) and rows per scan batch.
- ``kudu.smallWriteBytes`` (beyond kudu-spark): a writer task whose encoded batches total at
  most this many bytes (default 1 MiB, ``0``: never) hands them to the commit inline instead
  of staging files, and they travel inside the Raft entries of one round, with no shuffle
  stage (the small-write path, docs/design.md §3.1). The driver then carries at most this
  many bytes per writer task.
- ``kudu.repartition`` (default ``false``) and ``kudu.repartition.sort`` (default ``true``,
  used only with ``kudu.repartition=true``), as in kudu-spark: shuffle the rows so that each
  write task holds one tablet's rows, sorted by primary key
  (:mod:`~pyspark_kudu.spark.api.repartition`). Effective in
  ``KuduContext.write(df, table, repartition=True, repartition_sort=...)`` (and the jobs
  built on it). With ``df.write.format("kudu")`` both are validated but have **no effect**:
  a Python data source writer receives the DataFrame's partitions as Spark planned them and
  cannot add a shuffle before itself, so the writer logs a warning saying so; use
  ``KuduContext.write`` or repartition the DataFrame before ``.write``.
- ``kudu.handleSchemaDrift=true``: kudu-spark would add the DataFrame's extra columns with
  ALTER TABLE; pyspark-kudu has no ALTER TABLE yet, so extra columns are an error naming
  them (with ``false`` they are the same error :meth:`KuduContext.write` raises).
- ``kudu.snapshotIndex``: snapshots here are Raft log indexes of each tablet, not hybrid
  times, so kudu-spark's ``kudu.snapshotTimestampMicros`` is refused with a NotSupported
  error pointing to ``kudu.snapshotIndex`` rather than guessed at. The index is applied to
  every tablet's own log, so it is meaningful for one-tablet tables or for repeating a scan.
- ``kudu.faultTolerantScan=true`` fixes each tablet's snapshot at planning time (the commit
  index this client knows), so retried scan tasks read the same rows.
- ``kudu.readMode`` (beyond kudu-spark, whose reads are READ_LATEST or at a snapshot):
  ``read_latest`` (default) or ``linearizable``, as ``KuduContext.read_table``'s
  ``read_mode``: at planning time the tablets' leading client commits an empty entry per
  tablet, and each scan task reads the leader replica up to it (every write acknowledged
  before the query was planned, by any writer, is visible). Not combinable with
  ``kudu.snapshotIndex`` or ``kudu.faultTolerantScan``; ``kudu.scanLocality`` does not apply.
- ``kudu.splitSizeBytes``: refused (NotSupported), since scans are one Spark partition per
  tablet and an option accepted without effect would mislead. Kudu splits a tablet by asking
  its tablet server for key ranges of about that size (``SplitKeyRange``, computed from
  rowset statistics) while the scan is planned. Here a tablet server is a data root that
  only Spark tasks on its host touch, and ``partitions()`` runs in a Python worker on the
  driver host with no SparkContext, so planning cannot run a task on a replica's host to
  ask. Deriving the ranges inside the scan tasks instead would need every task of a tablet
  to compute the same bounds, but the tasks may read different replicas, whose rowset
  layouts differ (each flushes and compacts on its own), so rows could be read twice or not
  at all.
- ``kudu.master``: only the master of the session that registered the source is supported.

Filters (``pushFilters``): ``EqualTo``, ``GreaterThan(OrEqual)``, ``LessThan(OrEqual)``,
``In``, ``IsNull``, ``IsNotNull`` and ``Not(EqualTo)`` on a table column become
:class:`~pyspark_kudu.schema.Predicate`s, used both to prune tablets and inside replica
scans; everything else is returned to Spark. Not pushed (left to Spark, which is exact):
comparisons on ``float``/``double`` columns (Spark orders NaN above every number and
``NaN = NaN``; Arrow does neither), timestamps whose value's time-zone awareness does not
match the column (an instant compared with wall-clock time), and values the column's type
cannot represent.

Thread-safety: functions only; the option records are immutable.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)
from pyspark.sql.types import StructType

from pyspark_kudu.errors import InvalidArgumentError, NotSupportedError
from pyspark_kudu.master.client import parse_master_addresses
from pyspark_kudu.schema import Predicate, PredicateOp, Schema
from pyspark_kudu.tablet import OpType

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MISSING_TABLE_MESSAGE",
    "OPERATIONS",
    "ReadOptions",
    "WriteOptions",
    "check_master",
    "check_write_columns",
    "parse_bool",
    "parse_read_options",
    "parse_write_options",
    "stream_id_option",
    "translate_filters",
    "warn_repartition",
]

_log = logging.getLogger(__name__)

MISSING_TABLE_MESSAGE = (
    "Kudu table name must be specified in create options using key 'kudu.table'")
DEFAULT_BATCH_SIZE = 65536

OPERATIONS: dict[str, OpType] = {
    "insert": OpType.INSERT,
    "insert_ignore": OpType.INSERT_IGNORE,
    "upsert": OpType.UPSERT,
    "update": OpType.UPDATE,
    "update_ignore": OpType.UPDATE_IGNORE,
    "delete": OpType.DELETE,
    "delete_ignore": OpType.DELETE_IGNORE,
}

# kudu-spark's spelling of every option any mode understands (errors print these).
_KNOWN = (
    "kudu.master", "kudu.table",
    # writes
    "kudu.operation", "kudu.ignoreNull", "kudu.ignoreDuplicateRowErrors", "kudu.batchSize",
    "kudu.repartition", "kudu.repartition.sort", "kudu.handleSchemaDrift", "kudu.streamId",
    "kudu.smallWriteBytes",
    # reads
    "kudu.scanLocality", "kudu.snapshotIndex", "kudu.snapshotTimestampMicros",
    "kudu.faultTolerantScan", "kudu.splitSizeBytes", "kudu.readMode",
)
_CANONICAL = {k.lower(): k for k in _KNOWN}
_LOCALITIES = ("closest_replica", "leader_only")
_READ_MODES = ("read_latest", "linearizable")


@dataclass(frozen=True)
class WriteOptions:
    """A validated write (or streaming write): table, operation and its modifiers."""

    table: str
    operation: OpType
    master: str | None = None
    ignore_null: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    repartition: bool = False
    repartition_sort: bool = True
    handle_schema_drift: bool = False
    stream_id: str | None = None
    #: None: the writer task's default (``dataplane.SMALL_WRITE_BYTES``, resolved where the
    #: task stages: the driver's worker planning the write need not import the staging code).
    small_write_bytes: int | None = None


@dataclass(frozen=True)
class ReadOptions:
    """A validated scan: table, replica choice, snapshot and batch size."""

    table: str
    master: str | None = None
    scan_locality: str = "closest_replica"
    snapshot_index: int | None = None
    fault_tolerant: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    read_mode: str = "read_latest"


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    if value is None:
        value = options.get(name)
    return None if value is None else str(value)


def _check_known(options: Mapping[str, str]) -> None:
    unknown = sorted(k for k in options if k.lower().startswith("kudu.")
                     and k.lower() not in _CANONICAL)
    if unknown:
        raise InvalidArgumentError(
            f"unknown option(s) {unknown} for the kudu data source: known options are "
            f"{list(_KNOWN)} (option names are case-insensitive)")


def parse_bool(name: str, value: str | None, default: bool = False) -> bool:
    """``true``/``false`` (any case) as a bool; ``None`` gives ``default``.

    Raises:
        InvalidArgumentError: any other text, naming the option.
    """
    if value is None:
        return default
    text = value.strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise InvalidArgumentError(f"option {name} must be true or false, got {value!r}")


def _parse_int(name: str, value: str | None, *, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        raise InvalidArgumentError(f"option {name} must be an integer, got {value!r}") from None
    if n < minimum:
        raise InvalidArgumentError(f"option {name} must be >= {minimum}, got {n}")
    return n


def _table(options: Mapping[str, str]) -> str:
    table = _get(options, "kudu.table")
    if table is None or not table.strip():
        raise InvalidArgumentError(MISSING_TABLE_MESSAGE)
    return table.strip()


def _master(options: Mapping[str, str]) -> str | None:
    master = _get(options, "kudu.master")
    if master is None or not master.strip():
        return None
    parse_master_addresses(master)  # a malformed list is reported now, not at check time
    return master.strip()


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """The write options in ``options`` (see the module docstring for each).

    Raises:
        InvalidArgumentError: missing ``kudu.table``, an unknown ``kudu.*`` option, an
            unsupported operation or a malformed value.
    """
    _check_known(options)
    table = _table(options)
    op_name = (_get(options, "kudu.operation") or "upsert").strip().lower()
    op = OPERATIONS.get(op_name)
    if op is None:
        raise InvalidArgumentError(
            f"Unsupported operation type {op_name!r} in kudu.operation: use one of "
            f"{list(OPERATIONS)}")
    if parse_bool("kudu.ignoreDuplicateRowErrors",
                  _get(options, "kudu.ignoreDuplicateRowErrors")) and op is OpType.INSERT:
        op = OpType.INSERT_IGNORE
    batch = _parse_int("kudu.batchSize", _get(options, "kudu.batchSize"), minimum=1)
    small = _parse_int("kudu.smallWriteBytes", _get(options, "kudu.smallWriteBytes"),
                       minimum=0)
    stream_id = _get(options, "kudu.streamId")
    return WriteOptions(
        table=table, operation=op, master=_master(options),
        ignore_null=parse_bool("kudu.ignoreNull", _get(options, "kudu.ignoreNull")),
        batch_size=DEFAULT_BATCH_SIZE if batch is None else batch,
        repartition=parse_bool("kudu.repartition", _get(options, "kudu.repartition")),
        repartition_sort=parse_bool("kudu.repartition.sort",
                                    _get(options, "kudu.repartition.sort"), default=True),
        handle_schema_drift=parse_bool("kudu.handleSchemaDrift",
                                       _get(options, "kudu.handleSchemaDrift")),
        stream_id=None if stream_id is None else stream_id_option(stream_id),
        small_write_bytes=small,
    )


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    """The scan options in ``options`` (see the module docstring for each).

    Raises:
        InvalidArgumentError: missing ``kudu.table``, an unknown ``kudu.*`` option or a
            malformed value.
        NotSupportedError: ``kudu.snapshotTimestampMicros`` (use ``kudu.snapshotIndex``);
            ``kudu.splitSizeBytes`` (one partition per tablet).
    """
    _check_known(options)
    table = _table(options)
    split = _get(options, "kudu.splitSizeBytes")
    if split is not None:
        raise NotSupportedError(
            f"kudu.splitSizeBytes={split} is not supported: scans are one Spark partition per "
            f"tablet, and splitting a tablet by size is not supported yet; drop the option "
            f"(partitioning the table into more tablets gives more scan partitions)")
    if _get(options, "kudu.snapshotTimestampMicros") is not None:
        raise NotSupportedError(
            "kudu.snapshotTimestampMicros is not supported: pyspark-kudu snapshots are Raft "
            "log indexes, not timestamps; use kudu.snapshotIndex=<index>, or "
            "kudu.faultTolerantScan=true to fix the snapshot when the query is planned")
    locality = (_get(options, "kudu.scanLocality") or "closest_replica").strip().lower()
    if locality not in _LOCALITIES:
        raise InvalidArgumentError(
            f"unknown kudu.scanLocality {locality!r}: use one of {list(_LOCALITIES)}")
    batch = _parse_int("kudu.batchSize", _get(options, "kudu.batchSize"), minimum=1)
    mode = (_get(options, "kudu.readMode") or "read_latest").strip().lower()
    if mode not in _READ_MODES:
        raise InvalidArgumentError(
            f"unknown kudu.readMode {mode!r}: use one of {list(_READ_MODES)} (a snapshot "
            f"read is kudu.snapshotIndex)")
    fault_tolerant = parse_bool("kudu.faultTolerantScan", _get(options, "kudu.faultTolerantScan"))
    snapshot_index = _parse_int("kudu.snapshotIndex", _get(options, "kudu.snapshotIndex"),
                                minimum=0)
    if mode == "linearizable" and (fault_tolerant or snapshot_index is not None):
        raise InvalidArgumentError(
            "kudu.readMode=linearizable reads the latest committed state; it cannot be "
            "combined with kudu.snapshotIndex or kudu.faultTolerantScan")
    return ReadOptions(
        table=table, master=_master(options), scan_locality=locality,
        snapshot_index=snapshot_index, fault_tolerant=fault_tolerant, read_mode=mode,
        batch_size=DEFAULT_BATCH_SIZE if batch is None else batch,
    )


def stream_id_option(value: str) -> str:
    """A ``kudu.streamId`` checked to be usable as a file name (it names the stream's
    committed-batch record under the warehouse).

    Raises:
        InvalidArgumentError: empty, longer than 128 characters, or other characters than
            letters, digits, ``.``, ``_`` and ``-`` (not starting with ``.``).
    """
    v = value.strip()
    ok = (0 < len(v) <= 128 and not v.startswith(".")
          and all(c.isascii() and (c.isalnum() or c in "._-") for c in v))
    if not ok:
        raise InvalidArgumentError(
            f"kudu.streamId {value!r} is not usable: use 1-128 letters, digits, '.', '_' or "
            f"'-', not starting with '.'")
    return v


def check_master(option: str | None, session_addresses: Sequence[str]) -> None:
    """``kudu.master``, if given, must name the session's master group (in any order).

    Raises:
        InvalidArgumentError: it names other masters; only the master of the KuduContext
            that registered the source is reachable from the DataFrame API for now.
    """
    if option is None:
        return
    if set(parse_master_addresses(option)) != set(session_addresses):
        raise InvalidArgumentError(
            f"kudu.master={option} differs from this session's master "
            f"{','.join(session_addresses)}: the kudu data source only reaches the master of "
            f"the KuduContext that registered it; create a KuduContext(spark, master=...) for "
            f"that cluster (the latest one registered serves format('kudu')), or drop the "
            f"option")


def check_write_columns(names: Sequence[str], schema: Schema, table: str,
                        handle_schema_drift: bool = False,
                        struct: StructType | None = None) -> None:
    """The DataFrame's columns against the table (same rules and texts as
    :meth:`KuduContext.write`): no column the table lacks, every key column present, and,
    given the DataFrame's ``struct``, no column of another type family
    (:meth:`~pyspark_kudu.schema.Schema.check_write_types`).

    Raises:
        InvalidArgumentError: naming the offending columns; nothing is written.
        NotSupportedError: ``kudu.handleSchemaDrift=true`` with extra columns (adding
            columns needs ALTER TABLE, which pyspark-kudu does not have yet).
    """
    unknown = [c for c in names if not schema.has_column(c)]
    if unknown and handle_schema_drift:
        raise NotSupportedError(
            f"table {table}: kudu.handleSchemaDrift=true would add the DataFrame columns "
            f"{unknown} to the table, but adding columns needs ALTER TABLE, which pyspark-kudu "
            f"does not support yet; drop or rename them")
    if unknown:
        raise InvalidArgumentError(
            f"table {table}: DataFrame columns {unknown} are not in the table schema "
            f"{schema.names}; drop or rename them")
    missing = [k for k in schema.primary_key if k not in names]
    if missing:
        raise InvalidArgumentError(
            f"table {table}: the DataFrame lacks primary key columns {missing}")
    if struct is not None:
        schema.check_write_types(struct, table)


# -- filters -------------------------------------------------------------------------------

_COMPARISON_OPS: dict[type[Filter], PredicateOp] = {
    EqualTo: PredicateOp.EQ, GreaterThan: PredicateOp.GT, GreaterThanOrEqual: PredicateOp.GE,
    LessThan: PredicateOp.LT, LessThanOrEqual: PredicateOp.LE,
}


def _column(attribute: tuple[str, ...], schema: Schema) -> str | None:
    if len(attribute) != 1 or not schema.has_column(attribute[0]):
        return None  # a nested field, or not a column of this table
    return attribute[0]


def _value_fits(t: pa.DataType, value: Any) -> bool:
    """Whether comparing a column of type ``t`` with ``value`` in Arrow means what it
    means in Spark (see the module docstring)."""
    if value is None or pa.types.is_floating(t):
        return False
    if pa.types.is_timestamp(t):
        if not isinstance(value, dt.datetime):
            return False
        aware = value.tzinfo is not None and value.utcoffset() is not None
        return aware == (t.tz is not None)
    if pa.types.is_date32(t) and isinstance(value, dt.datetime):
        return False  # a datetime would be truncated to its date
    return not (pa.types.is_boolean(t) and not isinstance(value, bool))


def _translate(f: Filter, schema: Schema) -> Predicate | None:
    pred: Predicate | None = None
    if isinstance(f, Not):
        inner = f.child
        if isinstance(inner, EqualTo):
            col = _column(inner.attribute, schema)
            if col is not None and _value_fits(schema.column(col).type, inner.value):
                pred = Predicate(col, PredicateOp.NE, inner.value)
    elif isinstance(f, (IsNull, IsNotNull)):
        col = _column(f.attribute, schema)
        if col is not None:
            pred = (Predicate.is_null(col) if isinstance(f, IsNull)
                    else Predicate.is_not_null(col))
    elif isinstance(f, In):
        col = _column(f.attribute, schema)
        values = tuple(f.value)
        if col is not None and values and all(
                _value_fits(schema.column(col).type, v) for v in values):
            pred = Predicate.in_(col, values)
    elif type(f) in _COMPARISON_OPS:
        attribute: tuple[str, ...] = f.attribute  # type: ignore[attr-defined]
        value: Any = f.value  # type: ignore[attr-defined]
        col = _column(attribute, schema)
        if col is not None and _value_fits(schema.column(col).type, value):
            pred = Predicate(col, _COMPARISON_OPS[type(f)], value)
    if pred is None:
        return None
    try:
        return pred.bind(schema)  # the value must be exactly representable in the column
    except (InvalidArgumentError, ValueError, TypeError):
        return None


def translate_filters(filters: Iterable[Filter], schema: Schema
                      ) -> tuple[list[Predicate], list[Filter]]:
    """Split Spark's pushed filters into predicates the scan evaluates exactly and the
    filters Spark must still evaluate (returned by reference, as ``pushFilters`` requires).
    """
    handled: list[Predicate] = []
    rest: list[Filter] = []
    for f in filters:
        pred = _translate(f, schema)
        if pred is None:
            rest.append(f)
        else:
            handled.append(pred)
    return handled, rest


def warn_repartition(options: WriteOptions) -> None:
    """Log that ``kudu.repartition=true`` cannot be honoured by a Python data source."""
    if options.repartition:
        _log.warning(
            "table %s: kudu.repartition=true has no effect on df.write.format('kudu'): a "
            "Python data source writer receives the DataFrame's partitions as Spark planned "
            "them; use KuduContext.write(df, table, repartition=True) or repartition the "
            "DataFrame before writing (rows are still routed to the right tablets)",
            options.table)
