"""Time to restore full replication after losing a tablet server, at two sizes.

On a standalone cluster (``--workers`` workers, 1 core each, no racks) an RF=3 table is
written; one worker holding replicas is then killed (SIGKILL). The master declares its tablet
server failed after ``--failed-after-s`` (Kudu's ``follower_unavailable_considered_failed_sec``)
and the client's healer replaces each of its replicas: add as NON_VOTER, tablet copy (served:
the new replica's host fetches the files from the source host's resident tablet server, see
``pyspark_kudu/spark/host/copy_fetch.py``), promote, evict. This runs once per
``--target-mb`` size of lost replicas (a fresh cluster each; ``--rows`` is derived from the
bytes per row the previous run measured, the first from ``--rows-per-mb``).

Measured per size:

- ``lost_bytes``: the bytes of the killed server's replicas (rowsets, WAL, metadata), and
  ``copy_bytes``: the bytes the tablet copies carried (rowset files and log tail);
- **copy bandwidth**: ``copy_bytes`` over the copy's own work as the hosts time it (the
  sources staging the copy: hard links and a CRC32C of every byte; then the targets
  fetching it: streams, CRC checks, every file fsynced), against this disk's fsync'd write
  bandwidth measured in the same run (``copy_bytes`` written to a file with one ``fsync``,
  median of three). Goal: ``copy_ratio >= 0.5``. Also ``copy_phase_ratio``: the same bytes
  over the two copy rounds end to end (their Spark scheduling and the install included; the
  rounds are the fixed part below);
- **rounds and stages** of the replacement (every round from the first healing action to
  full replication; tablets replaced together share rounds): the fixed part's goal is <= 4;
- **fail-over**: the killed server is one that leads a tablet (the one with the most
  replicas among those); ``failover_s``, from the kill until this client leads each tablet
  it led from another replica (elected when the driver sees the executor gone, long before
  the master declares the server failed; Kudu's followers elect after a few missed
  heartbeats);
- **failure detection**: from the kill to the first healing action, against the threshold
  ``--failed-after-s`` (goal: at most one heartbeat interval, ``spark.kudu.heartbeatIntervalSec``
  = 1 s, more);
- ``restore_s`` (first healing action to full replication) and the older end-to-end ratio
  ``disk_write_s / restore_s``. Every row is read back afterwards.

Run: ``.venv/bin/python benchmarks/recovery.py [--target-mb 200,1000] [--workers 4]``;
prints a table and saves ``results/recovery.{json,png}`` with the commit id and date. A
benchmark, never a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.dataplane import StagedRef
from pyspark_kudu.spark.host.tabletcopy import served_copy
from pyspark_kudu.testing.benchdata import commit_id
from pyspark_kudu.testing.host_load import HostLoad
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
HEARTBEAT_S = 1.0  # spark.kudu.heartbeatIntervalSec, the default
# Healing actions are stamped with the wall clock, rounds with the monotonic one: a round
# that starts this much before the first action's start still counts as the healer's.
_CLOCK_SLACK_S = 0.05


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
    ap.add_argument("--target-mb", default="200,1000",
                    help="sizes of the lost server's replicas to run at, in MB")
    ap.add_argument("--payload-bytes", type=int, default=1024,
                    help="incompressible bytes per row (rows of a realistic width)")
    ap.add_argument("--rows-per-mb", type=float, default=1200.0,
                    help="first guess of rows per MB of lost replicas (later runs measure it)")
    ap.add_argument("--rows", default="",
                    help="rows per size instead (comma-separated, one per --target-mb)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--tablets", type=int, default=4)
    ap.add_argument("--failed-after-s", type=float, default=5.0)
    args = ap.parse_args(argv)
    r: dict[str, Any] = {
        "commit": commit_id(REPO), "payload_bytes": args.payload_bytes,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "workers": args.workers, "tablets": args.tablets,
        "failed_after_s": args.failed_after_s, "heartbeat_s": HEARTBEAT_S, "runs": []}
    rows_per_mb = args.rows_per_mb
    fixed = [int(x) for x in args.rows.split(",") if x]
    for k, target in enumerate(float(x) for x in args.target_mb.split(",")):
        rows = fixed[k] if k < len(fixed) else int(target * rows_per_mb)
        run = _one_size(args, rows)
        run["target_mb"] = target
        r["runs"].append(run)
        _print_run(r, run)
        rows_per_mb = rows / max(run["lost_bytes"] / 1e6, 1e-9)
    _save(r)
    return 0


def _one_size(args: argparse.Namespace, rows: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    out: dict[str, Any] = {"rows": rows}
    try:
        with StandaloneCluster(base / "cluster", workers=args.workers) as cluster:
            spark = cluster_session(cluster.master_url, "bench-recovery", args.workers,
                                    executor_memory="900m", deadline_s=300,
                                    conf={"spark.sql.shuffle.partitions": str(args.workers)})
            try:
                out.update(_run(spark, args, rows, base, cluster))
            finally:
                spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)  # up to a few GB of replicas
    return out


def _run(spark: SparkSession, args: argparse.Namespace, nrows: int, base: Path,
         cluster: StandaloneCluster) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # 64 random-looking bytes per SHA-512: a payload Parquet cannot compress.
    payload = F.unhex(F.concat(*[
        F.sha2(F.concat(F.col("id").cast("string"), F.lit(f"-{k}")), 512)
        for k in range(max(1, args.payload_bytes // 64))]))
    df = (spark.range(nrows, numPartitions=args.workers)
          .select(F.col("id").cast("long").alias("id"), (F.col("id") * 3).alias("a"),
                  F.sha2(F.col("id").cast("string"), 256).alias("h"),
                  F.concat(F.lit("row-"), F.col("id").cast("string")).alias("c"),
                  payload.alias("p")))
    schema = StructType([StructField(f.name, f.dataType, f.name != "id") for f in df.schema])
    with KuduContext(spark, warehouse=str(base / "warehouse"), heal=True,
                     heal_interval_s=1.0, failed_after_s=args.failed_after_s) as kudu:
        kudu.create_table("bench", schema, keys=["id"], replicas=3,
                          partitioning=PartitionSchema((HashDimension(("id",),
                                                                      args.tablets),)))
        settled0 = kudu._service.settle_rounds
        t = time.perf_counter()
        kudu.write(df, "bench", "upsert")
        out["ingest_s"] = time.perf_counter() - t
        # The kill comes once the write service's settle round (followers applying the
        # last writes: seconds of real work after a large ingest) has run. A round in
        # flight at detection holds the healer's first action back by its duration (the
        # healer runs on the same round thread); this measures the failure detector.
        t = time.perf_counter()
        while kudu._service.settle_rounds <= settled0 and time.perf_counter() - t < 600:
            time.sleep(0.2)  # polling a counter, bounded above
        out["settle_s"] = time.perf_counter() - t
        host_of = {s.uuid: s.host for s in kudu.servers}
        locs = kudu.master.get_table("bench")
        count: dict[str, int] = {}
        for tb in locs.tablets:
            for v in tb.voters:
                count[v] = count.get(v, 0) + 1
        # The server with the most replicas among those leading a tablet: its loss needs a
        # fail-over (new leaders, at the executor's loss) as well as replacements.
        leaders = {tb.leader for tb in locs.tablets}
        victim_ts = max((v for v in count if v in leaders), key=lambda v: count[v],
                        default=max(count, key=lambda v: count[v]))
        victim = host_of[victim_ts]
        lost = [tb.tablet_id for tb in locs.tablets if victim_ts in tb.voters]
        led = [tb.tablet_id for tb in locs.tablets if tb.leader == victim_ts]
        out["led_tablets"] = len(led)
        root = cluster.data_root(victim)
        out["lost_replicas"] = len(lost)
        out["lost_bytes"] = sum(_dir_bytes(root / "tablets" / t) for t in lost)
        history0 = len(kudu.healer.history)
        rounds = _trace_rounds(kudu, spark)

        load = HostLoad().start()
        cluster.kill_worker(victim)
        killed = time.monotonic()
        end = killed + 1800
        seen = _watch_detection(kudu, spark, victim, victim_ts, killed, args.failed_after_s,
                                led)

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
        load.stop()
        steps = kudu.healer.history[history0:]
        first = min(a.at - a.seconds for a in steps)
        wall0 = time.time() - (done - killed)
        out["detected_s"] = max(0.0, first - wall0)
        seen["stop"] = True
        # Where detection time goes: the driver noticing the executor gone (liveness stops
        # heartbeating it), the master declaring the server failed, the healer acting.
        out["executor_lost_s"] = seen.get("executor_lost_s")
        out["master_failed_s"] = seen.get("master_failed_s")
        out["last_heard_s"] = seen.get("last_heard_s")
        out["failover_s"] = seen.get("failover_s")
        if "watch_error" in seen:
            out["watch_error"] = seen["watch_error"]
        out["total_s"] = done - killed
        out["restore_s"] = out["total_s"] - out["detected_s"]
        out["steps"] = [(a.action, a.outcome[:60], round(a.seconds, 2)) for a in steps]
        out["copies_s"] = sum(a.seconds for a in steps if a.action == "add_replica")
        after = [x for x in rounds if 0 <= x["t"] - killed <= out["total_s"]]
        out.update(_copy_phase(after))
        # The machine during the targets' fetches: CPU shares (every "host" shares its
        # cores) and the page cache still writing back the ingest (the disk is shared too).
        fetched = [t for x in after for t in x["fetched"]]
        if fetched:
            out["copy_fetch_load"] = load.window(min(t[1] for t in fetched),
                                                 max(t[2] for t in fetched))
        # The driver's prefetch asks after the kill (host, asked and answered, seconds from
        # the first fetch's start, whether the target's server started fetching): a target
        # whose fetch starts late was asked late, answered late, or fetched in the install.
        fetch0 = min((t[1] for x in after for t in x["fetched"]), default=0.0)
        wall_kill = time.time() - (time.monotonic() - killed)
        out["prefetch_asks"] = [
            (host, round(asked - fetch0, 3), round(answered - fetch0, 3), started)
            for _, host, asked, answered, started in list(
                getattr(kudu.transport, "prefetch_asks", ())) if asked >= wall_kill]
        # The same bytes written once to this disk with one fsync (median of three: one
        # write of a few hundred MB varies several-fold here).
        n = out["copy_bytes"] or out["lost_bytes"]
        probes = sorted(_disk_write_s(base, n) for _ in range(3))
        out["disk_write_probes_s"] = probes
        out["disk_write_s"] = probes[1]
        out["disk_bytes_per_s"] = n / probes[1]
        out["copy_ratio"] = out.get("copy_transfer_bytes_per_s", 0.0) / out["disk_bytes_per_s"]
        out["copy_phase_ratio"] = out["copy_bytes_per_s"] / out["disk_bytes_per_s"]
        out["ratio"] = out["disk_write_s"] / out["restore_s"]
        # The replacement's rounds start with the healer's first action; rounds before it
        # (a re-election of a tablet the lost server led: failover, not replacement) are
        # reported apart.
        healing = [x for x in after
                   if x["t"] - killed >= out["detected_s"] - _CLOCK_SLACK_S]
        out["rounds_after_kill"] = len(after)
        out["restore_rounds"] = len(healing)
        out["restore_stages"] = sum(x["stages"] for x in healing if x["stages"] >= 0)
        out["rounds"] = [(round(x["t"] - killed, 2), round(x["s"], 2), x["stages"], x["kinds"])
                         for x in after]
        got = kudu.read_table("bench").count()
        if got != nrows:
            raise AssertionError(f"read {got} rows after healing, wrote {nrows}")
        out["rows_read_back"] = got
        cluster.start_worker(victim)
    return out


def _watch_detection(kudu: KuduContext, spark: SparkSession, host: str, ts_uuid: str,
                     killed: float, failed_after_s: float, led: list[str]
                     ) -> dict[str, Any]:
    """Record (in a thread, every 0.1 s), in seconds after ``killed``: when the driver stops
    listing ``host``'s executor, when every tablet of ``led`` (those ``ts_uuid`` led) has a
    leader elsewhere (the fail-over), when the master last heard of ``ts_uuid`` (its
    ``unseen_s``) and when that silence reached the threshold."""
    from pyspark_kudu.spark.pinned import executor_hosts

    seen: dict[str, Any] = {}

    def watch() -> None:
        while not seen.get("stop") and time.monotonic() - killed < 600:
            now = time.monotonic() - killed
            try:
                if "executor_lost_s" not in seen and host not in executor_hosts(
                        spark.sparkContext):
                    seen["executor_lost_s"] = now
                if "failover_s" not in seen and all(
                        (lead := kudu._leaders.get(t)) is not None and lead.node is not None
                        and lead.leader_id != ts_uuid for t in led):
                    seen["failover_s"] = now
                for t in kudu.master.list_tservers():
                    unseen = float(t.get("unseen_s", -1.0))
                    if t["uuid"] != ts_uuid or unseen < 0:
                        continue
                    seen["last_heard_s"] = now - unseen
                    if unseen >= failed_after_s and "master_failed_s" not in seen:
                        seen["master_failed_s"] = now
            except Exception as e:  # the context is closing
                seen["watch_error"] = f"{type(e).__name__}: {e}"
                return
            if "master_failed_s" in seen and "failover_s" in seen:
                return
            time.sleep(0.1)  # sampling, not waiting for a condition

    threading.Thread(target=watch, daemon=True, name="bench-detection").start()
    return seen


def _span(timings: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Bytes and seconds of a set of ``(bytes, started, ended)`` timings (wall clock) that
    ran side by side: from the first start to the last end. Tasks fetching together report
    the same window once per copy, so bytes are summed and the window is their union."""
    return (sum(t[0] for t in timings),
            max(t[2] for t in timings) - min(t[1] for t in timings)) if timings else (0, 0.0)


