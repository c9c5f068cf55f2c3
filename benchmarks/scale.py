"""Scale: ingest, scans, lookups and small upserts from 2M to 50M rows, each figure next to
its baseline measured in the same run, and the executors' Python memory meanwhile.

For each ``--sizes`` value, on a fresh 6-worker standalone cluster (1 core, 640 MiB executor
per worker, RF=3, 3 racks through the test topology's location mapping):

1. **Ingest** of the same cached DataFrame with ``df.write.format("kudu")``, twice with
   ``kudu.operation=insert`` and twice with ``upsert`` (each into a new table, in the mirrored
   order of ``INGEST_ORDER``, after an untimed cold upsert and Parquet write), against
   ``df.write.parquet`` before and after (medians); for the 5-column long-keyed table (6
   hash tablets) and for a composite-key table (string + timestamp + long key, 3 hash
   buckets x 2 range partitions, decimal/date/binary/string columns with nulls). Every
   timed write starts with the tablet servers quiet, and each Kudu write's *deferred* work
   is measured after it returns (the wait until the servers are quiet again, and their CPU
   meanwhile: follower applies, deferred flushes, compactions): each ingest figure is given
   as returned to the caller and as applied everywhere. Without the wait, each write and
   Parquet run paid some of the previous write's deferred work (one 10M Parquet baseline
   run took 23.5 s against 6.0 s for the other).
2. **Full-scan aggregate over every column**, after ingest (the servers quiet: the last
   ingest was waited for) and right after 1% of the rows were upserted, through
   ``spark.read.format("kudu")`` and ``KuduContext.read_table``,
   against ``spark.read.parquet`` of the same rows (median of ``--repeats`` rounds, each
   reading once with every path in turn; every result is checked against Parquet's). After
   ingest also the **Python floor**: the same rows made by Arrow kernels in Python tasks and
   handed to Spark through ``mapInArrow`` (``five_columns_from_python``), i.e. what Spark
   charges any scan whose rows come from Python, with no storage at all (``read_table``'s
   floor); and the **data source floor**: the same batches yielded by a Python data source's
   reader (``five_columns_from_python_source``), ``format("kudu")``'s floor (Spark reads a
   Python data source row by row, not as columnar batches).
3. **PK lookup** p50 against a Parquet filter; **1-row and 10,000-row upserts** p50 against
   a ``deltalake`` MERGE of the same rows into a Delta table of the same size (the Parquet
   output converted in place: reference only, one process, no replication).
4. **Memory**: the peak RSS of any one executor Python process, separately for the resident
   tablet servers (which hold the open replicas) and the workers, and the peak PSS of all of
   them together (shared pages split between the processes sharing them), sampled every
   0.2 s during each phase. The JSON records the replica memory budget the servers ran with
   (``PYSPARK_KUDU_REPLICA_CACHE_MB``, see ``docs/operations.md``): the server's peak should
   stay near it plus a constant, whatever the table's size. After each phase every tablet
   server's own report (``ping``: RSS, Arrow's pool, open replicas and what their MemRowSets
   and indexes hold) is read too; the JSON keeps the largest of each (``servers_*_after``).

Run: ``.venv/bin/python benchmarks/scale.py [--sizes 2000000,10000000,50000000]``. 50M rows
takes tens of minutes. Prints every figure and saves ``results/scale.{json,png}`` with the
commit id and date. A benchmark, never a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    DateType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_kudu.partitioning import HashDimension, PartitionSchema, RangePartition
from pyspark_kudu.schema import Predicate
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.replica_cache import cache_budget_bytes
from pyspark_kudu.testing.benchdata import (
    commit_id,
    delta_copy,
    delta_merge,
    five_columns,
    five_columns_from_python,
    five_columns_from_python_source,
    keyed_schema,
    rack_mapping,
    upsert_rows,
)
from pyspark_kudu.testing.memory_sampler import MemorySampler, server_reports
from pyspark_kudu.testing.settle import Settled, process_cpu_s, server_pids, wait_quiet
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
MAPPING = rack_mapping(REPO)
_SPLIT_TS = dt.datetime(2026, 6, 1, tzinfo=dt.timezone.utc)


# -- data ----------------------------------------------------------------------------------
COMPOSITE = StructType([
    StructField("region", StringType(), False), StructField("at", TimestampType(), False),
    StructField("seq", LongType(), False), StructField("amount", DecimalType(18, 2)),
    StructField("day", DateType()), StructField("payload", BinaryType()),
    StructField("note", StringType())])


def _composite(spark: SparkSession, n: int, parts: int) -> DataFrame:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()
    span = 360 * 86400  # one year: half the rows fall on each side of the range split
    i = F.col("id")
    return (spark.range(n, numPartitions=parts).select(
        F.concat(F.lit("r"), (i % 17).cast("string")).alias("region"),
        F.timestamp_seconds(F.lit(base) + (i * 7919) % span).alias("at"),
        i.cast("long").alias("seq"),
        F.when(i % 11 == 0, None).otherwise((i % 100000).cast(DecimalType(18, 2)) / 100)
        .cast(DecimalType(18, 2)).alias("amount"),
        F.when(i % 13 == 0, None).otherwise(F.date_add(F.lit("2026-01-01"), (i % 365)
                                                       .cast("int"))).alias("day"),
        F.when(i % 5 == 0, None).otherwise(F.unhex(F.lpad(F.hex(i), 16, "0"))).alias("payload"),
        F.when(i % 3 == 0, None).otherwise(F.concat(F.lit("n"), i.cast("string"))).alias("note")))


def _aggregate(df: DataFrame) -> tuple[Any, ...]:
    """One aggregate that reads every column."""
    aggs = []
    for f in df.schema:
        c = F.col(f.name)
        if isinstance(f.dataType, (StringType, BinaryType)):
            aggs.append(F.sum(F.length(c)))
        elif isinstance(f.dataType, (TimestampType, DateType)):
            aggs.append(F.max(c))
        elif f.dataType.typeName() == "boolean":
            aggs.append(F.sum(c.cast("int")))
        else:
            aggs.append(F.sum(c))
    aggs.append(F.count(F.lit(1)))
    return tuple(df.agg(*aggs).collect()[0])


def _load_aggregate(load: Callable[[], DataFrame]) -> tuple[Any, ...]:
    return _aggregate(load())


# -- one size ------------------------------------------------------------------------------
def _kudu_write(df: DataFrame, table: str, op: str) -> float:
    t0 = time.perf_counter()
    (df.write.format("kudu").option("kudu.table", table).option("kudu.operation", op)
     .mode("append").save())
    return time.perf_counter() - t0


def _parquet_write(df: DataFrame, path: Path) -> float:
    t0 = time.perf_counter()
    df.write.mode("overwrite").parquet(str(path))
    return time.perf_counter() - t0


def _scans(spark: SparkSession, kudu: KuduContext, table: str, parquet: Path, repeats: int,
           mem: MemorySampler, tag: str, floor: DataFrame | None = None,
           source_floor: DataFrame | None = None, warm_up: bool = False) -> dict[str, Any]:
    """Median of ``repeats`` rounds, each reading with every path in turn (Parquet first),
    so that background work on the machine (replicas still applying a large write) weighs
    on the baseline as on the store. ``floor``, ``source_floor``: the same rows made by
    Python (:func:`five_columns_from_python`, :func:`five_columns_from_python_source`),
    timed in the same rounds. ``warm_up``: first one
    untimed read with every path (the executors' JVMs compile each path's code on its first
    read: a first Parquet scan of 10M rows took 5.5-6.0 s, the next ones about 2 s)."""
    loads: dict[str, Callable[[], DataFrame]] = {
        "parquet": lambda: spark.read.parquet(str(parquet)),
        "format_kudu": lambda: spark.read.format("kudu").option("kudu.table", table).load(),
        "read_table": lambda: kudu.read_table(table)}
    if floor is not None:
        loads["python_floor"] = lambda: floor
    if source_floor is not None:
        loads["source_floor"] = lambda: source_floor
    times: dict[str, list[float]] = {name: [] for name in loads}
    for load in loads.values() if warm_up else ():
        _load_aggregate(load)
    for _ in range(repeats):
        for name, load in loads.items():
            kudu_path = name in ("format_kudu", "read_table")
            with mem.phase(f"scan_{tag}_{name}") if kudu_path else contextlib.nullcontext():
                t0 = time.perf_counter()
                got = _load_aggregate(load)
                times[name].append(time.perf_counter() - t0)
            if name == "parquet":
                want = got
            elif got != want:
                raise AssertionError(f"{table} {name}: aggregate {got} != parquet {want}")
    out: dict[str, Any] = {f"{name}_s": statistics.median(ts) for name, ts in times.items()}
    for name in loads:
        if name != "parquet":
            out[f"{name}_ratio"] = out["parquet_s"] / out[f"{name}_s"]
    return out


def _run_size(n: int, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    r: dict[str, Any] = {"rows": n}
    parts = args.workers
    with StandaloneCluster(base / "cluster", workers=args.workers) as cluster:
        spark = cluster_session(cluster.master_url, f"bench-scale-{n}", args.workers,
                                conf={"spark.sql.shuffle.partitions": str(args.workers)})
        mem = MemorySampler(str(base))
        try:
            with KuduContext(spark, warehouse=str(base / "warehouse"),
                             location_mapping_cmd=MAPPING) as kudu:
                mem.report = functools.partial(server_reports, kudu)
                r["simple"] = _simple_table(spark, kudu, n, parts, args, base, mem)
                if n <= args.composite_max_rows:
                    r["composite"] = _composite_table(spark, kudu, n, parts, base, mem)
        finally:
            mem.close()
            spark.stop()
        r["memory"] = mem.phases
    return r


def _warm_up(spark: SparkSession, kudu: KuduContext, base: Path, parts: int) -> None:
    """Neither side pays the executors' first Python worker and JVM warm-up in a figure."""
    small = five_columns(spark, 10_000, parts)
    kudu.create_table("warm", keyed_schema(small), keys=["id"], replicas=3,
                      partitioning=PartitionSchema((HashDimension(("id",), 6),)))
    _kudu_write(small, "warm", "upsert")
    _aggregate(spark.read.format("kudu").option("kudu.table", "warm").load())
    _parquet_write(small, base / "warm.parquet")
    kudu.delete_table("warm")


