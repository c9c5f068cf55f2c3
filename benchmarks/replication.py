"""User writes end to end on the standalone test cluster, next to their floors, in one run.

Every figure is a write as the user makes it, returned to the caller: a DataFrame upserted
through ``KuduContext.upsert_rows`` or ``df.write.format("kudu")`` into an RF=3 table of
``--table-rows`` rows (6 hash tablets, 5 columns), with the p50 of ``--writes`` repetitions.

1. **Small-write latency**: a 1-row upsert (both APIs; ``upsert_rows`` of a DataFrame built
   from a Python list and of one built from an Arrow table, both read in the driver: no
   staging job) against an *empty* 3-task barrier stage pinned to the written tablet's
   replica hosts (the floor any round pays), interleaved one by one so all see the same
   machine load. Goal: <= 1.5x. Next to them, the floor of any ``df.write.format(...)``
   through a Python data source: the same 1-row DataFrame written to a data source whose
   tasks and commit do nothing (``bench_noop``): Spark's planning, its write job and the
   commit in a Python worker on the driver, with no storage and no round.
2. **Size ladder**: 100, 1,000, 10,000 and 100,000-row upserts on the small-write path
   (batches inside the Raft entries) and on the staged path (staging files and a shuffle),
   which is how the default ``kudu.smallWriteBytes`` was chosen.
3. **Medium upsert vs Delta**: 10,000 rows upserted (from a list-built and from an
   Arrow-built DataFrame) against a ``deltalake`` MERGE of the same rows (an Arrow table)
   into a Delta table of the same rows (one process). Goal: <= 0.5x.
4. **Concurrent writers**: 1-row upserts/s from 16 threads sharing one ``KuduContext``
   against one thread, with list-built and with Arrow-built (local) DataFrames; ``--repeats``
   pairs of phases (one writer, then 16, the order alternating), the median rate of each,
   and the CPU each kind of process (driver JVM and Python, executor JVMs, executor Python
   with the tablet servers) spent per write in them, with the cores kept busy: the 6
   "hosts" share this machine's cores. Goal: >= 8x.
5. **Bare proposal** (kept under that name only): one ~100-byte Raft entry proposed and
   committed by a ``TabletLeader``, no DataFrame, no staging, no apply.

Run: ``.venv/bin/python benchmarks/replication.py [--workers 6] [--table-rows 10000000]``.
Saves ``results/replication.{json,png}`` with the commit id and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.pinned import pinned_rdd
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.testing.benchdata import (
    commit_id,
    delta_copy,
    delta_merge,
    five_columns,
    keyed_schema,
    rack_mapping,
    upsert_rows,
)
from pyspark_kudu.testing.host_load import process_cpu_now
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
MAPPING = rack_mapping(REPO)
TABLE = "bench"
PAYLOAD = b"x" * 100
LADDER = (100, 1_000, 10_000, 100_000)
_KINDS: dict[int, str] = {}  # pid -> kind of process, for process_cpu_now


def _p50(xs: list[float]) -> float:
    return statistics.median(xs)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _empty_barrier(spark: SparkSession, hosts: list[str]) -> float:
    # Consume the whole partition: a Python worker that leaves input unread is not reused,
    # and the next stage would pay a fresh worker's start-up and imports.
    return _timed(lambda: pinned_rdd(spark.sparkContext, [(h, [h]) for h in hosts])
                  .barrier().mapPartitions(lambda it: list(it)).collect())


class _NoopWriter(DataSourceWriter):
    def write(self, iterator: Any) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class _NoopSource(DataSource):
    """A Python data source whose writes do nothing: what Spark alone charges a
    ``df.write.format(...)`` through any Python data source (``format("kudu")`` is one)."""

    @classmethod
    def name(cls) -> str:
        return "bench_noop"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _NoopWriter()


class _Writes:
    """The user's two ways of upserting a DataFrame, each returned to the caller."""

    def __init__(self, spark: SparkSession, kudu: KuduContext, schema: StructType) -> None:
        self.spark, self.kudu, self.schema = spark, kudu, schema
        self.tag = 0

    def frame(self, lo: int, size: int) -> DataFrame:
        self.tag += 1
        return self.spark.createDataFrame(upsert_rows(lo, size, self.tag), self.schema)

    def local_frame(self, lo: int, size: int) -> DataFrame:
        """The same rows from an Arrow table: a local DataFrame (no staging job)."""
        self.tag += 1
        rows = upsert_rows(lo, size, self.tag)
        arrow = to_arrow_schema(self.schema)
        return self.spark.createDataFrame(pa.Table.from_pylist(
            [dict(zip(arrow.names, r, strict=True)) for r in rows], schema=arrow))

    def context(self, df: DataFrame, small_write_bytes: int | None = None) -> float:
        if small_write_bytes is None:
            return _timed(lambda: self.kudu.upsert_rows(df, TABLE))
        return _timed(lambda: self.kudu.write(df, TABLE, "upsert",
                                              small_write_bytes=small_write_bytes))

    def fmt(self, df: DataFrame) -> float:
        return _timed(lambda: df.write.format("kudu").option("kudu.table", TABLE)
                      .mode("append").save())

    def noop(self, df: DataFrame) -> float:
        return _timed(lambda: df.write.format("bench_noop").mode("append").save())


