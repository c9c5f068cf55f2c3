"""Two clients writing one table: forwarding to the lease holder vs leading oneself, one run.

On the standalone test cluster (``--workers`` workers, a one-process master), one
application opens two ``KuduContext``\\s (the first SparkSession and a ``newSession()``) on
an RF=3 table with one tablet, and each write is one single-row ``upsert_rows``:

1. **Forwarding cost**: the context holding the tablet's lease writes (its own leader), then
   the other context writes (forwarded to the holder's session service), alternately.
   Reported: p50 of each and their ratio (forwarded / own).
2. **Without leases** (``lease_s=0``, as before leases): the two contexts alternate again;
   each write elects its client and fences the other. Reported: how many writes failed as
   fenced, and the p50 of the writes that succeeded, against the forwarded p50.

Run: ``.venv/bin/python benchmarks/leases.py [--workers 3] [--writes 20]``; prints a table
and saves ``results/leases.json``. The numbers are ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.errors import FencedError
from pyspark_kudu.master.localcluster import MasterProcessCluster
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

RESULTS_DIR = Path(__file__).resolve().parent / "results"
STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])


def _timed_write(ctx: KuduContext, table: str, key: int) -> tuple[float, str]:
    df = ctx.spark.createDataFrame([(key, f"v{key}")], STRUCT)
    t0 = time.perf_counter()
    try:
        ctx.upsert_rows(df, table)
    except FencedError:
        return time.perf_counter() - t0, "fenced"
    return time.perf_counter() - t0, "ok"


def _alternate(a: KuduContext, b: KuduContext, table: str, writes: int
               ) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    out_a: list[tuple[float, str]] = []
    out_b: list[tuple[float, str]] = []
    for i in range(writes):
        out_a.append(_timed_write(a, table, 2 * i))
        out_b.append(_timed_write(b, table, 2 * i + 1))
    return out_a, out_b


def _p50_ok(xs: list[tuple[float, str]]) -> float | None:
    ok = [t for t, outcome in xs if outcome == "ok"]
    return statistics.median(ok) if ok else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--writes", type=int, default=20, help="writes per client and phase")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-leases-"))
    try:
        results = _run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _report(results)
    return 0


def _run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    master = MasterProcessCluster(str(base / "master"), 1)
    master.start()
    try:
        master.wait_for_leader(60)
        with StandaloneCluster(base / "spark", workers=args.workers) as cluster:
            spark = cluster_session(cluster.master_url, "bench-leases", len(cluster.hosts))
            try:
                return _measure(spark, master.master_addresses, base, args.writes)
            finally:
                spark.stop()
    finally:
        master.stop()


def _measure(spark: SparkSession, masters: str, base: Path, writes: int) -> dict[str, Any]:
    common: dict[str, Any] = {"master": masters, "heal": False}
    with KuduContext(spark, warehouse=str(base / "wh-a"), **common) as a, \
            KuduContext(spark.newSession(), warehouse=str(base / "wh-b"), **common) as b:
        a.create_table("leased", STRUCT, keys=["id"], replicas=3)  # one tablet; a leads
        _alternate(a, b, "leased", 3)  # warm-up: Python workers, caches
        own, forwarded = _alternate(a, b, "leased", writes)
        forwarded_leaders = len(b._leaders)
    with KuduContext(spark, warehouse=str(base / "wh-c"), lease_s=0, **common) as c, \
            KuduContext(spark.newSession(), warehouse=str(base / "wh-d"), lease_s=0,
                        **common) as d:
        c.create_table("fenced", STRUCT, keys=["id"], replicas=3)
        _alternate(c, d, "fenced", 3)
        first, second = _alternate(c, d, "fenced", writes)
    no_lease = first + second
    p_own, p_fwd = _p50_ok(own), _p50_ok(forwarded)
    p_fenced = _p50_ok(no_lease)
    return {
        "inputs": {"writes_per_client": writes, "replicas": 3, "tablets": 1},
        "own_s": own, "forwarded_s": forwarded, "no_lease_s": no_lease,
        "own_p50_s": p_own, "forwarded_p50_s": p_fwd,
        "forwarded_vs_own": (p_fwd / p_own) if p_own and p_fwd else None,
        "forwarding_client_led_tablets": forwarded_leaders,
        "forwarded_failed": sum(1 for _, o in forwarded if o != "ok"),
        "no_lease_fenced": sum(1 for _, o in no_lease if o == "fenced"),
        "no_lease_writes": len(no_lease),
        "no_lease_ok_p50_s": p_fenced,
        "no_lease_ok_vs_forwarded": (p_fenced / p_fwd) if p_fenced and p_fwd else None,
    }


def _report(r: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "leases.json").write_text(json.dumps(r, indent=2) + "\n", encoding="utf-8")

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f} ms"

    print(f"own writes (lease holder):   p50 {s(r['own_p50_s'])}")
    print(f"forwarded writes:            p50 {s(r['forwarded_p50_s'])}  "
          f"({r['forwarded_failed']} failed; the forwarding client led "
          f"{r['forwarding_client_led_tablets']} tablets)")
    if r["forwarded_vs_own"] is not None:
        print(f"forwarded / own:             {r['forwarded_vs_own']:.2f}x")
    print(f"without leases, alternating: {r['no_lease_fenced']} of {r['no_lease_writes']} "
          f"writes fenced; p50 of the others {s(r['no_lease_ok_p50_s'])}"
          + ("" if r["no_lease_ok_vs_forwarded"] is None else
             f" ({r['no_lease_ok_vs_forwarded']:.2f}x the forwarded p50)"))
    print(f"saved {RESULTS_DIR / 'leases.json'}")


if __name__ == "__main__":
    sys.exit(main())