#: Ingest order: after a cold write of each kind, each operation runs twice, in mirrored
#: order, each into a new table, between two Parquet writes. Every timed write starts with
#: the tablet servers quiet (:func:`_settle`), so no figure pays another's deferred work.
INGEST_ORDER = ("insert", "upsert", "upsert", "insert")


def _settle(kudu: KuduContext) -> Settled:
    """Wait until the tablet servers finished their deferred work (follower applies,
    deferred flushes, compactions; :mod:`pyspark_kudu.testing.settle`)."""
    pids = server_pids(kudu)
    return wait_quiet(lambda: process_cpu_s(pids))


def _ingest(kudu: KuduContext, df: DataFrame, out: dict[str, Any], parquet: Path,
            mem: MemorySampler, label: str, prefix: str, phase: str,
            create: Callable[[str], Any]) -> str:
    """A cold full-size upsert and Parquet write first (recorded, not in the ratios), then ingest
    ``df`` with ``INGEST_ORDER`` between two Parquet writes; records each figure's runs and
    median in ``out``. Each Kudu write is followed by :func:`_settle`, whose wait is that
    write's *deferred* time and server CPU (with the deletion of the previous table, small):
    ``{op}_s`` is what the caller waited, ``{op}_done_s`` that plus the deferred time (the
    write fully applied everywhere), each with its ratio to the Parquet write. Returns the
    table of the last insert, kept for the scans; the others are deleted."""
    # Untimed in the ratios: the first full-size write of a table shape pays the cluster's
    # warm-up (measured: 16.3 s for a 2M-row insert that took 5.9 s the second time).
    out["cold_parquet_write_s"] = _parquet_write(df, parquet)
    create(f"{prefix}_cold")
    out["cold_first_write_s"] = _kudu_write(df, f"{prefix}_cold", "upsert")
    print(f"  {label} cold: upsert {out['cold_first_write_s']:.1f} s, parquet "
          f"{out['cold_parquet_write_s']:.1f} s (not in the ratios)", flush=True)
    _settle(kudu)
    runs: dict[str, list[float]] = {"parquet": [_parquet_write(df, parquet)]}
    deferred: dict[str, list[float]] = {}
    deferred_cpu: dict[str, list[float]] = {}
    kept = f"{prefix}_cold"
    for k, op in enumerate(INGEST_ORDER):
        name = f"{prefix}_{op}_{k}"
        create(name)
        with mem.phase(f"{phase}_{op}"):
            runs.setdefault(op, []).append(_kudu_write(df, name, op))
        kudu.delete_table(kept)
        kept = name
        settled = _settle(kudu)
        deferred.setdefault(op, []).append(settled.seconds)
        deferred_cpu.setdefault(op, []).append(settled.cpu_s)
        print(f"  {label} {op} run {len(runs[op])}: {runs[op][-1]:.1f} s, then "
              f"{settled.seconds:.1f} s and {settled.cpu_s:.1f} server CPU-s deferred"
              + ("" if settled.quiet else " (servers not quiet by the deadline)"), flush=True)
    runs["parquet"].append(_parquet_write(df, parquet))
    out["parquet_write_s"] = statistics.median(runs["parquet"])
    out["runs_s"] = runs
    out["deferred_s"] = deferred
    out["deferred_server_cpu_s"] = deferred_cpu
    for op in ("insert", "upsert"):
        out[f"{op}_s"] = statistics.median(runs[op])
        out[f"{op}_ratio"] = out["parquet_write_s"] / out[f"{op}_s"]
        out[f"{op}_done_s"] = statistics.median(
            r + d for r, d in zip(runs[op], deferred[op], strict=True))
        out[f"{op}_done_ratio"] = out["parquet_write_s"] / out[f"{op}_done_s"]
        print(f"  {label} {op}: {out[f'{op}_s']:.1f} s vs parquet "
              f"{out['parquet_write_s']:.1f} s (runs {runs['parquet'][0]:.1f}, "
              f"{runs['parquet'][1]:.1f}) -> {out[f'{op}_ratio']:.2f}x; applied everywhere "
              f"after {out[f'{op}_done_s']:.1f} s -> {out[f'{op}_done_ratio']:.2f}x", flush=True)
    return kept


