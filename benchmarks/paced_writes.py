"""Small writes at a user's pace: ``df.write.format("kudu")`` upserts a couple of seconds apart.

A user's loop (or a streaming query with a trigger of a few seconds) writes, does something
else, and writes again. Between writes the client's replication service runs a *settle round*
(a commit-only round telling the replicas the last write's commit index) once it saw no write
for ``DEFAULT_SETTLE_DELAY_S`` (2 s); a write submitted while that round runs waits for it.
This benchmark writes on such a pace, with gaps spread over 1.4-2.2 s so that the writes'
planning and staging sample the whole window around the settle delay: after each upsert
through ``format("kudu")``, a ``deltalake`` MERGE of the same rows into a Delta table of the
same size (the reference the small-write goal names), then a pause until the gap since the
write returned is over. Reported per size (1 and 10,000 rows): the p50, p90 and max of the
writes, how many of them met a settle round (it ran while the write was in flight), and the
MERGE p50.

Before that, right after the table's first upsert of all its rows (the servers then apply its
backlog in the background for several seconds), 15 1-row ``KuduContext.upsert_rows`` writes
0.3 s apart, and the same once the servers are quiet: how long a small write waits behind
that background work (each server's applier takes a replica's lock for a chunk of entries at
a time, and since bcc7b23 ends a chunk early when a request arrives).

Run: ``.venv/bin/python benchmarks/paced_writes.py [--table-rows 10000000] [--writes 18]``.
Saves ``results/paced_writes_<commit>.{json,png}`` (commit id and date inside).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.testing.benchdata import (
    commit_id,
    delta_copy,
    delta_merge,
    five_columns,
    keyed_schema,
    rack_mapping,
    upsert_rows,
)
from pyspark_kudu.testing.settle import process_cpu_s, server_pids, wait_quiet
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
TABLE = "paced"
SIZES = (1, 10_000)
GAPS_S = tuple(1.4 + 0.1 * k for k in range(9))  # around the 2 s settle delay


def _paced(spark: Any, kudu: KuduContext, delta: Path, n: int, size: int, writes: int
           ) -> dict[str, Any]:
    schema = keyed_schema(five_columns(spark, 1, 1))
    times: list[float] = []
    merges: list[float] = []
    met: list[int] = []
    for i in range(writes):
        rows = upsert_rows((i * 1_000_003) % max(1, n - size), size, i)
        df = spark.createDataFrame(rows, schema)
        settles = kudu._service.settle_rounds
        t0 = time.perf_counter()
        (df.write.format("kudu").option("kudu.table", TABLE).option("kudu.operation", "upsert")
         .mode("append").save())
        times.append(time.perf_counter() - t0)
        met.append(kudu._service.settle_rounds - settles)
        merges.append(delta_merge(delta, rows))
        left = GAPS_S[i % len(GAPS_S)] - (time.perf_counter() - t0 - times[-1])
        if left > 0:
            time.sleep(left)  # the user's pause between writes (a benchmark, not a test)
    ordered = sorted(times)
    out: dict[str, Any] = {"write_s": times, "merge_s": merges, "settle_rounds_met": met,
           "p50_s": statistics.median(times),
           "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
           "max_s": ordered[-1], "writes_meeting_a_settle_round": sum(1 for m in met if m),
           "merge_p50_s": statistics.median(merges)}
    out["p50_vs_merge"] = out["p50_s"] / out["merge_p50_s"]
    print(f"{size:>6,}-row upserts: p50 {out['p50_s']:.3f} s, p90 {out['p90_s']:.3f} s, max "
          f"{out['max_s']:.3f} s; {out['writes_meeting_a_settle_round']} of {writes} met a "
          f"settle round; MERGE p50 {out['merge_p50_s']:.3f} s -> {out['p50_vs_merge']:.2f}x",
          flush=True)
    return out


def _one_row_writes(spark: Any, kudu: KuduContext, n: int, what: str) -> dict[str, Any]:
    schema = keyed_schema(five_columns(spark, 1, 1))
    times: list[float] = []
    for i in range(15):
        df = spark.createDataFrame(upsert_rows((i * 7919) % n, 1, 100 + i), schema)
        t0 = time.perf_counter()
        kudu.upsert_rows(df, TABLE)
        times.append(time.perf_counter() - t0)
        time.sleep(0.3)  # the user's pause (a benchmark, not a test)
    out: dict[str, Any] = {"write_s": times, "p50_s": statistics.median(times),
                           "max_s": max(times)}
    print(f"1-row upsert_rows, {what}: p50 {out['p50_s']:.3f} s, max {out['max_s']:.3f} s",
          flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--table-rows", type=int, default=10_000_000)
    ap.add_argument("--writes", type=int, default=18, help="writes per size")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-paced-"))
    n = args.table_rows
    commit = commit_id(REPO)
    r: dict[str, Any] = {"commit": commit, "date": dt.date.today().isoformat(),
                         "inputs": {"workers": args.workers, "table_rows": n,
                                    "writes": args.writes, "gaps_s": list(GAPS_S),
                                    "replicas": 3, "tablets": 6}}
    with StandaloneCluster(base / "cluster", workers=args.workers) as cluster:
        spark = cluster_session(cluster.master_url, "bench-paced", args.workers,
                                conf={"spark.sql.shuffle.partitions": str(args.workers)})
        with KuduContext(spark, warehouse=str(base / "warehouse"),
                         location_mapping_cmd=rack_mapping(REPO)) as kudu:
            df = five_columns(spark, n, args.workers)
            kudu.create_table(TABLE, keyed_schema(df), keys=["id"], replicas=3,
                              partitioning=PartitionSchema((HashDimension(("id",), 6),)))
            schema = keyed_schema(df)
            for i in range(3):  # leaders elected, Python workers started
                kudu.upsert_rows(spark.createDataFrame(upsert_rows(i, 1, i), schema), TABLE)
            kudu.upsert_rows(df, TABLE)
            r["after_ingest"] = _one_row_writes(spark, kudu, n, "servers applying the ingest")
            pids = server_pids(kudu)
            wait_quiet(lambda: process_cpu_s(pids))  # the ingest's deferred work done
            r["quiet"] = _one_row_writes(spark, kudu, n, "servers quiet")
            parquet = base / "table.parquet"
            df.write.parquet(str(parquet))
            delta = delta_copy(parquet, base / "delta")
            wait_quiet(lambda: process_cpu_s(pids))
            for size in SIZES:
                r[str(size)] = _paced(spark, kudu, delta, n, size, args.writes)
            got = kudu.read_table(TABLE).count()
            if got != n:  # upserts of existing keys only
                raise AssertionError(f"table holds {got} rows, expected {n}")
        spark.stop()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = RESULTS_DIR / f"paced_writes_{commit[:7]}"
    stem.with_suffix(".json").write_text(json.dumps(r, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SIZES) + 1, figsize=(17, 4))
    ax = axes[-1]
    for key in ("after_ingest", "quiet"):
        ax.plot(r[key]["write_s"], "o-", label=f"{key}: p50 {r[key]['p50_s']:.2f} s")
    ax.set_xlabel("1-row upsert_rows, 0.3 s apart")
    ax.set_ylabel("s")
    ax.set_title("right after the first upsert of all rows / servers quiet")
    ax.legend()
    for ax, size in zip(axes[:-1], SIZES, strict=True):
        s = r[str(size)]
        colors = ["tab:red" if m else "tab:blue" for m in s["settle_rounds_met"]]
        ax.bar(range(len(s["write_s"])), s["write_s"], color=colors)
        ax.axhline(s["merge_p50_s"], color="gray", linestyle="--", label="MERGE p50")
        ax.set_xlabel("write (red: met a settle round)")
        ax.set_ylabel("s")
        ax.set_title(f"{size:,}-row format(kudu) upsert: p50 {s['p50_s']:.2f} s, max "
                     f"{s['max_s']:.2f} s")
        ax.legend()
    fig.suptitle(f"writes 1.4-2.2 s apart, table of {n:,} rows, RF=3, {args.workers} "
                 f"workers; commit {commit[:8]} {r['date']}")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=100)
    plt.close(fig)
    print(f"saved {stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