def _latency(w: _Writes, hosts: list[str], n: int, writes: int) -> dict[str, Any]:
    empty: list[float] = []
    ctx: list[float] = []
    local: list[float] = []
    fmt: list[float] = []
    noop: list[float] = []
    for i in range(writes):
        empty.append(_empty_barrier(w.spark, hosts))
        ctx.append(w.context(w.frame((i * 7919) % n, 1)))
        local.append(w.context(w.local_frame((i * 7919 + 2) % n, 1)))
        fmt.append(w.fmt(w.frame((i * 7919 + 1) % n, 1)))
        noop.append(w.noop(w.frame((i * 7919 + 1) % n, 1)))
    return {"empty_barrier_s": empty, "upsert_rows_1_s": ctx, "format_kudu_1_s": fmt,
            "upsert_rows_1_local_s": local, "python_source_noop_1_s": noop,
            "python_source_noop_1_p50_s": _p50(noop),
            "python_source_noop_1_vs_empty": _p50(noop) / _p50(empty),
            "empty_barrier_p50_s": _p50(empty), "upsert_rows_1_p50_s": _p50(ctx),
            "upsert_rows_1_local_p50_s": _p50(local),
            "format_kudu_1_p50_s": _p50(fmt),
            "upsert_rows_1_vs_empty": _p50(ctx) / _p50(empty),
            "upsert_rows_1_local_vs_empty": _p50(local) / _p50(empty),
            "format_kudu_1_vs_empty": _p50(fmt) / _p50(empty)}


def _ladder(w: _Writes, n: int, repeats: int) -> dict[str, Any]:
    """Each repeat writes every size in turn (not every repeat of one size, then the next):
    the background work an earlier phase left (replicas applying, compacting) then weighs on
    all sizes alike. Each inline write here follows a staged one: until e41d335 that
    write's staging cleanup was a pinned Spark job the next round waited behind (a 100-row
    write ~0.9 s against ~0.35 s after a pause); the resident servers remove staging now."""
    inline: dict[int, list[float]] = {size: [] for size in LADDER}
    staged: dict[int, list[float]] = {size: [] for size in LADDER}
    for rep in range(repeats):
        for size in LADDER:
            lo = (rep * 1_000_003 + size) % max(1, n - size)
            inline[size].append(w.context(w.frame(lo, size), small_write_bytes=64 << 20))
            staged[size].append(w.context(w.frame(lo, size), small_write_bytes=0))
    out: dict[str, Any] = {}
    for size in LADDER:
        out[str(size)] = {"inline_p50_s": _p50(inline[size]),
                          "staged_p50_s": _p50(staged[size])}
        print(f"  {size:>7,} rows: inline {_p50(inline[size]):.3f} s, staged "
              f"{_p50(staged[size]):.3f} s", flush=True)
    return out


def _vs_delta(w: _Writes, delta: Path, n: int, repeats: int) -> dict[str, Any]:
    kudu_s, local_s, delta_s = [], [], []
    for rep in range(repeats):
        lo = (rep * 2_000_003) % max(1, n - 10_000)
        w.tag += 1
        rows = upsert_rows(lo, 10_000, w.tag)
        df = w.spark.createDataFrame(rows, w.schema)
        kudu_s.append(w.context(df))
        # The same rows from an Arrow table, as the MERGE gets them: a local DataFrame.
        local_s.append(w.context(w.local_frame(lo, 10_000)))
        delta_s.append(delta_merge(delta, rows))
    return {"upsert_10000_s": kudu_s, "upsert_10000_local_s": local_s,
            "delta_merge_10000_s": delta_s,
            "upsert_10000_p50_s": _p50(kudu_s), "upsert_10000_local_p50_s": _p50(local_s),
            "delta_merge_10000_p50_s": _p50(delta_s),
            "upsert_10000_vs_delta": _p50(kudu_s) / _p50(delta_s),
            "upsert_10000_local_vs_delta": _p50(local_s) / _p50(delta_s)}