def _simple_table(spark: SparkSession, kudu: KuduContext, n: int, parts: int,
                  args: argparse.Namespace, base: Path, mem: MemorySampler) -> dict[str, Any]:
    out: dict[str, Any] = {}
    df = five_columns(spark, n, parts).cache()
    df.count()
    schema = keyed_schema(df)
    hashed = PartitionSchema((HashDimension(("id",), 6),))
    _warm_up(spark, kudu, base, parts)
    parquet = base / f"simple-{n}.parquet"
    table = _ingest(kudu, df, out, parquet, mem, f"{n:,} simple", "s", "ingest",
                    lambda name: kudu.create_table(name, schema, keys=["id"], replicas=3,
                                                   partitioning=hashed))
    out["scan_after_ingest"] = _scans(
        spark, kudu, table, parquet, args.repeats, mem, "ingest",
        five_columns_from_python(spark, n, parts),
        five_columns_from_python_source(spark, n, parts), warm_up=True)
    print(f"  scans after ingest: {out['scan_after_ingest']}", flush=True)

    # 1% of the rows upserted with new values; Parquet gets the same final rows.
    changed = df.filter(F.col("id") % 100 == 7).withColumn("a", F.col("a") + 1)
    with mem.phase("upsert_1pct"):
        out["upsert_1pct_s"] = _kudu_write(changed, table, "upsert")
    final = df.filter(F.col("id") % 100 != 7).unionByName(changed)
    parquet2 = base / f"simple-{n}-updated.parquet"
    _parquet_write(final, parquet2)
    out["scan_after_upserts"] = _scans(spark, kudu, table, parquet2, args.repeats, mem,
                                       "upserted")
    print(f"  scans after 1% upserted: {out['scan_after_upserts']}", flush=True)

    # PK lookups.
    keys = [(k * 7_919_993) % n for k in range(1, args.lookups + 1)]
    pq = spark.read.parquet(str(parquet2))
    k_times, p_times = [], []
    with mem.phase("lookups"):
        for k in keys:
            t0 = time.perf_counter()
            got = kudu.read_table(table, predicates=[Predicate.eq("id", k)]).collect()
            k_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            want = pq.filter(F.col("id") == k).collect()
            p_times.append(time.perf_counter() - t0)
            if sorted(map(tuple, got)) != sorted(map(tuple, want)):
                raise AssertionError(f"lookup {k}: {got} != {want}")
    out["lookup_p50_s"] = statistics.median(k_times)
    out["parquet_filter_p50_s"] = statistics.median(p_times)
    print(f"  lookup p50 {out['lookup_p50_s']:.3f} s vs parquet filter "
          f"{out['parquet_filter_p50_s']:.3f} s", flush=True)
    out.update(_small_upserts(spark, table, parquet2, n, args, base, mem))
    df.unpersist()
    kudu.delete_table(table)
    return out


