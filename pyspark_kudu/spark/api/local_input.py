"""The rows of a *local* DataFrame as Arrow batches, read in the driver without a Spark job.

``spark.createDataFrame`` of a pandas DataFrame or a ``pyarrow.Table`` (and ``spark.sql``'s
``VALUES``) gives a plan whose optimized form is a ``LocalRelation``: its rows already live in
the driver, and ``collect()`` returns them without scheduling a job. A small write of such a
DataFrame is encoded in the driver and replicated in one round: no staging job at all
(:meth:`~pyspark_kudu.spark.api.writes.WritePath.write`). ``createDataFrame`` of a Python
list is not local (PySpark parallelizes it into an RDD), so it takes the staging job.

The batches have the Arrow types Spark's own ``mapInArrow`` would hand a staging task
(:func:`pyspark.sql.pandas.types.to_arrow_schema`, timestamps in UTC), so encoding validates
them exactly as on the staged path.

Thread-safety: stateless.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

__all__ = ["local_batches"]

_log = logging.getLogger(__name__)


def local_batches(df: DataFrame, max_plan_bytes: int) -> list[pa.RecordBatch] | None:
    """``df``'s rows as Arrow batches if its optimized plan is a ``LocalRelation`` whose
    estimated size is at most ``max_plan_bytes``; ``None`` otherwise (the caller stages
    them with a job). Never runs a Spark job."""
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        if plan.getClass().getSimpleName() != "LocalRelation":
            return None
        if int(str(plan.stats().sizeInBytes())) > max_plan_bytes:  # a BigInt
            return None
    except Py4JError:  # a plan this code does not know how to inspect: take the job
        _log.debug("could not inspect the plan of a DataFrame to write", exc_info=True)
        return None
    schema = to_arrow_schema(df.schema, timezone="UTC")
    rows = df.collect()  # a LocalRelation: LocalTableScanExec.executeCollect, no job
    if not rows:
        return []
    arrays = [pa.array([_arrow_value(r[i], field.type) for r in rows], type=field.type)
              for i, field in enumerate(schema)]
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=schema).to_batches()
    return batches


def _arrow_value(v: Any, t: pa.DataType) -> Any:
    # PySpark returns a TimestampType value as a naive datetime in the process' local time;
    # ``astimezone`` reads a naive datetime as local time, so the instant is kept.
    if v is not None and pa.types.is_timestamp(t) and t.tz is not None:
        return v.astimezone(dt.timezone.utc)
    return v
