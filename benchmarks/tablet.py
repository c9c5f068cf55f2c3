"""Tablet storage engine benchmark: ratios against plain pyarrow Parquet.

Measures, on the same rows:

1. **apply + flush** of committed write batches (INSERT, keys in random order, so the flush
   sorts) versus ``pyarrow.parquet.write_table`` of the same table; encoding the batches (a
   client-side cost, done once per batch for all replicas) is reported separately.
2. **full scan** (``Tablet.scan`` streaming bounded batches) versus
   ``pyarrow.parquet.read_table`` of the reference file; the goal is a speed ratio >= 0.8.
3. **PK point lookups** on a tablet of several flushed rowsets with disjoint key ranges:
   latency percentiles and rowset files opened per lookup (min/max pruning should open one).

Prints a summary and writes ``benchmarks/results/tablet.json`` (inputs, machine, results)
and ``tablet.png``. Timings are the best of ``--repeat`` interleaved runs.
Run: ``.venv/bin/python benchmarks/tablet.py [--rows N ...]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet import OpType, Tablet, TabletOptions, encode_write_batch

RESULTS = Path(__file__).resolve().parent / "results"


def make_rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(n).astype(np.int64)
    return pa.table({
        "id": ids,
        "grp": pa.array([f"group-{i % 100:03d}" for i in range(n)]),
        "value": rng.random(n),
        "count": rng.integers(0, 1_000_000, n),
        "at": pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
    })


_CPU: dict[str, list[float]] = {}


def timed(fn: Callable[[], Any], cpu_key: str | None = None) -> float:
    """Wall seconds of ``fn()``; with ``cpu_key``, also record its process CPU seconds (all
    threads), which other tenants of a shared machine disturb much less than wall time."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    if cpu_key:
        _CPU.setdefault(cpu_key, []).append(time.process_time() - c0)
    return wall


def bench_write(table: pa.Table, schema: Schema, batch_rows: int, options: TabletOptions,
                work: Path, repeat: int) -> dict[str, Any]:
    ref = work / "reference.parquet"
    payloads: list[bytes] = []
    encode = timed(lambda: payloads.extend(
        encode_write_batch(schema, OpType.INSERT, table.slice(i, batch_rows))
        for i in range(0, table.num_rows, batch_rows)))
    apply_s, flush_s, reference = [], [], []
    for r in range(repeat):  # interleaved, so a load spike on a shared machine hits both
        reference.append(timed(lambda: pq.write_table(table, ref), "write_table"))
        root = work / f"write-{r}"
        tablet = Tablet.create(str(root), "bench", schema, options=options)

        def apply_all(t: Tablet = tablet) -> None:
            for i, p in enumerate(payloads):
                t.apply(i + 1, p)

        apply_s.append(timed(apply_all, "apply"))
        flush_s.append(timed(tablet.flush, "flush"))
    best = int(np.argmin(np.add(apply_s, flush_s)))
    total = apply_s[best] + flush_s[best]
    write_table = min(reference)
    return {
        "pyarrow_write_table_s": write_table, "encode_s": encode,
        "apply_s": apply_s[best], "flush_s": flush_s[best], "apply_flush_s": total,
        "apply_flush_rows_per_s": table.num_rows / total,
        "ratio_apply_flush_over_write_table": total / write_table,
        "cpu_ratio_apply_flush_over_write_table":
            (min(_CPU["apply"]) + min(_CPU["flush"])) / min(_CPU["write_table"]),
        "encoded_bytes": sum(len(p) for p in payloads), "batches": len(payloads),
        "root": str(work / f"write-{best}"), "reference_file": str(ref),
    }


def bench_scan(schema: Schema, write: dict[str, Any], options: TabletOptions,
               repeat: int) -> dict[str, Any]:
    tablet = Tablet.open(write["root"], "bench", options=options)
    ref = write["reference_file"]
    rows: list[int] = []
    reads, scans = [], []
    for _ in range(repeat):  # interleaved, best of each
        reads.append(timed(lambda: pq.read_table(ref), "read_table"))
        scans.append(timed(lambda: rows.append(sum(b.num_rows for b in tablet.scan())), "scan"))
    read_table, scan = min(reads), min(scans)
    sizes = [b.num_rows for b in tablet.scan()]
    return {
        "pyarrow_read_table_s": read_table, "tablet_scan_s": scan, "rows": rows[-1],
        "speed_ratio_scan_vs_read_table": read_table / scan, "goal": 0.8,
        "cpu_speed_ratio_scan_vs_read_table": min(_CPU["read_table"]) / min(_CPU["scan"]),
        "max_batch_rows": max(sizes), "batches": len(sizes),
        "rowset_bytes": sum(m.size_bytes for m in tablet.rowsets),
        "reference_bytes": os.path.getsize(ref),
    }


