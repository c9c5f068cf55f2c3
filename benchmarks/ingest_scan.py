"""Ingest and scan through the DataFrame API on the standalone test cluster, one run.

1. RF=3 ingest of N rows x 5 columns with ``df.write.format("kudu")`` into a new table (6
   hash tablets; the time includes electing their leaders) against ``df.write.parquet`` of
   the same cached DataFrame. Goal: parquet time / kudu time >= 0.5.
   The write returns once committed on a majority; the time until every replica also
   applied it (the service's settle round) is reported too.
2. Full scan: the same aggregate over ``KuduContext.read_table`` (scan tokens preferring
   the replicas' hosts, DESIGN §1) and over ``spark.read.parquet``. Goal: >= 0.8.
3. Primary-key point lookup: Spark tasks and files touched, kudu vs parquet.
4. Reference only: ``deltalake.write_deltalake`` of the same rows as one Arrow table in this
   process (no Spark, no replication).

Both paths get a small warm-up write first, so neither pays the executors' first Python
worker and JVM start-up in the timed run. Phase timings of the kudu write (staging job,
replication rounds) are reported from the KuduContext's counters.

Run: ``.venv/bin/python benchmarks/ingest_scan.py [--rows 2000000] [--workers 6]``. Starts
its own cluster, prints a table and saves ``results/ingest_scan.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema
from pyspark_kudu.schema import Predicate
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.handlers import tablet_dir
from pyspark_kudu.tablet.superblock import Superblock
from pyspark_kudu.testing.benchdata import five_columns, keyed_schema
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _aggregate(df: DataFrame) -> tuple[Any, ...]:
    return tuple(df.agg(F.sum("a"), F.count("c"), F.max("b")).collect()[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, default=6)
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    r: dict[str, Any] = {"rows": args.rows, "workers": args.workers, "columns": 5}
    with StandaloneCluster(base / "cluster", workers=args.workers) as cluster:
        spark = cluster_session(cluster.master_url, "bench-ingest-scan", args.workers,
                                conf={"spark.sql.shuffle.partitions": str(args.workers)})
        try:
            r.update(_run(spark, args, base, cluster))
        finally:
            spark.stop()
    _report(r)
    return 0


def _run(spark: SparkSession, args: argparse.Namespace, base: Path,
         cluster: StandaloneCluster) -> dict[str, Any]:
    out: dict[str, Any] = {}
    df = five_columns(spark, args.rows, args.workers).cache()
    df.count()
    schema = keyed_schema(df)
    hashed = PartitionSchema((HashDimension(("id",), args.workers),))
    with KuduContext(spark, warehouse=str(base / "warehouse")) as kudu:
        # Warm-up of both paths (executors' Python workers, JVM code paths).
        small = five_columns(spark, 1000, args.workers)
        small.write.mode("overwrite").parquet(str(base / "warm.parquet"))
        kudu.create_table("warm", schema, keys=["id"], partitioning=hashed, replicas=3)
        small.write.format("kudu").option("kudu.table", "warm").mode("append").save()

        out["parquet_write_s"], _ = _timed(
            lambda: df.write.mode("overwrite").parquet(str(base / "data.parquet")))
        kudu.create_table("bench", schema, keys=["id"], partitioning=hashed, replicas=3)
        rounds0 = kudu.transport.rounds
        settled0 = kudu._service.settle_rounds
        t0 = time.perf_counter()
        df.write.format("kudu").option("kudu.table", "bench").mode("append").save()
        out["kudu_write_s"] = time.perf_counter() - t0
        out["kudu_write_rounds"] = kudu.transport.rounds - rounds0
        # The write returned on commit; the replicas apply it in the service's settle round.
        # Wait for that (timed too) so the scans below do not overlap it.
        while kudu._service.settle_rounds == settled0:
            if time.perf_counter() - t0 > 600:
                raise AssertionError("the settle round after the write did not run in 600 s")
            time.sleep(0.05)
        out["kudu_write_applied_s"] = time.perf_counter() - t0
        out["ingest_ratio"] = out["parquet_write_s"] / out["kudu_write_s"]

        pq = spark.read.parquet(str(base / "data.parquet"))
        out["parquet_scan_s"], pq_agg = _timed(lambda: _aggregate(pq))
        out["kudu_scan_s"], kudu_agg = _timed(lambda: _aggregate(kudu.read_table("bench")))
        if pq_agg != kudu_agg:
            raise AssertionError(f"scans disagree: parquet {pq_agg} vs kudu {kudu_agg}")
        out["scan_ratio"] = out["parquet_scan_s"] / out["kudu_scan_s"]

        key = args.rows // 3 + 7
        lookup = kudu.read_table("bench", predicates=[Predicate.eq("id", key)])
        out["kudu_lookup_s"], got = _timed(lookup.collect)
        assert [row["id"] for row in got] == [key]
        out["kudu_lookup_tasks"] = lookup.rdd.getNumPartitions()
        out["kudu_lookup_files"] = _rowset_files(kudu, key, cluster)
        pq_lookup = pq.where(F.col("id") == key)
        out["parquet_lookup_s"], _ = _timed(pq_lookup.collect)
        out["parquet_lookup_tasks"] = pq_lookup.rdd.getNumPartitions()
        out["parquet_lookup_files"] = len(pq_lookup.inputFiles())

        table = df.toArrow()
        try:
            from deltalake import write_deltalake

            out["deltalake_write_s"], _ = _timed(
                lambda: write_deltalake(str(base / "delta"), table))
        except ImportError:
            out["deltalake_write_s"] = None
    return out


def _rowset_files(kudu: KuduContext, key: int, cluster: StandaloneCluster) -> int:
    """Rowset files of the one tablet a lookup of ``key`` reads (on its first replica)."""
    locs = kudu.master.get_table("bench")
    schema = locs.table.schema
    part = Partitioner(schema, PartitionSchema.from_dict(locs.table.partition_schema, schema))
    (pidx,) = part.prune([Predicate.eq("id", key)])
    tablet = locs.tablets[pidx]
    server = next(s for s in kudu.servers if s.uuid == tablet.replicas[0].ts_uuid)
    sb = Superblock.load(tablet_dir(str(cluster.data_root(server.host)), tablet.tablet_id))
    return len(sb.rowsets)


def _report(r: dict[str, Any]) -> None:
    print(f"rows: {r['rows']:,} x {r['columns']} columns, {r['workers']} workers, RF=3")
    print(f"ingest: parquet {r['parquet_write_s']:.2f} s, kudu {r['kudu_write_s']:.2f} s "
          f"({r['kudu_write_rounds']} rounds) -> {r['ingest_ratio']:.2f}x (goal >= 0.5x); "
          f"applied on every replica after {r['kudu_write_applied_s']:.2f} s")
    print(f"scan:   parquet {r['parquet_scan_s']:.2f} s, kudu {r['kudu_scan_s']:.2f} s "
          f"-> {r['scan_ratio']:.2f}x (goal >= 0.8x)")
    print(f"point lookup: kudu {r['kudu_lookup_tasks']} task(s), {r['kudu_lookup_files']} "
          f"rowset file(s), {r['kudu_lookup_s']:.2f} s; parquet {r['parquet_lookup_tasks']} "
          f"task(s), {r['parquet_lookup_files']} file(s), {r['parquet_lookup_s']:.2f} s")
    if r.get("deltalake_write_s") is not None:
        print(f"reference: deltalake.write_deltalake in one process "
              f"{r['deltalake_write_s']:.2f} s")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "ingest_scan.json").write_text(json.dumps(r, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = ["ingest", "full scan"]
    kudu = [r["kudu_write_s"], r["kudu_scan_s"]]
    pq = [r["parquet_write_s"], r["parquet_scan_s"]]
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], pq, width=0.4, label="Spark parquet")
    ax.bar([x + 0.2 for x in xs], kudu, width=0.4, label="pyspark-kudu RF=3")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("seconds")
    ax.set_title(f"{r['rows']:,} rows, {r['workers']} workers: ingest "
                 f"{r['ingest_ratio']:.2f}x, scan {r['scan_ratio']:.2f}x of parquet")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "ingest_scan.png", dpi=120)
    print(f"saved {RESULTS_DIR / 'ingest_scan.json'} and .png")


if __name__ == "__main__":
    sys.exit(main())
