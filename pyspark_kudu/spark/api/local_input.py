"""The rows of a *driver-side* DataFrame as Arrow batches, read in the driver without a Spark
job.

Two kinds of DataFrame hold their rows in the driver already:

* ``spark.createDataFrame`` of a pandas DataFrame or a ``pyarrow.Table`` (and ``spark.sql``'s
  ``VALUES``) gives a plan whose optimized form is a ``LocalRelation``: its rows (Spark's
  internal rows, in the driver JVM) are turned into Arrow there by Spark's own converter, the
  one behind ``mapInArrow`` and ``toArrow`` (``ArrowConverters``, looked up once per driver
  JVM), and the Arrow IPC bytes come back through Py4J. ``collect()`` would return them
  without a job too, but plans and runs a SQL execution per call (11 ms for a 1-row
  DataFrame here, 55-67 ms each under 16 writer threads, against 1-4 ms and 17-22 ms); it is
  what remains where that converter is missing or gives other Arrow types.
* ``spark.createDataFrame`` of a Python list (or a list of ``Row``\\ s, dicts or tuples) gives a
  ``LogicalRDD`` over PySpark's conversion of ``sc.parallelize``: a ``ParallelCollectionRDD``
  whose partitions hold the pickled rows *in the driver JVM*, PySpark's identity re-serializing
  map (a ``PythonRDD``) and three JVM maps that unpickle them into rows of the schema
  (``applySchemaToPythonRDD``). Collecting it would run a job whose every task starts a Python
  worker; instead the pickled batches are read from the driver JVM's collection (a few through
  Py4J, more streamed over one local socket as PySpark's own ``collect()`` streams results),
  unpickled here, and their values, in Spark's internal form (dates as days, timestamps as
  microseconds, as the JVM receives them), go straight into Arrow arrays. Only that exact
  lineage qualifies: the ``PythonRDD``'s function must be PySpark's own identity map (a
  user's ``rdd.map(f)`` pipelines ``f`` into it, and ``f`` is never run in the driver),
  values must have the internal types schema verification guarantees (``verifySchema=False``
  can let others in: Spark converts those its own way, in the job), and any projection or
  filter on top makes the plan something else. (The function is recognized by its code's
  qualified name, which needs Python 3.11; on 3.10 such DataFrames take the staging job.)

A small write of such a DataFrame is encoded in the driver and replicated in one round: no
staging job at all (:meth:`~pyspark_kudu.spark.api.writes.WritePath.write`). Whatever this
module cannot read (another plan, a lineage it does not recognize, values that do not convert,
more bytes than the caller allows) returns ``None`` and the write takes the staging job, which
is always correct.

The batches have the Arrow types Spark's own ``mapInArrow`` would hand a staging task
(:func:`pyspark.sql.pandas.types.to_arrow_schema`, timestamps in UTC), so encoding validates
them exactly as on the staged path.

What it looks up by reflection (the private fields it reads, a ``ClassTag``, the
converter) is looked up once per driver JVM, and the verdict on each pickled function is
kept: a 1-row list-built write makes 15 Py4J calls here instead of 43 (they queue for the
driver JVM when many threads write).

Thread-safety: thread-safe (those caches are shared under a lock).
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import logging
import pickle
import re
import struct
import threading
from typing import Any

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark import SparkContext
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)
from pyspark.util import _create_local_socket

from pyspark_kudu.spark.jvm import gateway_cache, gateway_cached, scala_object

__all__ = ["local_batches"]

_log = logging.getLogger(__name__)

# The lineage of ``createDataFrame(list)`` below its LogicalRDD, top down: the three JVM maps
# of ``applySchemaToPythonRDD`` (row conversion, ``SerDeUtil.toJavaArray``,
# ``SerDeUtil.pythonToJava``), then PySpark's re-serializing ``PythonRDD`` over the
# parallelized collection.
_JVM_MAPS = 3
_PYTHON_RDD = "org.apache.spark.api.python.PythonRDD"
_COLLECTION_RDD = "org.apache.spark.rdd.ParallelCollectionRDD"
_MAP_FUNC = "RDD.map.<locals>.func"
_IDENTITY = "RDD._reserialize.<locals>.<lambda>"
# ``createDataFrame(list)``'s lineage in ``RDD.toDebugString``, top down (class simple names).
_LINEAGE = ("MapPartitionsRDD",) * _JVM_MAPS + ("PythonRDD", "ParallelCollectionRDD")
# One line of it: ``(partitions) `` on the first, `` |  `` (a narrow dependency, one level
# down) on the others, an optional RDD name, then ``Class[id] at``.
_DEBUG_LINE = re.compile(r"^(?:\(\d+\) | \|  )(?:.*? )?(\w+)\[\d+\] at ")
_NARROW = " |  "
_FRAME = struct.Struct("!i")  # PySpark's framing: a big-endian int32 length, then the bytes
# What a Py4J call into the driver JVM may raise: PySpark turns some Java exceptions
# (``IllegalArgumentException``: a field read from an object of another class) into its own.
_JVM_ERRORS = (Py4JError, PySparkException)
# Collections of at most this many pickled records are fetched through Py4J, not a socket.
_DIRECT_RECORDS = 4
# The Python types of Spark's internal form of a value, per column type (the table's types),
# as ``createDataFrame``'s schema verification and ``toInternal`` leave them.
_INTERNAL_TYPES: dict[type[DataType], frozenset[type]] = {
    kind: frozenset((*types, type(None))) for kind, types in {
        BooleanType: (bool,), ByteType: (int,), ShortType: (int,), IntegerType: (int,),
        LongType: (int,), FloatType: (float,), DoubleType: (float,), StringType: (str,),
        BinaryType: (bytes, bytearray), DecimalType: (decimal.Decimal,), DateType: (int,),
        TimestampType: (int,), TimestampNTZType: (int,)}.items()}


def local_batches(df: DataFrame, max_plan_bytes: int) -> list[pa.RecordBatch] | None:
    """``df``'s rows as Arrow batches if they live in the driver (a ``LocalRelation`` whose
    estimated size, or a parallelized Python collection whose pickled size, is at most
    ``max_plan_bytes``); ``None`` otherwise (the caller stages them with a job). Never runs a
    Spark job."""
    schema = to_arrow_schema(df.schema, timezone="UTC")
    try:
        plan, kind = _driver_side_plan(df)
        if kind == "LogicalRDD":
            return _parallelized_batches(df, plan, max_plan_bytes, schema)
        if kind != "LocalRelation":
            return None
        if int(str(plan.stats().sizeInBytes())) > max_plan_bytes:  # a BigInt
            return None
        converted = _relation_batches(df.sparkSession.sparkContext, plan, schema)
        if converted is not None:
            return converted
        rows = df.collect()  # LocalTableScanExec.executeCollect: no job
    except _JVM_ERRORS:  # a plan this code does not know how to inspect: take the job
        _log.debug("could not inspect the plan of a DataFrame to write", exc_info=True)
        return None
    if not rows:
        return []
    arrays = [pa.array([_arrow_value(v, field.type) for v in col], type=field.type)
              for col, field in zip(zip(*rows, strict=True), schema, strict=True)]
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=schema).to_batches()
    return batches


_DRIVER_SIDE = ("LogicalRDD", "LocalRelation")
_ARROW_CONVERTERS = "org.apache.spark.sql.execution.arrow.ArrowConverters$"
# Batches as large as the relation: a small write's rows are one batch, as they were when
# built from ``collect()``'s rows.
_MAX_RECORDS = (1 << 31) - 1
_MAX_BATCH_BYTES = 1 << 62


def _relation_batches(sc: SparkContext, plan: Any, schema: pa.Schema
                      ) -> list[pa.RecordBatch] | None:
    """A ``LocalRelation``'s rows converted to Arrow in the driver JVM by Spark's
    ``ArrowConverters`` (its private ``toBatchWithSchemaIterator``: one Arrow IPC stream per
    batch, timestamps in UTC as ``schema`` has them); ``None`` if this Spark has no such
    converter or its batches do not have exactly ``schema`` (then ``collect()`` reads them).
    About 8 Py4J calls, no SQL execution."""
    converters = scala_object(sc, _ARROW_CONVERTERS)
    if converters is None:
        return None
    frames: list[bytes] = []
    try:
        batches = converters.toBatchWithSchemaIterator(
            plan.data().iterator(), plan.schema(), _MAX_RECORDS, _MAX_BATCH_BYTES, "UTC",
            False, False)
        try:
            while batches.hasNext():
                frames.append(bytes(batches.next()))
        finally:
            batches.close()  # its Arrow memory, were the rows not all read
    except _JVM_ERRORS:  # another Spark's signature: collect() reads them
        _log.debug("ArrowConverters could not convert a local relation", exc_info=True)
        return None
    out: list[pa.RecordBatch] = []
    try:
        for frame in frames:
            with pa.ipc.open_stream(frame) as reader:
                if not reader.schema.equals(schema):
                    _log.debug("ArrowConverters gave %s, not %s", reader.schema, schema)
                    return None
                out.extend(reader)
    except pa.ArrowInvalid:
        _log.debug("unreadable Arrow from ArrowConverters", exc_info=True)
        return None
    return out


def _driver_side_plan(df: DataFrame) -> tuple[Any, str]:
    """``df``'s plan and its kind (the plan node's class name): the analyzed plan when it
    is already one of the two this module reads (``createDataFrame``'s plans are; the
    analysis was done when ``df`` was made), else the optimized one (which may strip an
    alias or a no-op projection). Saves every small write of such a DataFrame a run of the
    optimizer in the driver JVM (~3 ms here, more under concurrent writers)."""
    qe = df._jdf.queryExecution()
    plan = qe.analyzed()
    kind = plan.nodeName()  # the class's simple name (for logical plans)
    if kind not in _DRIVER_SIDE:
        plan = qe.optimizedPlan()
        kind = plan.nodeName()
    return plan, kind


def _parallelized_batches(df: DataFrame, plan: Any, max_bytes: int, schema: pa.Schema
                          ) -> list[pa.RecordBatch] | None:
    """The rows of a ``createDataFrame(list)`` plan read from the driver JVM, or ``None`` if
    ``plan`` is not exactly that lineage, holds more than ``max_bytes`` pickled bytes or
    values its schema's verification would have refused."""
    sc = df.sparkSession.sparkContext
    found = _lineage(sc, plan.rdd())
    if found is None:
        return None
    python_rdd, source = found
    deserializer = _identity_map_input(python_rdd, _declared_field(sc, python_rdd, _PYTHON_RDD,
                                                                   "func"))
    if deserializer is None:
        return None
    framed = io.BytesIO()
    jvm = sc._jvm
    assert jvm is not None
    data = _declared_field(sc, source, _COLLECTION_RDD, "data")
    if _read_collection(source, jvm, framed, max_bytes, data_field=data) < 0:
        return None
    framed.seek(0)
    # Spark's internal form of each row (``StructType.toInternal``): a tuple per row with
    # dates as days and timestamps as microseconds since the epoch, what the JVM's
    # conversion receives too.
    rows = list(deserializer.load_stream(framed))
    if not rows:
        return []
    fields = df.schema.fields
    if set(map(type, rows)) != {tuple} or set(map(len, rows)) != {len(fields)}:
        return None
    arrays = []
    try:
        for col, field, arrow in zip(zip(*rows, strict=True), fields, schema, strict=True):
            kind = type(field.dataType)
            if not set(map(type, col)) <= _INTERNAL_TYPES.get(kind, frozenset()):
                return None  # only createDataFrame(..., verifySchema=False) lets such in
            if kind is DateType:
                arrays.append(pa.array(col, pa.int32()).cast(arrow.type))
            elif kind in (TimestampType, TimestampNTZType):
                arrays.append(pa.array(col, pa.int64()).cast(arrow.type))
            else:
                arrays.append(pa.array(col, type=arrow.type))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        # A value out of its type's range, or a decimal with more digits than its scale:
        # Spark's own conversion decides what they become, in the staging job.
        _log.debug("driver-side rows did not convert to Arrow", exc_info=True)
        return None
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=schema).to_batches()
    return batches


