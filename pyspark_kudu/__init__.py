"""pyspark-kudu: Kudu-style replicated, location-aware tablet storage inside Apache Spark.

Public API (DESIGN §2), imported lazily so that executor-side imports of subpackages
(``pyspark_kudu.wal``, ``pyspark_kudu.tablet``) do not pull in the driver-side client:

- :class:`KuduContext` (``pyspark_kudu.spark.api.context``): tables, writes, pinned reads.
- :class:`Schema`, :class:`ColumnSchema`, :class:`Predicate` (``pyspark_kudu.schema``).
- :class:`PartitionSchema`, :class:`HashDimension`, :class:`RangePartition`.
- :mod:`pyspark_kudu.errors`: the exception hierarchy (:class:`KuduError` at its root).
"""

from __future__ import annotations

import importlib
from typing import Any

from pyspark_kudu import errors
from pyspark_kudu.errors import KuduError

__version__ = "0.1.0"

__all__ = [
    "ColumnSchema",
    "HashDimension",
    "KuduContext",
    "KuduError",
    "PartitionSchema",
    "Predicate",
    "RangePartition",
    "Schema",
    "__version__",
    "errors",
]

_WHERE = {
    "KuduContext": "pyspark_kudu.spark.api.context",
    "Schema": "pyspark_kudu.schema",
    "ColumnSchema": "pyspark_kudu.schema",
    "Predicate": "pyspark_kudu.schema",
    "PartitionSchema": "pyspark_kudu.partitioning",
    "HashDimension": "pyspark_kudu.partitioning",
    "RangePartition": "pyspark_kudu.partitioning",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