def _throughput(w: _Writes, n: int, writers: int, per: int, local: bool = False
                ) -> tuple[float, float, dict[str, float]]:
    """Writes/s of ``writers`` threads writing ``per`` 1-row upserts each, the phase's wall
    seconds and the CPU seconds each kind of process used in it (``/proc``, Linux: the
    frames are built before, so the figures are the writes')."""
    make = w.local_frame if local else w.frame
    frames = [[make((t * per + i) * 104_729 % n, 1) for i in range(per)]
              for t in range(writers)]
    barrier = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def run(mine: list[DataFrame]) -> None:
        barrier.wait()
        try:
            for df in mine:
                w.kudu.upsert_rows(df, TABLE)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f,)) for f in frames]
    for t in threads:
        t.start()
    cpu0 = process_cpu_now(_KINDS)
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    cpu1 = process_cpu_now(_KINDS)
    if errors:
        raise RuntimeError(f"{len(errors)} writers failed, first: {errors[0]}")
    used = {k: v - cpu0[k] for k, v in cpu1.items() if k in cpu0 and v > cpu0[k]}
    return writers * per / elapsed, elapsed, used


def _concurrency(w: _Writes, n: int, per: int, repeats: int) -> dict[str, Any]:
    """Writes/s of one writer (``4 * per`` writes) and of 16 (``per`` each), list-built and
    Arrow-built DataFrames, ``repeats`` times in alternating order: a phase lasts a few
    seconds, so one slow write moves its rate; the medians are reported.

    First one untimed 16-writer phase of each kind (its rates are reported as
    ``warmup_writes_per_s``): the latency phases before have run one writer's path many
    times, but nothing has yet run rounds of 16 writes over all 6 hosts, and the young
    JVMs were still compiling that path during the first timed 16-writer phase (43 writes/s
    in both runs at 2b2b7c8, against 48-63 in the later ones; the executors' JIT compiler
    threads took 0.3-0.9 of the 2 cores during such phases, probe ``cpu16.py``)."""
    warmup = {f"{'local_' if local else ''}16": _throughput(w, n, 16, per, local)[0]
              for local in (False, True)}
    keys = ("1", "16", "local_1", "local_16")
    rates: dict[str, list[float]] = {k: [] for k in keys}
    walls = dict.fromkeys(keys, 0.0)
    writes = dict.fromkeys(keys, 0)
    cpu: dict[str, dict[str, float]] = {k: {} for k in keys}
    for rep in range(repeats):
        for local in (False, True):
            prefix = "local_" if local else ""
            for writers in ((1, 16) if rep % 2 == 0 else (16, 1)):
                key, count = f"{prefix}{writers}", per * 4 if writers == 1 else per
                rate, wall, used = _throughput(w, n, writers, count, local)
                rates[key].append(rate)
                walls[key] += wall
                writes[key] += writers * count
                for kind, secs in used.items():
                    cpu[key][kind] = cpu[key].get(kind, 0.0) + secs
    med = {k: _p50(v) for k, v in rates.items()}
    return {"writes_per_s_1": med["1"], "writes_per_s_16": med["16"],
            "ratio_16_vs_1": med["16"] / med["1"],
            "local_writes_per_s_1": med["local_1"], "local_writes_per_s_16": med["local_16"],
            "local_ratio_16_vs_1": med["local_16"] / med["local_1"],
            "runs_writes_per_s": rates, "warmup_writes_per_s": warmup,
            # Where the writes' CPU went (all the cluster's "hosts" share this machine's
            # cores): per kind of process, ms per write over the timed phases, and the
            # cores kept busy on average (CPU seconds / wall seconds).
            "cpu_ms_per_write": {k: {kind: round(secs * 1000 / writes[k], 2)
                                     for kind, secs in sorted(cpu[k].items(),
                                                              key=lambda kv: -kv[1])}
                                 for k in keys},
            "cores_busy": {k: round(sum(cpu[k].values()) / walls[k], 2) for k in keys}}