def _lineage(sc: SparkContext, rdd: Any) -> tuple[Any, Any] | None:
    """The ``PythonRDD`` and the ``ParallelCollectionRDD`` under ``rdd`` if its lineage is
    exactly ``createDataFrame(list)``'s (see ``_LINEAGE``), else ``None``.

    In 5 Py4J calls, whatever the lineage: the lineage's text (``toDebugString``: one line
    per RDD, the class's simple name before ``[id]``; a second parent adds a line, a shuffle
    a ``+-`` line) tells its shape, then each RDD's first parent is one call
    (``firstParent``, with a ``ClassTag`` kept per gateway). Asking each RDD for its class
    and its dependencies took 27 calls a write, ~45 ms each under 16 concurrent writers on
    the 6-worker cluster: Py4J calls from many threads queue for the driver JVM."""
    lines = str(rdd.toDebugString()).splitlines()
    names = []
    for k, line in enumerate(lines):
        m = _DEBUG_LINE.match(line)
        if m is None or (k > 0) != line.startswith(_NARROW):
            return None
        names.append(m.group(1))
    if tuple(names) != _LINEAGE:
        return None
    jvm = sc._jvm
    assert jvm is not None
    tag = gateway_cache(sc, "ClassTag.Any", lambda: jvm.scala.reflect.ClassTag.Any())
    for _ in range(_JVM_MAPS):
        rdd = rdd.firstParent(tag)
    python_rdd = rdd
    return python_rdd, python_rdd.firstParent(tag)


