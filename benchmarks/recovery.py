"""Time to restore full replication after losing a tablet server, one run.

On a standalone cluster (``--workers`` workers, 1 core each, no racks) an RF=3 table of
``--rows`` rows is written; one worker holding replicas is then killed (SIGKILL). The master
declares its tablet server failed after ``--failed-after-s`` (Kudu's
``follower_unavailable_considered_failed_sec``) and the client's healer replaces each of its
replicas: add as NON_VOTER, tablet copy (pinned read, shuffle, pinned write), promote, evict.

Measured:

- ``lost_bytes`` N: the bytes of the killed server's replicas (rowsets, WAL, metadata);
- the baseline: writing N bytes to a file on the same disk with one ``fsync`` in this
  process (``disk_write_s``, the median of three), i.e. N over the disk's write bandwidth;
- ``restore_s``: from the first healing action to full replication (every tablet back to
  three voters, none on the lost server), and ``detected_s``: from the kill to the first
  action (the failure-detection time, set by ``--failed-after-s``).

Goal: ``disk_write_s / restore_s >= 0.5`` (re-replication runs at at least half the speed
of writing the lost data once to a local disk). Every row is read back afterwards.

Run: ``.venv/bin/python benchmarks/recovery.py [--rows 3000000] [--workers 4]``; prints a
table and saves ``results/recovery.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


def _disk_write_s(directory: Path, n: int) -> float:
    """Seconds to write ``n`` bytes to a new file in ``directory`` and fsync it."""
    block = os.urandom(1 << 20)
    path = directory / "bandwidth.probe"
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = n
        while left > 0:
            f.write(block[:min(left, len(block))])
            left -= len(block)
        f.flush()
        os.fsync(f.fileno())
    out = time.perf_counter() - t
    path.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--tablets", type=int, default=4)
    ap.add_argument("--failed-after-s", type=float, default=5.0)
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    r: dict[str, Any] = {"rows": args.rows, "workers": args.workers, "tablets": args.tablets,
                         "failed_after_s": args.failed_after_s}
    with StandaloneCluster(base / "cluster", workers=args.workers) as cluster:
        spark = cluster_session(cluster.master_url, "bench-recovery", args.workers,
                                executor_memory="900m", deadline_s=300,
                                conf={"spark.sql.shuffle.partitions": str(args.workers)})
        try:
            r.update(_run(spark, args, base, cluster))
        finally:
            spark.stop()
    shutil.rmtree(base, ignore_errors=True)  # ~1 GB of replicas at the default size
    _report(r)
    return 0


def _run(spark: SparkSession, args: argparse.Namespace, base: Path,
         cluster: StandaloneCluster) -> dict[str, Any]:
    out: dict[str, Any] = {}
    df = (spark.range(args.rows, numPartitions=args.workers)
          .select(F.col("id").cast("long").alias("id"), (F.col("id") * 3).alias("a"),
                  F.sha2(F.col("id").cast("string"), 256).alias("h"),
                  F.concat(F.lit("row-"), F.col("id").cast("string")).alias("c")))
    schema = StructType([StructField(f.name, f.dataType, f.name != "id") for f in df.schema])
    with KuduContext(spark, warehouse=str(base / "warehouse"), heal=True,
                     heal_interval_s=1.0, failed_after_s=args.failed_after_s) as kudu:
        kudu.create_table("bench", schema, keys=["id"], replicas=3,
                          partitioning=PartitionSchema((HashDimension(("id",),
                                                                      args.tablets),)))
        t = time.perf_counter()
        kudu.write(df, "bench", "upsert")
        out["ingest_s"] = time.perf_counter() - t
        host_of = {s.uuid: s.host for s in kudu.servers}
        locs = kudu.master.get_table("bench")
        count: dict[str, int] = {}
        for tb in locs.tablets:
            for v in tb.voters:
                count[v] = count.get(v, 0) + 1
        # The server with the most replicas that leads none of them (a follower's loss).
        leaders = {tb.leader for tb in locs.tablets}
        victim_ts = max((v for v in count if v not in leaders), key=lambda v: count[v],
                        default=max(count, key=lambda v: count[v]))
        victim = host_of[victim_ts]
        lost = [tb.tablet_id for tb in locs.tablets if victim_ts in tb.voters]
        root = cluster.data_root(victim)
        out["lost_replicas"] = len(lost)
        out["lost_bytes"] = sum(_dir_bytes(root / "tablets" / t) for t in lost)
        # The median of three: one write of a few hundred MB varies several-fold here.
        probes = sorted(_disk_write_s(base, out["lost_bytes"]) for _ in range(3))
        out["disk_write_probes_s"] = probes
        out["disk_write_s"] = probes[1]
        history0 = len(kudu.healer.history)
        rounds = _trace_rounds(kudu)

        cluster.kill_worker(victim)
        killed = time.monotonic()
        end = killed + 1800

        def healed() -> bool:
            tablets = kudu.master.get_table("bench").tablets
            return all(len(tb.voters) == 3 and victim_ts not in tb.voters
                       and len(tb.replicas) == 3 for tb in tablets)

        while not healed():
            if time.monotonic() > end:
                raise SystemExit(f"full replication not restored in 1800 s; healer: "
                                 f"{kudu.healer.history[history0:]} {kudu.healer.last_error}")
            time.sleep(0.2)  # polling the master, bounded above
        done = time.monotonic()
        steps = kudu.healer.history[history0:]
        first = min(a.at - a.seconds for a in steps)
        wall0 = time.time() - (done - killed)
        out["detected_s"] = max(0.0, first - wall0)
        out["total_s"] = done - killed
        out["restore_s"] = out["total_s"] - out["detected_s"]
        out["steps"] = [(a.action, a.outcome[:60], round(a.seconds, 2)) for a in steps]
        out["copies_s"] = sum(a.seconds for a in steps if a.action == "add_replica")
        out["ratio"] = out["disk_write_s"] / out["restore_s"]
        out["rounds"] = [(round(t - killed, 2), round(d, 2), kinds) for t, d, kinds in rounds
                         if t - killed <= out["total_s"]]
        rows = kudu.read_table("bench").count()
        if rows != args.rows:
            raise AssertionError(f"read {rows} rows after healing, wrote {args.rows}")
        out["rows_read_back"] = rows
        cluster.start_worker(victim)
    return out


def _trace_rounds(kudu: KuduContext) -> list[tuple[float, float, str]]:
    """Record every replication round from now on: (start, seconds, request kinds)."""
    rounds: list[tuple[float, float, str]] = []
    transport = kudu.transport
    run = transport.run

    def traced(requests):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        try:
            return run(requests)
        finally:
            kinds: dict[str, int] = {}
            for reqs in requests.values():
                for req in reqs:
                    kinds[req.kind.value] = kinds.get(req.kind.value, 0) + 1
            rounds.append((t0, time.monotonic() - t0,
                           " ".join(f"{k}x{n}" for k, n in sorted(kinds.items()))))

    transport.run = traced  # type: ignore[method-assign]
    return rounds


def _report(r: dict[str, Any]) -> None:
    mb = r["lost_bytes"] / 1e6
    print(f"{r['rows']:,} rows, RF=3, {r['tablets']} tablets, {r['workers']} workers; "
          f"ingest {r['ingest_s']:.1f} s")
    print(f"lost server: {r['lost_replicas']} replicas, {mb:.1f} MB; writing that to disk "
          f"once: {r['disk_write_s']:.2f} s ({mb / max(r['disk_write_s'], 1e-9):.0f} MB/s; "
          f"probes {', '.join(f'{p:.2f}' for p in r['disk_write_probes_s'])} s)")
    print(f"failure detected after {r['detected_s']:.1f} s (threshold {r['failed_after_s']} s);"
          f" full replication restored {r['restore_s']:.1f} s later "
          f"(add_replica steps {r['copies_s']:.1f} s) -> ratio {r['ratio']:.2f}x "
          f"(goal >= 0.5x)")
    for s in r["steps"]:
        print("   ", s)
    print("replication rounds after the kill (start s, seconds, requests):")
    for rnd in r.get("rounds", ()):
        print("   ", rnd)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "recovery.json").write_text(json.dumps(r, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(["write lost bytes to disk", "detect failure", "re-replicate"],
            [r["disk_write_s"], r["detected_s"], r["restore_s"]],
            color=["tab:gray", "tab:orange", "tab:blue"])
    ax.set_xlabel("seconds")
    ax.set_title(f"losing {mb:.0f} MB on one server: re-replication {r['ratio']:.2f}x "
                 f"of disk write")
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "recovery.png", dpi=120)
    print(f"saved {RESULTS_DIR / 'recovery.json'} and .png")


if __name__ == "__main__":
    sys.exit(main())
