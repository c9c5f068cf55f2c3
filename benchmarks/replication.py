"""Replication rounds on the standalone test cluster, in one run.

1. Small-write commit latency: p50 of one RF=3 write (one ~100-byte batch, committed on a
   majority) against the p50 of an *empty* 3-task barrier stage pinned to the same hosts
   (the floor any round pays). Goal: ratio <= 1.5x.
2. Group commit at round level: writes/s with 16 concurrent writer threads against 1, all
   through one :class:`~pyspark_kudu.spark.replication.write_service.ReplicationService`. Goal:
>= 8x.
Run: ``.venv/bin/python benchmarks/replication.py [--workers 6] [--writes 30]``. Starts its
own cluster (master + workers on 127.0.0.2..), prints a table and saves
``results/replication.{json,png}``. Numbers are ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pyspark_kudu.spark.host.identity import ensure_instance, local_data_root
from pyspark_kudu.spark.pinned import pinned_rdd
from pyspark_kudu.spark.replication.spark_rounds import SparkTransport, TabletServerLocation
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.replication.write_service import ReplicationService
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PAYLOAD = b"x" * 100


def _p50(xs: list[float]) -> float:
    return statistics.median(xs)


def _empty_barrier(spark: SparkSession, hosts: list[str]) -> float:
    start = time.perf_counter()
    # Consume the whole partition: a Python worker that leaves input unread is not reused,
    # and the next stage would pay a fresh worker's start-up and imports (measured ~0.6-1.5 s).
    pinned_rdd(spark.sparkContext, [(h, [h]) for h in hosts]).barrier().mapPartitions(
        lambda it: list(it)).collect()
    return time.perf_counter() - start


def _throughput(svc: ReplicationService, lead: TabletLeader, writers: int, per: int) -> float:
    barrier = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            for _ in range(per):
                svc.submit(lead, [PAYLOAD]).result(timeout=300)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} writes failed, first: {errors[0]}")
    return writers * per / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--writes", type=int, default=30, help="sequential writes for latency")
    ap.add_argument("--per-writer", type=int, default=4, help="writes per concurrent writer")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    with StandaloneCluster(base, workers=args.workers) as cluster:
        spark = cluster_session(cluster.master_url, "bench-replication", len(cluster.hosts))
        infos = pinned_rdd(spark.sparkContext, [(h, [h]) for h in cluster.hosts]).map(
            lambda _: ensure_instance(local_data_root())).collect()
        servers = [TabletServerLocation(i.uuid, i.host) for i in infos]
        replicas = servers[0::2][:3]  # one per rack: 127.0.0.2, .4, .6
        hosts = [s.host for s in replicas]
        transport = SparkTransport(spark.sparkContext, servers)
        tablet = TabletReplicas("bench", tuple(s.uuid for s in replicas))
        lead = TabletLeader(tablet, replicas[0].uuid, transport)
        lead.create()
        lead.elect()
        for _ in range(3):  # warm up Python workers on every host
            _empty_barrier(spark, hosts)
            lead.propose([PAYLOAD])
        # Interleaved one by one, so both see the same machine load (it varies a lot here).
        empty: list[float] = []
        write: list[float] = []
        for _ in range(args.writes):
            empty.append(_empty_barrier(spark, hosts))
            t0 = time.perf_counter()
            lead.propose([PAYLOAD])
            write.append(time.perf_counter() - t0)
        with ReplicationService(transport) as svc:
            one = _throughput(svc, lead, 1, args.per_writer * 4)
            sixteen = _throughput(svc, lead, 16, args.per_writer)
            rounds, writes = svc.rounds, svc.writes
        spark.stop()
    results: dict[str, Any] = {
        "inputs": {"workers": args.workers, "replicas": hosts, "payload_bytes": len(PAYLOAD),
                   "sequential_writes": args.writes, "per_writer": args.per_writer,
                   "sync_policy": "fdatasync"},
        "empty_barrier_s": empty,
        "write_commit_s": write,
        "empty_barrier_p50_s": _p50(empty),
        "write_commit_p50_s": _p50(write),
        "latency_ratio": _p50(write) / _p50(empty),
        "writes_per_s_1": one,
        "writes_per_s_16": sixteen,
        "throughput_ratio_16_vs_1": sixteen / one,
        "service_rounds": rounds,
        "service_writes": writes,
        "goals": {"latency_ratio_max": 1.5, "throughput_ratio_min": 8.0},
    }
    _report(results)
    return 0


def _report(r: dict[str, Any]) -> None:
    print(f"empty 3-task barrier stage p50: {r['empty_barrier_p50_s'] * 1000:8.1f} ms")
    print(f"RF=3 small write commit p50:   {r['write_commit_p50_s'] * 1000:8.1f} ms "
          f"-> {r['latency_ratio']:.2f}x (goal <= 1.5x)")
    print(f"writes/s, 1 writer:   {r['writes_per_s_1']:8.2f}")
    print(f"writes/s, 16 writers: {r['writes_per_s_16']:8.2f} "
          f"-> {r['throughput_ratio_16_vs_1']:.2f}x (goal >= 8x); "
          f"{r['service_writes']} writes in {r['service_rounds']} service rounds")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "replication.json").write_text(json.dumps(r, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    axes[0].bar(["empty barrier", "RF=3 write"],
                [r["empty_barrier_p50_s"] * 1000, r["write_commit_p50_s"] * 1000])
    axes[0].set_ylabel("p50 ms")
    axes[0].set_title(f"commit latency: {r['latency_ratio']:.2f}x (goal <= 1.5x)")
    axes[1].bar(["1 writer", "16 writers"], [r["writes_per_s_1"], r["writes_per_s_16"]])
    axes[1].set_ylabel("writes/s")
    axes[1].set_title(f"group commit: {r['throughput_ratio_16_vs_1']:.1f}x (goal >= 8x)")
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "replication.png", dpi=100)
    plt.close(fig)
    print(f"saved {RESULTS_DIR / 'replication.json'} and .png")


if __name__ == "__main__":
    sys.exit(main())