def _small_upserts(spark: SparkSession, table: str, parquet: Path, n: int,
                   args: argparse.Namespace, base: Path, mem: MemorySampler) -> dict[str, Any]:
    """1-row and 10,000-row upserts vs a deltalake MERGE of the same rows."""
    delta = delta_copy(parquet, base / f"delta-{n}")
    out: dict[str, Any] = {}
    for size in (1, 10_000):
        k_times, d_times = [], []
        for rep in range(args.repeats):
            rows = upsert_rows((rep * 1_000_003) % max(1, n - size), size, rep)
            df = spark.createDataFrame(rows, keyed_schema(five_columns(spark, 1, 1)))
            with mem.phase(f"upsert_{size}_rows"):
                k_times.append(_kudu_write(df, table, "upsert"))
            d_times.append(delta_merge(delta, rows))
        out[f"upsert_{size}_p50_s"] = statistics.median(k_times)
        out[f"delta_merge_{size}_p50_s"] = statistics.median(d_times)
        out[f"upsert_{size}_vs_delta"] = out[f"upsert_{size}_p50_s"] / out[
            f"delta_merge_{size}_p50_s"]
        print(f"  {size}-row upsert p50 {out[f'upsert_{size}_p50_s']:.2f} s vs delta MERGE "
              f"{out[f'delta_merge_{size}_p50_s']:.2f} s", flush=True)
    shutil.rmtree(delta, ignore_errors=True)
    return out