# For a field this Spark's class does not have (cached per gateway like the others).
_ABSENT = object()


def _declared_field(sc: SparkContext, obj: Any, class_name: str, name: str) -> Any | None:
    """Field ``name`` of class ``class_name``, made accessible, looked up from ``obj`` once
    per gateway (3 Py4J calls saved per use); ``None`` if the class has no such field, or if
    ``obj``'s class is another when it is looked up. Once cached, the field is returned for
    any ``obj``: reading it from an object of another class raises (``_JVM_ERRORS``)."""
    key = f"{class_name}.{name}"
    found = gateway_cached(sc, key)
    if found is None:
        cls = obj.getClass()
        if cls.getName() != class_name:
            return None

        def look_up() -> Any:
            try:
                field = cls.getDeclaredField(name)
            except _JVM_ERRORS:  # another Spark's field layout
                _log.debug("no field %s in %s", name, class_name, exc_info=True)
                return _ABSENT
            field.setAccessible(True)
            return field

        found = gateway_cache(sc, key, look_up)
    return None if found is _ABSENT else found


def _read_collection(source: Any, jvm: Any, out: io.BytesIO, budget: int,
                     direct_max: int = _DIRECT_RECORDS, *, data_field: Any | None = None
                     ) -> int:
    """Copy every pickled record of a ``ParallelCollectionRDD``, in partition order and
    framed as PySpark frames them, to ``out`` while they fit ``budget`` bytes; returns the
    budget left (negative: they did not fit, reading stopped).

    The records come from the private ``data`` field the RDD's slices are cut from (read by
    reflection): at most ``direct_max`` of them one Py4J call each (a 1-row DataFrame's one
    record, ~0.1 ms), more over one local socket, as PySpark's own ``collect()`` streams
    results (~2 ms to set up, then fast: fetching records through Py4J converts them byte by
    byte, ~1 us per byte). Where the field is not there, a socket per partition.
    ``data_field``: that field, already looked up and accessible (:func:`_declared_field`)."""
    try:
        if data_field is None:
            data_field = source.getClass().getDeclaredField("data")
            data_field.setAccessible(True)
        data = data_field.get(source)
    except _JVM_ERRORS:  # another Spark's field layout, or a field of another class
        _log.debug("no data field in %s", source.getClass().getName(), exc_info=True)
        iterators = [part.iterator() for part in source.partitions()]
    else:
        n = data.length()
        if n <= direct_max:
            for k in range(n):
                record = bytes(data.apply(k))
                budget -= len(record)
                if budget < 0:
                    return budget
                out.write(_FRAME.pack(len(record)))
                out.write(record)
            return budget
        iterators = [data.iterator()]
    for records in iterators:
        budget = _read_frames(jvm.PythonRDD.serveIterator(  # (imported by PySpark)
            records, "pyspark-kudu driver-side rows"), out, budget)
        if budget < 0:
            return budget
    return budget


