"""A second Spark application writing to a table another application writes: run by
``test_two_writers.py`` as its own driver process (one SparkContext per process).

    python tests/cluster/second_writer.py SPARK_MASTER KUDU_MASTER TABLE FIRST COUNT WAREHOUSE

It waits for an executor on every worker host, upserts ids FIRST..FIRST+COUNT-1 and prints
one JSON line: rows written and the terms it led the table's tablets in (none if it forwarded
its write to the application holding the tablets' leadership leases).
``SECOND_WRITER_LEASE_S`` sets its ``lease_s`` (0: no leases, it elects itself and fences).
"""

from __future__ import annotations

import json
import os
import sys

from pyspark_kudu.errors import TimedOutError
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.testing.standalone_cluster import cluster_session


def main(argv: list[str]) -> int:
    spark_master, kudu_master, table, first, count, warehouse = argv
    hosts = int(os.environ.get("SECOND_WRITER_HOSTS", "6"))
    try:
        spark = cluster_session(spark_master, "second-writer", hosts, deadline_s=180)
    except TimedOutError as e:
        print(json.dumps({"error": f"executors did not come up on every worker host: {e}"}))
        return 1
    try:
        lease = os.environ.get("SECOND_WRITER_LEASE_S")
        with KuduContext(spark, master=kudu_master, warehouse=warehouse,
                         lease_s=None if lease is None else float(lease)) as kudu:
            schema = kudu.master.get_table(table).table.schema.to_spark()
            rows = [(i, f"b{i}") for i in range(int(first), int(first) + int(count))]
            summary = kudu.upsert_rows(spark.createDataFrame(rows, schema), table)
            terms = sorted({lead.node.term for lead in kudu._leaders.values()
                            if lead.node is not None})
            print(json.dumps({"rows_written": summary.rows_written, "terms": terms}))
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