def _composite_table(spark: SparkSession, kudu: KuduContext, n: int, parts: int, base: Path,
                     mem: MemorySampler) -> dict[str, Any]:
    out: dict[str, Any] = {}
    df = _composite(spark, n, parts).cache()
    df.count()
    ps = PartitionSchema((HashDimension(("seq",), 3),), range_columns=("at",),
                         ranges=(RangePartition(None, (_SPLIT_TS,)),
                                 RangePartition((_SPLIT_TS,), None)))
    parquet = base / f"composite-{n}.parquet"
    table = _ingest(kudu, df, out, parquet, mem, f"{n:,} composite", "c", "composite_ingest",
                    lambda name: kudu.create_table(name, COMPOSITE,
                                                   keys=["region", "at", "seq"], replicas=3,
                                                   partitioning=ps))
    want = _aggregate(spark.read.parquet(str(parquet)))
    got = _aggregate(kudu.read_table(table))
    if got != want:
        raise AssertionError(f"composite table: {got} != parquet {want}")
    kudu.delete_table(table)
    df.unpersist()
    return out


# -- report --------------------------------------------------------------------------------
def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [s["rows"] for s in r["sizes"]]
    labels = [f"{n / 1e6:g}M" for n in sizes]
    series = {
        "insert (simple)": [s["simple"]["insert_ratio"] for s in r["sizes"]],
        "upsert (simple)": [s["simple"]["upsert_ratio"] for s in r["sizes"]],
        "insert (composite)": [s.get("composite", {}).get("insert_ratio") for s in r["sizes"]],
        "upsert (composite)": [s.get("composite", {}).get("upsert_ratio") for s in r["sizes"]],
        "insert applied everywhere (simple)": [s["simple"].get("insert_done_ratio")
                                               for s in r["sizes"]],
        "scan format, ingested": [s["simple"]["scan_after_ingest"]["format_kudu_ratio"]
                                  for s in r["sizes"]],
        "scan read_table, ingested": [s["simple"]["scan_after_ingest"]["read_table_ratio"]
                                      for s in r["sizes"]],
        "scan floor: rows from Python": [
            s["simple"]["scan_after_ingest"].get("python_floor_ratio") for s in r["sizes"]],
        "scan floor: a Python data source": [
            s["simple"]["scan_after_ingest"].get("source_floor_ratio") for s in r["sizes"]],
        "scan format, upserted": [s["simple"]["scan_after_upserts"]["format_kudu_ratio"]
                                  for s in r["sizes"]],
        "scan read_table, upserted": [s["simple"]["scan_after_upserts"]["read_table_ratio"]
                                      for s in r["sizes"]],
    }
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(series)
    for k, (name, vals) in enumerate(series.items()):
        xs = [i + k * width for i in range(len(sizes))]
        a1.bar(xs, [v or 0 for v in vals], width, label=name)
    a1.axhline(1.0, color="grey", linestyle="--")
    a1.set_xticks([i + 0.4 for i in range(len(sizes))], labels)
    a1.set_ylabel("Parquet time / kudu time (higher is better)")
    a1.set_title("ratios vs Parquet, same run")
    a1.legend(fontsize=7)
    phases = sorted({p for s in r["sizes"] for p in s["memory"]})
    for k, s in enumerate(r["sizes"]):
        for role, style in (("server", "-"), ("worker", ":")):
            a2.plot(phases, [s["memory"].get(p, {}).get(f"max_{role}_rss_mb", 0)
                             for p in phases], style, marker="o",
                    label=f"{labels[k]}: largest {role}")
    a2.set_ylabel("peak RSS of one executor Python process (MiB)")
    a2.tick_params(axis="x", rotation=60, labelsize=7)
    a2.legend(fontsize=7)
    fig.suptitle(f"pyspark-kudu scale, commit {r['commit'][:10]}, {r['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000000,10000000,50000000")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lookups", type=int, default=5)
    ap.add_argument("--composite-max-rows", type=int, default=50_000_000,
                    help="skip the composite-key table above this many rows")
    ap.add_argument("--out", default="scale", help="results file stem under results/")
    args = ap.parse_args(argv)
    r: dict[str, Any] = {"commit": commit_id(REPO), "workers": args.workers, "sizes": [],
                         "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                         "replica_cache_budget_mb": cache_budget_bytes() / 2**20}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for n in (int(s) for s in args.sizes.split(",")):
        base = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
        print(f"== {n:,} rows", flush=True)
        try:
            r["sizes"].append(_run_size(n, args, base))
        finally:
            shutil.rmtree(base, ignore_errors=True)
        (RESULTS_DIR / f"{args.out}.json").write_text(json.dumps(r, indent=2))
        print(json.dumps(r["sizes"][-1]["memory"], indent=1), flush=True)
    _plot(r, RESULTS_DIR / f"{args.out}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
