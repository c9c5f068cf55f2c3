"""What the driver runs to replicate: per-tablet leaders (a ``RaftNode`` each), replication
rounds as pinned Spark barrier stages, round-level group commit and leadership leases.

Depends on :mod:`~pyspark_kudu.spark.host` (what a pinned task runs), never on
:mod:`~pyspark_kudu.spark.api`."""
