"""Reads that never fail because of where Spark put a task: repeated full scans, and the cost
of a scan whose tasks all run off their replicas' hosts.

On the 6-worker standalone cluster (1 core per executor, 3 racks through the test
topology's location mapping, RF=3, 6 hash tablets, 5 columns):

1. ingest ``--rows`` rows with ``df.write.format("kudu")`` (and ``df.write.parquet`` of
   the same cached rows, the reference for the scans);
2. ``--scans`` consecutive full-scan aggregates over every column through
   ``spark.read.format("kudu")`` and as many through ``KuduContext.read_table``, each checked
   against the Parquet aggregate; failures are counted, not raised (goal: none);
3. off-host cost: the table's scan tokens run as one Spark job with every task pinned to a
   host holding *no* replica of its tablet (each reads through a replica host's resident
   tablet server), against the same job with every task pinned to a replica's host (local
   reads); the median of ``--repeats`` each, tasks checked to have run where pinned. Goal:
   off-host <= 2x on-host.

Run: ``.venv/bin/python benchmarks/remote_reads.py [--rows 10000000] [--scans 20]``. Starts
its own cluster, prints the figures and saves ``results/remote_reads.{json,png}`` with the
commit id and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.identity import current_host
from pyspark_kudu.spark.host.replica_reader import TabletScan, read_tablet
from pyspark_kudu.spark.pinned import pinned_rdd
from pyspark_kudu.testing.benchdata import commit_id, five_columns, rack_mapping
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
MAPPING = rack_mapping(REPO)


def _aggregate(df: DataFrame) -> tuple[Any, ...]:
    return tuple(df.agg(F.count("id"), F.sum("a"), F.max("b"), F.count("c"),
                        F.sum(F.col("d").cast("int"))).collect()[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--scans", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-remote-reads-"))
    r: dict[str, Any] = {"rows": args.rows, "workers": args.workers, "columns": 5,
                         "commit": commit_id(REPO), "date": dt.datetime.now(dt.timezone.utc)
                         .isoformat(timespec="seconds")}
    with StandaloneCluster(base / "cluster", workers=args.workers) as cluster:
        spark = cluster_session(cluster.master_url, "bench-remote-reads", args.workers,
                                conf={"spark.sql.shuffle.partitions": str(args.workers)})
        try:
            r.update(_run(spark, args, base))
        finally:
            spark.stop()
    _report(r)
    return 0


def _run(spark: SparkSession, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    df = five_columns(spark, args.rows, args.workers).cache()
    df.count()
    schema = StructType([StructField(f.name, f.dataType, f.name != "id") for f in df.schema])
    with KuduContext(spark, warehouse=str(base / "warehouse"),
                     location_mapping_cmd=MAPPING) as kudu:
        kudu.create_table("bench", schema, keys=["id"], replicas=3,
                          partitioning=PartitionSchema((HashDimension(("id",), 6),)))
        t0 = time.perf_counter()
        df.write.format("kudu").option("kudu.table", "bench").mode("append").save()
        out["kudu_write_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        df.write.mode("overwrite").parquet(str(base / "data.parquet"))
        out["parquet_write_s"] = time.perf_counter() - t0
        pq = spark.read.parquet(str(base / "data.parquet"))
        want = _aggregate(pq)
        pq_times = []
        for _ in range(3):
            t0 = time.perf_counter()
            _aggregate(pq)
            pq_times.append(time.perf_counter() - t0)
        out["parquet_scan_s"] = statistics.median(pq_times)
        for name, load in (
                ("format_kudu", lambda: spark.read.format("kudu").option("kudu.table", "bench")
                 .load()),
                ("read_table", lambda: kudu.read_table("bench"))):
            times, failures = [], []
            for i in range(args.scans):
                t0 = time.perf_counter()
                try:
                    got = _aggregate(load())
                except Exception as e:  # counted: the goal is that none happens
                    failures.append(f"scan {i}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                times.append(time.perf_counter() - t0)
                if got != want:
                    failures.append(f"scan {i}: aggregate {got} != parquet {want}")
            out[name] = {"scans": args.scans, "failures": len(failures),
                         "failure_texts": failures[:5], "times_s": times,
                         "median_s": statistics.median(times) if times else None}
            print(f"{name}: {args.scans - len(failures)}/{args.scans} scans ok, median "
                  f"{out[name]['median_s']}", flush=True)
        out.update(_off_host(spark, kudu, args.repeats))
    return out


def _count(it: Iterator[TabletScan]) -> Iterator[tuple[str, str, int]]:
    for scan in it:
        n = sum(b.num_rows for b in read_tablet(scan))
        yield scan.tablet_id, current_host(), n


def _off_host(spark: SparkSession, kudu: KuduContext, repeats: int) -> dict[str, Any]:
    tokens = kudu.scan_tokens("bench")
    hosts = sorted({s.host for s in kudu.servers})
    plans: dict[str, list[tuple[TabletScan, list[str]]]] = {"on_host": [], "off_host": []}
    for k, tok in enumerate(tokens):
        replica_hosts = sorted(r.host for r in tok.replicas)
        others = [h for h in hosts if h not in replica_hosts]
        plans["on_host"].append((tok, [replica_hosts[k % len(replica_hosts)]]))
        plans["off_host"].append((tok, [others[k % len(others)]]))
    out: dict[str, Any] = {}
    for name, plan in plans.items():
        where = {tok.tablet_id: h[0] for tok, h in plan}
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            got = pinned_rdd(spark.sparkContext, plan).mapPartitions(_count).collect()
            times.append(time.perf_counter() - t0)
            misplaced = [(t, h) for t, h, _ in got if where[t] != h]
            if misplaced:
                raise AssertionError(f"{name}: tasks ran elsewhere than pinned: {misplaced}")
        out[f"{name}_s"] = statistics.median(times)
        out[f"{name}_times_s"] = times
        out[f"{name}_rows"] = sum(n for _, _, n in got)
    out["off_host_cost"] = out["off_host_s"] / out["on_host_s"]
    return out


def _report(r: dict[str, Any]) -> None:
    print(f"rows: {r['rows']:,} x {r['columns']} columns, {r['workers']} workers, RF=3, "
          f"commit {r['commit'][:10]}")
    print(f"ingest: kudu {r['kudu_write_s']:.1f} s, parquet {r['parquet_write_s']:.1f} s")
    for name in ("format_kudu", "read_table"):
        s = r[name]
        med = s["median_s"]
        print(f"{name}: {s['scans'] - s['failures']}/{s['scans']} full scans ok (goal: all), "
              f"median {med:.2f} s vs parquet {r['parquet_scan_s']:.2f} s"
              if med is not None else f"{name}: every scan failed: {s['failure_texts']}")
    print(f"off-host scan {r['off_host_s']:.2f} s vs on-host {r['on_host_s']:.2f} s -> "
          f"{r['off_host_cost']:.2f}x (goal <= 2x); rows {r['off_host_rows']:,} / "
          f"{r['on_host_rows']:,}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "remote_reads.json").write_text(json.dumps(r, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in ("format_kudu", "read_table"):
        a1.plot(range(1, len(r[name]["times_s"]) + 1), r[name]["times_s"], marker="o",
                label=f"{name} ({r[name]['scans'] - r[name]['failures']}/{r[name]['scans']} ok)")
    a1.axhline(r["parquet_scan_s"], color="grey", linestyle="--", label="parquet (median)")
    a1.set_xlabel("consecutive full scan")
    a1.set_ylabel("seconds")
    a1.set_title(f"{r['rows']:,} rows, {r['workers']} workers")
    a1.legend(fontsize=8)
    a2.bar(["tasks on replica hosts", "tasks off replica hosts"],
           [r["on_host_s"], r["off_host_s"]])
    a2.set_ylabel("seconds (median)")
    a2.set_title(f"off-host cost {r['off_host_cost']:.2f}x (goal <= 2x)")
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "remote_reads.png", dpi=120)
    print(f"saved {RESULTS_DIR / 'remote_reads.json'} and .png")


if __name__ == "__main__":
    sys.exit(main())
