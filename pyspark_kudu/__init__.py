"""pyspark-kudu: Kudu-style replicated, location-aware tablet storage inside Apache Spark.

Public API only (DESIGN §2). Later issues add ``KuduContext``, ``connect`` and schema helpers.
"""

from pyspark_kudu import errors
from pyspark_kudu.errors import KuduError

__version__ = "0.1.0"

__all__ = ["KuduError", "__version__", "errors"]
