"""Demo: the consensus story, then a replicated table written and read through Spark.

Part 1 drives a 3-replica Raft group in-process: election, commits, leader loss, rejoin.
Part 2 starts a local SparkSession with 3 virtual tablet servers and an embedded master,
creates an RF=3 table, writes rows (with a duplicate to show Kudu's per-row errors), and reads
them back through scans. Part 3 runs ``spark-submit jobs/ingest.py`` on a generated CSV
(embedded master, local mode) and prints the ksck summary.

    python jobs/demo.py [--seed N] [--rows N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from pyspark_kudu.consensus.demo import run_demo


def table_demo(rows: int, say: object = print, spark: object = None) -> int:
    """Create, write, read; returns the number of rows read back. Uses ``spark`` if given
    (and leaves it running), else starts and stops a local session."""
    assert callable(say)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from pyspark_kudu import HashDimension, KuduContext, PartitionSchema, Predicate
    from pyspark_kudu.errors import RowWriteError

    own = spark is None
    if own:
        spark = (SparkSession.builder.master("local[2]").appName("pyspark-kudu-demo")
                 .config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    assert isinstance(spark, SparkSession)
    schema = StructType([StructField("id", LongType(), False), StructField("name", StringType())])
    try:
        with KuduContext(spark, warehouse=tempfile.mkdtemp(prefix="kudu-demo-")) as kudu:
            kudu.create_table("people", schema, keys=["id"], replicas=3,
                              partitioning=PartitionSchema((HashDimension(("id",), 3),)))
            locs = kudu.master.get_table("people")
            say(f"created table 'people': {len(locs.tablets)} tablets x 3 replicas on "
                f"{len(kudu.servers)} tablet servers")
            df = spark.createDataFrame([(i, f"person-{i}") for i in range(rows)], schema)
            s = kudu.insert_rows(df, "people")
            say(f"inserted {s.rows_written} rows into {s.tablets} tablets (committed on a "
                f"majority of each tablet's replicas)")
            try:
                kudu.insert_rows(spark.createDataFrame([(0, "dup"), (rows, "new")], schema),
                                 "people")
            except RowWriteError as e:
                say(f"per-row errors as in Kudu: {e.errors[0][2]} for id "
                    f"{e.errors[0][1]['id']}; {e.rows_written} other row written")
            n = kudu.read_table("people").count()
            one = kudu.read_table("people", predicates=[Predicate.eq("id", 7)]).collect()
            say(f"read back {n} rows; id=7 -> {one[0]['name']} (pruned to 1 tablet)")
            return n
    finally:
        if own:
            spark.stop()


def ingest_command(source: str, warehouse: str, table: str = "events") -> list[str]:
    """The part-3 command: ``spark-submit jobs/ingest.py`` on the embedded default master
    (local mode), creating an RF=3 table from a CSV and ending with the ksck summary."""
    from pyspark_kudu.spark.host.daemon import SESSION_CONF
    from pyspark_kudu.testing.standalone_cluster import spark_home

    confs = [a for k, v in SESSION_CONF for a in ("--conf", f"{k}={v}")]
    log4j = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf",
                         "log4j2.properties")  # Spark's log at WARN: the job's lines show
    return [os.path.join(spark_home(), "bin", "spark-submit"), "--master", "local[2]",
            "--conf", "spark.ui.enabled=false", *confs,
            "--driver-java-options", f"-Dlog4j2.configurationFile={log4j}",
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "ingest.py"),
            "--source", source, "--format", "csv", "--table", table, "--create",
            "--keys", "id", "--hash-buckets", "3", "--replicas", "3",
            "--warehouse", warehouse, "--ksck"]


def ingest_demo(rows: int) -> int:
    """Write a CSV of ``rows`` rows and ingest it with spark-submit; returns its exit code."""
    import subprocess

    work = tempfile.mkdtemp(prefix="kudu-ingest-demo-")
    src = os.path.join(work, "events.csv")
    with open(src, "w", encoding="utf-8") as f:
        f.write("id,name,score\n")
        f.writelines(f"{i},user-{i},{i * 0.5}\n" for i in range(rows))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = ingest_command(src, os.path.join(work, "warehouse"))
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, check=False).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=7, help="seed of the simulated network")
    parser.add_argument("--rows", type=int, default=100, help="rows to write in part 2")
    args = parser.parse_args()
    print("== part 1: Raft consensus, in-process ==")
    run_demo(args.seed, print)
    print("== part 2: a replicated table in Spark ==")
    table_demo(args.rows)
    print("== part 3: spark-submit jobs/ingest.py, then ksck ==")
    sys.exit(ingest_demo(args.rows * 10))


if __name__ == "__main__":
    main()