def bench_lookup(table: pa.Table, schema: Schema, rowsets: int, lookups: int,
                 options: TabletOptions, work: Path, seed: int) -> dict[str, Any]:
    ordered = table.sort_by("id")
    tablet = Tablet.create(str(work / "lookup"), "bench", schema, options=options)
    per = -(-ordered.num_rows // rowsets)
    for i in range(rowsets):
        part = ordered.slice(i * per, per)
        tablet.apply(i + 1, encode_write_batch(schema, OpType.INSERT, part))
        tablet.flush()
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, table.num_rows, lookups)
    latencies, opened = [], []
    for k in keys:
        before = tablet.metrics.rowset_files_opened
        t0 = time.perf_counter()
        row = tablet.lookup(int(k))
        latencies.append(time.perf_counter() - t0)
        opened.append(tablet.metrics.rowset_files_opened - before)
        assert row is not None and row["id"] == k
    before = tablet.metrics.rowset_files_opened
    assert tablet.lookup(table.num_rows + 10) is None
    lat_ms = np.array(latencies) * 1000
    return {
        "rowsets": len(tablet.rowsets), "lookups": lookups,
        "latency_ms_p50": float(np.percentile(lat_ms, 50)),
        "latency_ms_p99": float(np.percentile(lat_ms, 99)),
        "latency_ms_mean": float(lat_ms.mean()),
        "files_opened_per_lookup_mean": statistics.mean(opened),
        "files_opened_per_lookup_max": max(opened),
        "files_opened_for_absent_key": tablet.metrics.rowset_files_opened - before,
        "latencies_ms": lat_ms.round(3).tolist(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w, s, lk = result["write"], result["scan"], result["lookup"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].bar(["pq.write_table", "tablet apply", "tablet flush"],
                [w["pyarrow_write_table_s"], w["apply_s"], w["flush_s"]],
                color=["grey", "tab:blue", "tab:cyan"])
    axes[0].set_title(f"write {result['inputs']['rows']:,} rows: "
                      f"{w['ratio_apply_flush_over_write_table']:.2f}x write_table")
    axes[0].set_ylabel("seconds")
    axes[1].bar(["pq.read_table", "tablet scan"],
                [s["pyarrow_read_table_s"], s["tablet_scan_s"]], color=["grey", "tab:blue"])
    axes[1].set_title(f"full scan: speed {s['speed_ratio_scan_vs_read_table']:.2f}x read_table")
    axes[2].hist(lk["latencies_ms"], bins=30, color="tab:blue")
    axes[2].set_title(f"PK lookup over {lk['rowsets']} rowsets: p50 {lk['latency_ms_p50']:.1f} ms,"
                      f" {lk['files_opened_per_lookup_max']} file max")
    axes[2].set_xlabel("ms")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=100_000)
    ap.add_argument("--row-group-rows", type=int, default=TabletOptions().row_group_rows)
    ap.add_argument("--lookups", type=int, default=300)
    ap.add_argument("--lookup-rowsets", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--work-dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    options = TabletOptions(flush_threshold_bytes=0, row_group_rows=args.row_group_rows)
    table = make_rows(args.rows, args.seed)
    schema = Schema.from_arrow(table.schema, ["id"])
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tablet-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        write = bench_write(table, schema, args.batch_rows, options, work, args.repeat)
        scan = bench_scan(schema, write, options, args.repeat)
        lookup = bench_lookup(table, schema, args.lookup_rowsets, args.lookups, options, work,
                              args.seed)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "tablet",
        "when_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "inputs": {**vars(args), "schema": schema.to_dict(), "table_bytes": table.nbytes},
        "machine": {"python": sys.version.split()[0], "pyarrow": pa.__version__,
                    "numpy": np.__version__, "platform": platform.platform(),
                    "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "write": write, "scan": scan, "lookup": lookup,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / "tablet"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    plot(result, stem.with_suffix(".png"))
    print(f"rows={args.rows:,} batch_rows={args.batch_rows:,} "
          f"row_group_rows={args.row_group_rows:,} repeat={args.repeat}")
    print(f"apply+flush {write['apply_flush_s']:.3f}s"
          f" ({write['apply_flush_rows_per_s']:,.0f} rows/s) vs pq.write_table"
          f" {write['pyarrow_write_table_s']:.3f}s:"
          f" ratio {write['ratio_apply_flush_over_write_table']:.2f}x"
          f" (CPU time {write['cpu_ratio_apply_flush_over_write_table']:.2f}x)"
          f" (client encode {write['encode_s']:.3f}s)")
    print(f"full scan {scan['tablet_scan_s']:.3f}s vs pq.read_table"
          f" {scan['pyarrow_read_table_s']:.3f}s:"
          f" speed ratio {scan['speed_ratio_scan_vs_read_table']:.2f} (goal >= 0.8; CPU time"
          f" {scan['cpu_speed_ratio_scan_vs_read_table']:.2f}),"
          f" batches <= {scan['max_batch_rows']:,} rows")
    print(f"PK lookup over {lookup['rowsets']} rowsets: p50 {lookup['latency_ms_p50']:.2f} ms,"
          f" p99 {lookup['latency_ms_p99']:.2f} ms, files opened per lookup"
          f" mean {lookup['files_opened_per_lookup_mean']:.2f} max"
          f" {lookup['files_opened_per_lookup_max']}, absent key"
          f" {lookup['files_opened_for_absent_key']}")
    print(f"saved {stem.with_suffix('.json')} and {stem.with_suffix('.png')}")
    return result


if __name__ == "__main__":
    main()