def _read_frames(sock_info: Any, out: io.BytesIO, budget: int) -> int:
    """Copy the length-framed records served at ``sock_info`` to ``out`` while they fit
    ``budget`` bytes; returns the budget left (negative: they did not fit, reading stopped)."""
    sockfile, sock = _create_local_socket(sock_info)
    try:
        while True:
            head = sockfile.read(_FRAME.size)
            if len(head) < _FRAME.size:
                return budget  # the end of the partition
            (n,) = _FRAME.unpack(head)
            if n < 0:  # PySpark's end-of-data marker; no other special length is sent here
                return budget
            budget -= n
            if budget < 0:
                return budget
            out.write(head)
            out.write(sockfile.read(n))
    finally:
        sockfile.close()
        sock.close()


def _identity_map_input(python_rdd: Any, func_field: Any | None) -> Any | None:
    """The deserializer of ``python_rdd``'s input if its function is PySpark's identity
    re-serializing map, else ``None``. The function is a private field of the JVM object
    (``func_field``, read by reflection) holding the command PySpark pickled in this
    driver; the answer for each distinct command is kept (every ``createDataFrame(list)``
    pickles the same one)."""
    if func_field is None:
        return None
    command = bytes(func_field.get(python_rdd).command().unsafeArray())
    with _commands_lock:
        if command in _commands:
            return _commands[command]
    try:
        func, _profiler, deserializer, _serializer = pickle.loads(command)
    except (ValueError, TypeError):  # a broadcast command (only for large functions)
        return None
    code = getattr(func, "__code__", None)
    cells = [c.cell_contents for c in getattr(func, "__closure__", None) or ()]
    if (getattr(code, "co_qualname", None) != _MAP_FUNC or len(cells) != 1
            or getattr(getattr(cells[0], "__code__", None), "co_qualname", None) != _IDENTITY):
        deserializer = None
    with _commands_lock:
        if len(_commands) >= _COMMANDS_KEPT:
            _commands.clear()
        _commands[command] = deserializer
    return deserializer


# Pickled ``PythonRDD`` commands seen -> the deserializer of an identity map's input, or
# None (another function); at most ``_COMMANDS_KEPT`` (a user's mapped RDDs add entries).
_commands: dict[bytes, Any] = {}
_commands_lock = threading.Lock()
_COMMANDS_KEPT = 16


def _arrow_value(v: Any, t: pa.DataType) -> Any:
    # PySpark returns a TimestampType value as a naive datetime in the process' local time;
    # ``astimezone`` reads a naive datetime as local time, so the instant is kept.
    if v is not None and pa.types.is_timestamp(t) and t.tz is not None:
        return v.astimezone(dt.timezone.utc)
    return v
