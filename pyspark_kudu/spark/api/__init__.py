"""What users call: ``KuduContext``, the ``kudu`` DataFrame source and its options, the
session service that source talks to, and the helpers the ``jobs/`` scripts share.

Depends on :mod:`~pyspark_kudu.spark.replication`, :mod:`~pyspark_kudu.spark.host` and
:mod:`~pyspark_kudu.spark.healing`; nothing below imports this package."""