def _copy_phase(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The copy phase, two ways:

    - ``copy_transfer_*``: the copy's own work, as the hosts timed it: the sources staging
      (linking the files, CRC32C of every byte) plus the targets fetching (streams from the
      source's server, CRC check, every file fsynced). The bytes moving; the goal's figure.
    - ``copy_phase_*``: from the start of the round with the COPY_OUTs to the end of the
      last with an INSTALL_COPY (the two rounds' Spark scheduling and the install included).
    """
    outs = [x for x in rounds if "copy_out" in x["kinds"]]
    ins = [x for x in rounds if "install_copy" in x["kinds"]]
    if not outs or not ins:
        return {"copy_bytes": 0, "copy_phase_s": 0.0, "copy_bytes_per_s": 0.0,
                "copy_path": "none", "install_rounds": 0}
    t0, t1 = outs[0]["t"], max(x["t"] + x["s"] for x in ins)
    n = sum(x["copy_bytes"] for x in ins)
    staged = [t for x in outs for t in x["staged"]]
    # Sources stage side by side (one per tablet): the slowest one's staging, without the
    # flush of its MemRowSet (the source's own pending work, done first so the rows travel
    # as a file; reported as copy_flush_s).
    stage_s = max((t[2] - t[1] - t[3] for t in staged), default=0.0)
    flush_s = max((t[3] for t in staged), default=0.0)
    fetches = [t for x in ins for t in x["fetched"]]
    fetched_bytes, fetch_s = _span(fetches)
    transfer_s = stage_s + fetch_s
    # Each target's own fetch window (its offset from the first start, its seconds): the
    # span above also holds the skew between the targets' task starts.
    first = min((t[1] for t in fetches), default=0.0)
    each = sorted((round(t[1] - first, 3), round(t[2] - t[1], 3)) for t in fetches)
    return {"copy_bytes": n, "copy_phase_s": t1 - t0, "copy_bytes_per_s": n / (t1 - t0),
            "copy_stage_s": stage_s, "copy_flush_s": flush_s, "copy_fetch_s": fetch_s,
            "copy_fetched_bytes": fetched_bytes, "copy_transfer_s": transfer_s,
            "copy_fetch_windows": each,
            "copy_transfer_bytes_per_s": n / transfer_s if transfer_s > 0 else 0.0,
            "install_round_s": sum(x["s"] for x in ins), "install_rounds": len(ins),
            "copy_path": "+".join(sorted({p for x in ins for p in x["paths"]}))}


def _trace_rounds(kudu: KuduContext, spark: SparkSession) -> list[dict[str, Any]]:
    """Record every replication round from now on: start, seconds, Spark stages, request
    kinds, and the bytes and path (served or shuffled) of the tablet copies it installs."""
    rounds: list[dict[str, Any]] = []
    transport = kudu.transport
    run = transport.run

    def next_stage() -> int:
        try:  # the DAG scheduler's stage counter (no status store without the UI)
            v = spark.sparkContext._jsc.sc().dagScheduler().nextStageId()
            return int(v if isinstance(v, int) else v.get())
        except Exception:  # a private JVM field; -1 says "unknown"
            return -1

    def traced(requests):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        s0 = next_stage()
        responses: dict[str, Any] = {}
        try:
            responses = run(requests)
            return responses
        finally:
            s1 = next_stage()
            kinds: dict[str, int] = {}
            nbytes, paths = 0, set()
            for reqs in requests.values():
                for req in reqs:
                    kinds[req.kind.value] = kinds.get(req.kind.value, 0) + 1
                    if req.kind.value != "install_copy":
                        continue
                    served = served_copy(req.entries)
                    if served is not None:
                        nbytes += served.total_bytes
                        paths.add("served")
                        continue
                    for e in req.entries:
                        ref = StagedRef.decode(e.data)
                        if ref is not None:
                            nbytes += ref.size
                            paths.add("shuffled")
            # The copies' own timings (wall clock): the sources staging them (COPY_OUT) and
            # the targets fetching them (INSTALL_COPY of a served copy).
            staged: list[Any] = []
            fetched: list[Any] = []
            for resps in (responses or {}).values():
                for resp in resps or ():
                    if resp.ok and resp.copy_timing:
                        (staged if resp.entries else fetched).append(resp.copy_timing)
            rounds.append({"t": t0, "s": time.monotonic() - t0,
                           "stages": s1 - s0 if min(s0, s1) >= 0 else -1,
                           "kinds": " ".join(f"{k}x{n}" for k, n in sorted(kinds.items())),
                           "copy_bytes": nbytes, "paths": sorted(paths),
                           "staged": staged, "fetched": fetched})

    transport.run = traced  # type: ignore[method-assign]
    return rounds


def _print_run(r: dict[str, Any], x: dict[str, Any]) -> None:
    mb = x["lost_bytes"] / 1e6
    print(f"--- {x['rows']:,} rows, RF=3, {r['tablets']} tablets, {r['workers']} workers; "
          f"ingest {x['ingest_s']:.1f} s")
    print(f"lost server: {x['lost_replicas']} replicas, {mb:.1f} MB on disk; tablet copies "
          f"carried {x['copy_bytes'] / 1e6:.1f} MB ({x['copy_path']}, "
          f"{x['install_rounds']} install round(s))")
    print(f"source MemRowSet flush first {x.get('copy_flush_s', 0):.2f} s; "
          f"copy transfer (staging {x.get('copy_stage_s', 0):.2f} s + fetch "
          f"{x.get('copy_fetch_s', 0):.2f} s) = "
          f"{x.get('copy_transfer_bytes_per_s', 0) / 1e6:.0f} MB/s (each target's fetch: "
          f"start offset, seconds: {x.get('copy_fetch_windows')}); this disk with fsync "
          f"{x['disk_bytes_per_s'] / 1e6:.0f} MB/s (probes "
          f"{', '.join(f'{p:.2f}' for p in x['disk_write_probes_s'])} s) -> "
          f"{x['copy_ratio']:.2f}x (goal >= 0.5x)")
    if x.get("copy_fetch_load"):
        ld = x["copy_fetch_load"]
        print(f"during the fetches: CPU busy {ld['cpu_busy']:.0%} (system "
              f"{ld['cpu_system']:.0%}), iowait {ld['cpu_iowait']:.0%}, steal "
              f"{ld['cpu_steal']:.0%}; dirty + writeback {ld['dirty_mb_at_start']:.0f} MB at "
              f"the start, peak {ld['dirty_mb_peak']:.0f} MB; CPU seconds by process kind: "
              f"{ld.get('process_cpu_s')}")
    if x.get("prefetch_asks"):
        print(f"prefetch asks (host, asked, answered: s from the first fetch's start, "
              f"started): {x['prefetch_asks']}")
    print(f"copy rounds (COPY_OUT round start to INSTALL_COPY round end) "
          f"{x['copy_phase_s']:.2f} s = {x['copy_bytes_per_s'] / 1e6:.0f} MB/s -> "
          f"{x.get('copy_phase_ratio', 0):.2f}x")
    print(f"rounds after the kill: {x.get('rounds_after_kill', x['restore_rounds'])} "
          f"(failover included); the lost server led {x.get('led_tablets', '?')} tablet(s), "
          f"led elsewhere after {_s(x.get('failover_s'))}")
    print(f"replacement: {x['restore_rounds']} rounds, {x['restore_stages']} Spark stages "
          f"(goal for the fixed part <= 4)")
    print(f"executor loss seen by the driver after {_s(x['executor_lost_s'])}; the master "
          f"last heard of the server at {_s(x.get('last_heard_s'))} and counted it silent "
          f"for the threshold at {_s(x['master_failed_s'])}")
    print(f"failure detected after {x['detected_s']:.1f} s (threshold {r['failed_after_s']} s,"
          f" heartbeat {r['heartbeat_s']} s; goal <= "
          f"{r['failed_after_s'] + r['heartbeat_s']:.1f} s); full replication restored "
          f"{x['restore_s']:.1f} s later -> end to end {x['ratio']:.2f}x of one disk write")
    for s in x["steps"]:
        print("   ", s)
    print("replication rounds after the kill (start s, seconds, stages, requests):")
    for rnd in x["rounds"]:
        print("   ", rnd)


def _s(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f} s"


def _save(r: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "recovery.json").write_text(json.dumps(r, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = r["runs"]
    labels = [f"{x['lost_bytes'] / 1e6:.0f} MB lost" for x in runs]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.6))
    pos = range(len(runs))
    transfer = [x.get("copy_transfer_bytes_per_s", 0.0) / 1e6 for x in runs]
    ax1.bar([p - 0.27 for p in pos], transfer, 0.27,
            label="copy transfer (staging + fetch)", color="tab:blue")
    ax1.bar(list(pos), [x["copy_bytes_per_s"] / 1e6 for x in runs], 0.27,
            label="copy rounds (with Spark)", color="tab:cyan")
    ax1.bar([p + 0.27 for p in pos], [x["disk_bytes_per_s"] / 1e6 for x in runs], 0.27,
            label="disk write + fsync", color="tab:gray")
    for p, x, t in zip(pos, runs, transfer, strict=True):
        ax1.annotate(f"{x['copy_ratio']:.2f}x", (p - 0.27, t), ha="center", va="bottom")
    ax1.set_xticks(list(pos), labels)
    ax1.set_ylabel("MB/s")
    ax1.set_title("copy bandwidth (goal >= 0.5x disk)")
    ax1.legend(fontsize=8)
    ax2.bar(labels, [x["restore_rounds"] for x in runs], color="tab:green", label="rounds")
    ax2.plot(labels, [x["restore_stages"] for x in runs], "o", color="k", label="stages")
    ax2.axhline(4, ls="--", color="tab:red", lw=1)
    ax2.set_title("rounds of a replacement (goal <= 4)")
    ax2.legend(fontsize=8)
    ax3.bar(labels, [x["detected_s"] for x in runs], color="tab:orange")
    ax3.axhline(r["failed_after_s"], ls=":", color="k", lw=1, label="threshold")
    ax3.axhline(r["failed_after_s"] + r["heartbeat_s"], ls="--", color="tab:red", lw=1,
                label="goal: + 1 heartbeat")
    ax3.set_ylabel("seconds")
    ax3.set_title("failure detection")
    ax3.legend(fontsize=8)
    fig.suptitle(f"re-replication after losing a tablet server, commit "
                 f"{r['commit'][:10]}, {r['date']}")
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / "recovery.png", dpi=120)
    print(f"saved {RESULTS_DIR / 'recovery.json'} and .png")


if __name__ == "__main__":
    sys.exit(main())