def _bare_proposal(kudu: KuduContext, writes: int) -> float:
    """p50 of one ~100-byte entry proposed and committed by a leader (no DataFrame)."""
    servers = kudu.servers[0::2][:3]
    lead = TabletLeader(TabletReplicas("bench-bare", tuple(s.uuid for s in servers)),
                        servers[0].uuid, kudu.transport)
    lead.create()
    lead.elect()
    times = [_timed(lambda: lead.propose([PAYLOAD])) for _ in range(writes)]
    return _p50(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--table-rows", type=int, default=10_000_000)
    ap.add_argument("--writes", type=int, default=15, help="repetitions of each latency")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions of larger writes")
    ap.add_argument("--per-writer", type=int, default=6, help="writes per concurrent writer")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    n = args.table_rows
    r: dict[str, Any] = {"commit": commit_id(REPO), "date": dt.date.today().isoformat(),
                         "inputs": {"workers": args.workers, "table_rows": n,
                                    "writes": args.writes, "repeats": args.repeats,
                                    "per_writer": args.per_writer, "replicas": 3,
                                    "tablets": 6}}
    with StandaloneCluster(base / "cluster", workers=args.workers) as cluster:
        spark = cluster_session(cluster.master_url, "bench-replication", args.workers,
                                conf={"spark.sql.shuffle.partitions": str(args.workers)})
        spark.dataSource.register(_NoopSource)
        with KuduContext(spark, warehouse=str(base / "warehouse"),
                         location_mapping_cmd=MAPPING) as kudu:
            df = five_columns(spark, n, args.workers)
            schema = keyed_schema(df)
            kudu.create_table(TABLE, schema, keys=["id"], replicas=3,
                              partitioning=PartitionSchema((HashDimension(("id",), 6),)))
            r["ingest_s"] = _timed(lambda: kudu.upsert_rows(df, TABLE))
            parquet = base / "table.parquet"
            df.write.parquet(str(parquet))
            delta = delta_copy(parquet, base / "delta")
            print(f"table of {n:,} rows ingested in {r['ingest_s']:.1f} s", flush=True)
            w = _Writes(spark, kudu, schema)
            # The row every 1-row latency write lands in is in some tablet; the floor is
            # an empty barrier stage on three hosts, like the round of one tablet.
            hosts = sorted({s.host for s in kudu.servers})[:3]
            for _ in range(3):  # warm up Python workers and leaders on every host
                _empty_barrier(spark, hosts)
                w.context(w.frame(0, 1))
                w.fmt(w.frame(1, 1))
                w.noop(w.frame(1, 1))
            r["latency"] = _latency(w, hosts, n, args.writes)
            print(f"1-row upsert p50: upsert_rows {r['latency']['upsert_rows_1_p50_s']:.3f} s, "
                  f"format(kudu) {r['latency']['format_kudu_1_p50_s']:.3f} s, empty barrier "
                  f"{r['latency']['empty_barrier_p50_s']:.3f} s", flush=True)
            r["ladder"] = _ladder(w, n, args.repeats)
            r["vs_delta"] = _vs_delta(w, delta, n, args.repeats)
            print(f"10,000-row upsert p50 {r['vs_delta']['upsert_10000_p50_s']:.2f} s vs delta "
                  f"MERGE {r['vs_delta']['delta_merge_10000_p50_s']:.2f} s", flush=True)
            r["concurrency"] = _concurrency(w, n, args.per_writer, args.repeats)
            r["bare_proposal_p50_s"] = _bare_proposal(kudu, args.writes)
            got = kudu.read_table(TABLE).count()
            if got != n:  # upserts of existing keys only: the row count is unchanged
                raise AssertionError(f"table holds {got} rows, expected {n}")
        spark.stop()
    r["goals"] = {"one_row_vs_empty_barrier_max": 1.5, "upsert_10000_vs_delta_max": 0.5,
                  "ratio_16_vs_1_min": 8.0}
    _report(r)
    return 0


def _report(r: dict[str, Any]) -> None:
    lat, conc, vd = r["latency"], r["concurrency"], r["vs_delta"]
    print(f"empty 3-task barrier stage p50: {lat['empty_barrier_p50_s'] * 1000:8.1f} ms")
    print(f"1-row upsert_rows p50:          {lat['upsert_rows_1_p50_s'] * 1000:8.1f} ms "
          f"-> {lat['upsert_rows_1_vs_empty']:.2f}x (goal <= 1.5x)")
    print(f"1-row upsert_rows p50, Arrow-built DataFrame: "
          f"{lat['upsert_rows_1_local_p50_s'] * 1000:8.1f} ms "
          f"-> {lat['upsert_rows_1_local_vs_empty']:.2f}x")
    print(f"1-row format(kudu) p50:         {lat['format_kudu_1_p50_s'] * 1000:8.1f} ms "
          f"-> {lat['format_kudu_1_vs_empty']:.2f}x")
    print(f"1-row write to a no-op Python data source p50: "
          f"{lat['python_source_noop_1_p50_s'] * 1000:8.1f} ms "
          f"-> {lat['python_source_noop_1_vs_empty']:.2f}x (Spark's floor for format(...))")
    print(f"10,000-row upsert vs delta MERGE: {vd['upsert_10000_vs_delta']:.2f}x, local "
          f"DataFrame {vd['upsert_10000_local_vs_delta']:.2f}x (goal <= 0.5x)")
    print(f"16 writers vs 1: {conc['writes_per_s_16']:.2f} vs {conc['writes_per_s_1']:.2f} "
          f"writes/s -> {conc['ratio_16_vs_1']:.1f}x (goal >= 8x)")
    print(f"16 writers vs 1, local DataFrames: {conc['local_writes_per_s_16']:.2f} vs "
          f"{conc['local_writes_per_s_1']:.2f} writes/s -> {conc['local_ratio_16_vs_1']:.1f}x")
    for key in ("1", "16"):
        per = ", ".join(f"{k} {v:.1f}" for k, v in conc["cpu_ms_per_write"][key].items())
        print(f"  {key:>2} writer(s): {conc['cores_busy'][key]:.2f} cores busy; CPU ms per "
              f"write: {per}")
    print(f"bare proposal (no DataFrame) p50: {r['bare_proposal_p50_s'] * 1000:.1f} ms")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "replication.json").write_text(json.dumps(r, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].bar(["empty\nbarrier", "upsert_rows", "upsert_rows\nlocal df", "format(kudu)",
                 "no-op\nPython\nsource", "bare\nproposal"],
                [lat["empty_barrier_p50_s"] * 1000, lat["upsert_rows_1_p50_s"] * 1000,
                 lat["upsert_rows_1_local_p50_s"] * 1000, lat["format_kudu_1_p50_s"] * 1000,
                 lat["python_source_noop_1_p50_s"] * 1000, r["bare_proposal_p50_s"] * 1000])
    axes[0].set_ylabel("p50 ms")
    axes[0].set_title(f"1-row write: {lat['upsert_rows_1_vs_empty']:.2f}x floor, local df "
                      f"{lat['upsert_rows_1_local_vs_empty']:.2f}x (goal <= 1.5x)")
    sizes = [int(s) for s in r["ladder"]]
    axes[1].plot(sizes, [r["ladder"][str(s)]["inline_p50_s"] for s in sizes], "o-",
                 label="inline (in the Raft entries)")
    axes[1].plot(sizes, [r["ladder"][str(s)]["staged_p50_s"] for s in sizes], "s-",
                 label="staged + shuffled")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("rows upserted")
    axes[1].set_ylabel("p50 s")
    axes[1].legend()
    axes[1].set_title("small-write path vs staged path")
    axes[2].bar(["kudu 10k\nupsert", "kudu 10k\nlocal df", "delta\nMERGE 10k"],
                [vd["upsert_10000_p50_s"], vd["upsert_10000_local_p50_s"],
                 vd["delta_merge_10000_p50_s"]])
    axes[2].set_ylabel("p50 s")
    axes[2].set_title(f"10k upsert {vd['upsert_10000_vs_delta']:.2f}x MERGE, local df "
                      f"{vd['upsert_10000_local_vs_delta']:.2f}x (goal <= 0.5x)\n"
                      f"16 writers vs 1: {conc['ratio_16_vs_1']:.1f}x, local df "
                      f"{conc['local_ratio_16_vs_1']:.1f}x (goal >= 8x)")
    fig.suptitle(f"table of {r['inputs']['table_rows']:,} rows, RF=3, "
                 f"{r['inputs']['workers']} workers; commit {r['commit'][:8]} {r['date']}")
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "replication.png", dpi=100)
    plt.close(fig)
    print(f"saved {RESULTS_DIR / 'replication.json'} and .png")


if __name__ == "__main__":
    raise SystemExit(main())
