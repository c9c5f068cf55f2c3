"""What runs on an executor host: the tablet server's identity (data root, ``instance``
file), the pinned request handlers, the per-process replica cache, staged write batches,
tablet copy, and the executor's Python daemon that pre-imports all of it.

Imports nothing from the driver-side packages (:mod:`~pyspark_kudu.spark.api`,
:mod:`~pyspark_kudu.spark.replication`, :mod:`~pyspark_kudu.spark.healing`)."""
