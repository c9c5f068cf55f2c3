"""The rows of a *driver-side* DataFrame as Arrow batches, read in the driver without a Spark
job.

Two kinds of DataFrame hold their rows in the driver already:

* ``spark.createDataFrame`` of a pandas DataFrame or a ``pyarrow.Table`` (and ``spark.sql``'s
  ``VALUES``) gives a plan whose optimized form is a ``LocalRelation``: ``collect()`` returns
  its rows without scheduling a job.
* ``spark.createDataFrame`` of a Python list (or a list of ``Row``\\ s, dicts or tuples) gives a
  ``LogicalRDD`` over PySpark's conversion of ``sc.parallelize``: a ``ParallelCollectionRDD``
  whose partitions hold the pickled rows *in the driver JVM*, PySpark's identity re-serializing
  map (a ``PythonRDD``) and three JVM maps that unpickle them into rows of the schema
  (``applySchemaToPythonRDD``). Collecting it would run a job whose every task starts a Python
  worker; instead the pickled batches are read from the partitions (a few Py4J calls) and
  unpickled here, and ``StructType.fromInternal`` turns them into the rows ``collect()`` would
  return. Only that exact lineage qualifies: the ``PythonRDD``'s function must be PySpark's own
  identity map (a user's ``rdd.map(f)`` pipelines ``f`` into it, and ``f`` is never run in
  the driver), and any projection or filter on top makes the plan something else. (The
  function is recognized by its code's qualified name, which needs Python 3.11; on 3.10 such
  DataFrames take the staging job.)

A small write of such a DataFrame is encoded in the driver and replicated in one round: no
staging job at all (:meth:`~pyspark_kudu.spark.api.writes.WritePath.write`). Whatever this
module cannot read (another plan, a lineage it does not recognize, values that do not convert,
more bytes than the caller allows) returns ``None`` and the write takes the staging job, which
is always correct.

The batches have the Arrow types Spark's own ``mapInArrow`` would hand a staging task
(:func:`pyspark.sql.pandas.types.to_arrow_schema`, timestamps in UTC), so encoding validates
them exactly as on the staged path.

Thread-safety: stateless.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import logging
import pickle
import struct
from typing import Any

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, Row
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
    StructType,
    TimestampNTZType,
    TimestampType,
)

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
# The Python types of the values ``collect()`` returns, per column type (the table's types).
_PYTHON_TYPES: dict[type[DataType], tuple[type, ...]] = {
    BooleanType: (bool,), ByteType: (int,), ShortType: (int,), IntegerType: (int,),
    LongType: (int,), FloatType: (float,), DoubleType: (float,), StringType: (str,),
    BinaryType: (bytes, bytearray), DecimalType: (decimal.Decimal,), DateType: (dt.date,),
    TimestampType: (dt.datetime,), TimestampNTZType: (dt.datetime,)}


def local_batches(df: DataFrame, max_plan_bytes: int) -> list[pa.RecordBatch] | None:
    """``df``'s rows as Arrow batches if they live in the driver (a ``LocalRelation`` whose
    estimated size, or a parallelized Python collection whose pickled size, is at most
    ``max_plan_bytes``); ``None`` otherwise (the caller stages them with a job). Never runs a
    Spark job."""
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        kind = plan.getClass().getSimpleName()
        if kind == "LocalRelation":
            if int(str(plan.stats().sizeInBytes())) > max_plan_bytes:  # a BigInt
                return None
            rows: list[Row] | None = df.collect()  # LocalTableScanExec.executeCollect: no job
        elif kind == "LogicalRDD":
            rows = _parallelized_rows(df, plan, max_plan_bytes)
        else:
            return None
    except Py4JError:  # a plan this code does not know how to inspect: take the job
        _log.debug("could not inspect the plan of a DataFrame to write", exc_info=True)
        return None
    if rows is None:
        return None
    if not rows:
        return []
    schema = to_arrow_schema(df.schema, timezone="UTC")
    try:
        arrays = [pa.array([_arrow_value(r[i], field.type) for r in rows], type=field.type)
                  for i, field in enumerate(schema)]
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        # Only a collection made with verifySchema=False can hold such values; Spark's own
        # conversion decides what they become, in the staging job.
        _log.debug("driver-side rows did not convert to Arrow", exc_info=True)
        return None
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=schema).to_batches()
    return batches


def _parallelized_rows(df: DataFrame, plan: Any, max_bytes: int) -> list[Row] | None:
    """The rows of a ``createDataFrame(list)`` plan read from the driver JVM, or ``None`` if
    ``plan`` is not exactly that lineage or holds more than ``max_bytes`` pickled bytes."""
    rdd = plan.rdd()
    for _ in range(_JVM_MAPS):
        deps = rdd.dependencies()
        if rdd.getClass().getSimpleName() != "MapPartitionsRDD" or deps.size() != 1:
            return None
        rdd = deps.head().rdd()
    deps = rdd.dependencies()
    if rdd.getClass().getName() != _PYTHON_RDD or deps.size() != 1:
        return None
    source = deps.head().rdd()
    if source.getClass().getName() != _COLLECTION_RDD:
        return None
    deserializer = _identity_map_input(rdd)
    if deserializer is None:
        return None
    framed = io.BytesIO()
    size = 0
    for part in source.partitions():
        records = part.iterator()
        while records.hasNext():
            record = bytes(records.next())
            size += len(record)
            if size > max_bytes:
                return None
            framed.write(struct.pack("!i", len(record)))
            framed.write(record)
    framed.seek(0)
    from_internal = df.schema.fromInternal
    try:
        rows = [from_internal(obj) for obj in deserializer.load_stream(framed)]
    except (TypeError, ValueError, AttributeError, IndexError, OverflowError):
        rows = None
    if rows is None or not _typed_as_schema(rows, df.schema):
        # Only a collection made with verifySchema=False can hold such values (a float in a
        # LongType column): Spark's own conversion decides what they become, in the job.
        _log.debug("driver-side rows do not have their schema's types")
        return None
    return rows


def _typed_as_schema(rows: list[Row], schema: StructType) -> bool:
    """Whether every value is None or of the Python type ``collect()`` returns for its
    column (what ``createDataFrame``'s schema verification guarantees)."""
    for i, field in enumerate(schema.fields):
        allowed = _PYTHON_TYPES.get(type(field.dataType))
        if allowed is None:
            return False
        if any(r[i] is not None and type(r[i]) not in allowed for r in rows):
            return False
    return True


def _identity_map_input(python_rdd: Any) -> Any | None:
    """The deserializer of ``python_rdd``'s input if its function is PySpark's identity
    re-serializing map, else ``None``. The function is a private field of the JVM object
    (read by reflection) holding the command PySpark pickled in this driver."""
    field = python_rdd.getClass().getDeclaredField("func")
    field.setAccessible(True)
    command = bytes(field.get(python_rdd).command().unsafeArray())
    try:
        func, _profiler, deserializer, _serializer = pickle.loads(command)
    except (ValueError, TypeError):  # a broadcast command (only for large functions)
        return None
    code = getattr(func, "__code__", None)
    cells = [c.cell_contents for c in getattr(func, "__closure__", None) or ()]
    if getattr(code, "co_qualname", None) != _MAP_FUNC or len(cells) != 1:
        return None
    if getattr(getattr(cells[0], "__code__", None), "co_qualname", None) != _IDENTITY:
        return None
    return deserializer


def _arrow_value(v: Any, t: pa.DataType) -> Any:
    # PySpark returns a TimestampType value as a naive datetime in the process' local time;
    # ``astimezone`` reads a naive datetime as local time, so the instant is kept.
    if v is not None and pa.types.is_timestamp(t) and t.tz is not None:
        return v.astimezone(dt.timezone.utc)
    return v
