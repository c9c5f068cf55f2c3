"""Demo: Raft consensus, a replicated table in Spark, and tablet servers in three racks.

Part 1 drives a 3-replica Raft group in-process: election, commits, leader loss, rejoin.
Part 2 starts a local SparkSession with 3 virtual tablet servers and an embedded master,
creates an RF=3 table, writes rows (with a duplicate to show Kudu's per-row errors), and reads
them back through scans. Part 3 runs ``spark-submit jobs/ingest.py`` on a generated CSV
(embedded master, local mode) and prints the ksck summary. Part 4 starts a Spark standalone
cluster on loopback whose workers (127.0.0.2..7, one tablet server each) sit in three racks
through the location mapping command (``conf/location_mapping.sh conf/topology.txt``, given
as ``spark.kudu.locationMappingCmd``), writes and reads an RF=3 table, runs ksck and draws
the replicas per location (a PNG; needs matplotlib: ``pip install .[dev]``).

    python jobs/demo.py [--seed N] [--rows N] [--png PATH]
    python jobs/demo.py --racks-only [--rows N] [--png PATH] [--workers 3..6] [--json PATH]

Spark's own log goes through ``conf/log4j2.properties`` (WARN), so the lines shown are the
demo's. Part 4 needs Linux (workers bind 127.0.0.2..7) and takes about a minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pyspark_kudu.consensus.demo import run_demo

REPO = Path(__file__).resolve().parents[1]
#: Spark's log at WARN (and two noisy loggers at ERROR): the demo's lines show.
LOG4J = REPO / "conf" / "log4j2.properties"
LOG4J_OPTION = f"-Dlog4j2.configurationFile={LOG4J}"
#: The location mapping command of part 4: the test cluster's hosts in /dc1/rack1..3.
RACK_MAPPING = f"{REPO / 'conf' / 'location_mapping.sh'} {REPO / 'conf' / 'topology.txt'}"
RACKS = ("/dc1/rack1", "/dc1/rack2", "/dc1/rack3")


def table_demo(rows: int, say: object = print, spark: object = None) -> int:
    """Create, write, read; returns the number of rows read back. Uses ``spark`` if given
    (and leaves it running), else starts and stops a local session."""
    assert callable(say)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from pyspark_kudu import HashDimension, KuduContext, PartitionSchema, Predicate
    from pyspark_kudu.errors import RowWriteError

    own = spark is None
    if own:
        spark = (SparkSession.builder.master("local[2]").appName("pyspark-kudu-demo")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.extraJavaOptions", LOG4J_OPTION)
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    assert isinstance(spark, SparkSession)
    schema = StructType([StructField("id", LongType(), False), StructField("name", StringType())])
    try:
        with KuduContext(spark, warehouse=tempfile.mkdtemp(prefix="kudu-demo-")) as kudu:
            kudu.create_table("people", schema, keys=["id"], replicas=3,
                              partitioning=PartitionSchema((HashDimension(("id",), 3),)))
            locs = kudu.master.get_table("people")
            say(f"created table 'people': {len(locs.tablets)} tablets x 3 replicas on "
                f"{len(kudu.servers)} tablet servers")
            df = spark.createDataFrame([(i, f"person-{i}") for i in range(rows)], schema)
            s = kudu.insert_rows(df, "people")
            say(f"inserted {s.rows_written} rows into {s.tablets} tablets (committed on a "
                f"majority of each tablet's replicas)")
            try:
                kudu.insert_rows(spark.createDataFrame([(0, "dup"), (rows, "new")], schema),
                                 "people")
            except RowWriteError as e:
                say(f"per-row errors as in Kudu: {e.errors[0][2]} for id "
                    f"{e.errors[0][1]['id']}; {e.rows_written} other row written")
            n = kudu.read_table("people").count()
            one = kudu.read_table("people", predicates=[Predicate.eq("id", 7)]).collect()
            say(f"read back {n} rows; id=7 -> {one[0]['name']} (pruned to 1 tablet)")
            return int(n)
    finally:
        if own:
            spark.stop()


def ingest_command(source: str, warehouse: str, table: str = "events") -> list[str]:
    """The part-3 command: ``spark-submit jobs/ingest.py`` on the embedded default master
    (local mode), creating an RF=3 table from a CSV and ending with the ksck summary."""
    from pyspark_kudu.spark.host.daemon import SESSION_CONF
    from pyspark_kudu.testing.standalone_cluster import spark_home

    confs = [a for k, v in SESSION_CONF for a in ("--conf", f"{k}={v}")]
    return [os.path.join(spark_home(), "bin", "spark-submit"), "--master", "local[2]",
            "--conf", "spark.ui.enabled=false", *confs,
            "--driver-java-options", LOG4J_OPTION,  # Spark's log at WARN: the job's lines show
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "ingest.py"),
            "--source", source, "--format", "csv", "--table", table, "--create",
            "--keys", "id", "--hash-buckets", "3", "--replicas", "3",
            "--warehouse", warehouse, "--ksck"]


def ingest_demo(rows: int) -> int:
    """Write a CSV of ``rows`` rows and ingest it with spark-submit; returns its exit code."""
    import subprocess

    work = tempfile.mkdtemp(prefix="kudu-ingest-demo-")
    src = os.path.join(work, "events.csv")
    with open(src, "w", encoding="utf-8") as f:
        f.write("id,name,score\n")
        f.writelines(f"{i},user-{i},{i * 0.5}\n" for i in range(rows))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = ingest_command(src, os.path.join(work, "warehouse"))
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, check=False).returncode


# -- part 4: tablet servers in three racks ---------------------------------------------------

def _section(text: str, title: str) -> list[str]:
    """The lines of ``title``'s table in ksck's text output (up to the next blank line)."""
    lines = text.splitlines()
    if title not in lines:
        return []
    start = lines.index(title)
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def racks_demo(rows: int = 1000, *, workers: int = 6, tablets: int = 6,
               png: str | None = None, work: str | None = None,
               say: Any = print) -> dict[str, Any]:
    """Part 4: ``workers`` (3..6) tablet servers on a standalone cluster in three racks.

    Starts a Spark master on 127.0.0.1 and workers on 127.0.0.2.., a SparkSession on it whose
    embedded master maps hosts to racks through ``spark.kudu.locationMappingCmd``
    (:data:`RACK_MAPPING`), creates an RF=3 table of ``tablets`` hash tablets, writes
    ``rows`` rows, reads them back, prints every tablet server's location and ksck's
    location summary and verdict, and draws replicas per location to ``png`` (default
    ``<work>/demo_racks.png``). The cluster is always stopped. Returns a JSON-able report
    (what ``--json`` writes).
    """
    if not 3 <= workers <= 6:
        raise ValueError(f"workers must be 3..6 (conf/topology.txt maps 127.0.0.2..7), "
                         f"not {workers}")
    t0 = time.monotonic()
    work_dir = Path(work or tempfile.mkdtemp(prefix="kudu-racks-demo-"))
    png_path = Path(png) if png else work_dir / "demo_racks.png"
    _plot_module()  # fail before starting anything if matplotlib is missing
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from pyspark_kudu import HashDimension, KuduContext, PartitionSchema
    from pyspark_kudu.spark.api.settings import LOCATION_MAPPING_CMD_CONF
    from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session
    from pyspark_kudu.tools.cli_cluster import ksck_report
    from pyspark_kudu.tools.connect import RemoteSource

    cluster = StandaloneCluster(work_dir / "cluster", workers=workers, memory="1g")
    last = f"127.0.0.{cluster.first_host + workers - 1}"
    say(f"starting a Spark standalone cluster: master 127.0.0.1, {workers} workers on "
        f"127.0.0.{cluster.first_host}..{last} (1 core each); logs in {cluster.base_dir} if it "
        f"fails")
    say(f"location mapping (spark.kudu.locationMappingCmd): {RACK_MAPPING}")
    spark = None
    ok = False
    try:
        cluster.start(deadline_s=180)
        spark = cluster_session(
            cluster.master_url, "pyspark-kudu-racks-demo", workers, deadline_s=180,
            conf={LOCATION_MAPPING_CMD_CONF: RACK_MAPPING,
                  "spark.driver.extraJavaOptions": LOG4J_OPTION,
                  "spark.sql.shuffle.partitions": str(workers)})
        say(f"cluster up: executors on {', '.join(cluster.hosts)} "
            f"({time.monotonic() - t0:.0f} s)")
        schema = StructType([StructField("id", LongType(), False),
                             StructField("name", StringType())])
        written = [(i, f"row-{i}") for i in range(rows)]
        with KuduContext(spark, warehouse=str(work_dir / "warehouse")) as kudu:
            kudu.create_table("racked", schema, keys=["id"], replicas=3,
                              partitioning=PartitionSchema((HashDimension(("id",), tablets),)))
            s = kudu.insert_rows(spark.createDataFrame(written, schema), "racked")
            say(f"created table 'racked' (RF=3, {tablets} hash tablets) and wrote "
                f"{s.rows_written} rows")
            read = sorted((r["id"], r["name"]) for r in kudu.read_table("racked").collect())
            say(f"read back {len(read)} rows: "
                f"{'equal to' if read == written else 'DIFFERENT FROM'} the rows written")
            table = kudu.master.get_table("racked")
            tservers = {str(t["uuid"]): t for t in kudu.master.list_tservers()}
            state = RemoteSource(kudu.master).state(masters=True)
            ksck_ok, ksck_text = ksck_report(state, "text")
            ksck_json = json.loads(ksck_report(state, "json")[1])
        loc_of = {u: t.get("location") for u, t in tservers.items()}
        per_server = Counter(u for tab in table.tablets for u in tab.voters)
        servers = sorted(({"uuid": u, "host": str(t["host"]), "location": loc_of[u],
                           "replicas": per_server[u]} for u, t in tservers.items()),
                         key=lambda d: (str(d["location"]), d["host"]))
        tablet_rows = [{"tablet_id": tab.tablet_id,
                        "by_location": dict(Counter(str(loc_of[u]) for u in tab.voters))}
                       for tab in table.tablets]
        say("tablet servers (location from the mapping command, run by the master):")
        for d in servers:
            say(f"  {d['uuid'][:8]}  {d['host']:<10} {d['location']}  "
                f"{d['replicas']} replicas")
        majority = 3 // 2 + 1
        worst = max(max(t["by_location"].values()) for t in tablet_rows)
        say(f"each of the {len(tablet_rows)} tablets has its 3 replicas in "
            f"{', '.join(sorted({str(k) for t in tablet_rows for k in t['by_location']}))}: "
            f"at most {worst} per location (a majority is {majority})")
        say("ksck (the report of pyspark-kudu cluster ksck and jobs/ksck.py):")
        for line in _section(ksck_text, "Tablet Server Location Summary"):
            say(f"  {line}")
        violations = ksck_json["placement_policy_violations"]
        say(f"ksck verdict: {'OK' if ksck_ok else 'ksck found issues'}, "
            f"{len(violations)} placement policy violations")
        if not ksck_ok:
            say(ksck_text)
        draw_racks(servers, tablet_rows, png_path)
        say(f"replicas per location: {png_path}")
        ok = True
        return {
            "servers": servers, "tablets": tablet_rows, "majority": majority,
            "rows_written": len(written), "rows_read": len(read),
            "rows_equal": read == written, "ksck_ok": ksck_ok,
            "ksck_locations": ksck_json["locations"], "ksck_violations": violations,
            "png": str(png_path), "seconds": round(time.monotonic() - t0, 1),
        }
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        say(f"cluster stopped ({time.monotonic() - t0:.0f} s in all)")
        if ok:  # on failure the cluster's logs stay for a look
            for leftover in (cluster.base_dir, work_dir / "warehouse"):
                shutil.rmtree(leftover, ignore_errors=True)
            if work is None and not any(work_dir.iterdir()):
                work_dir.rmdir()  # the PNG went elsewhere


def _plot_module() -> Any:
    """``matplotlib.pyplot`` on the Agg backend; a clear error without matplotlib (a dev
    dependency: ``pip install .[dev]``)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the rack demo draws a PNG with matplotlib, a dev dependency: "
                         "pip install .[dev]  (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_racks(servers: list[dict[str, Any]], tablets: list[dict[str, Any]],
               path: Path) -> None:
    """Left: replicas per location, one stacked segment per tablet server. Right: each
    tablet's replicas per location against a tablet's majority (dashed)."""
    plt = _plot_module()
    locations = sorted({str(d["location"]) for d in servers})
    colors = {loc: plt.get_cmap("tab10")(i) for i, loc in enumerate(locations)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8),
                                      gridspec_kw={"width_ratios": [1, 1.6]})
    for x, loc in enumerate(locations):
        bottom = 0
        for d in (d for d in servers if str(d["location"]) == loc):
            left.bar(x, d["replicas"], bottom=bottom, color=colors[loc], edgecolor="white",
                     linewidth=2, width=0.6)
            if d["replicas"]:
                left.text(x, bottom + d["replicas"] / 2, f"{d['host']}\n{d['uuid'][:8]}",
                          ha="center", va="center", fontsize=8, color="white")
            bottom += d["replicas"]
    left.set_xticks(range(len(locations)), locations)
    left.set_ylabel("replicas (all tablets)")
    left.set_title("Replicas per location, one segment per tablet server", fontsize=10)
    rf = max(sum(t["by_location"].values()) for t in tablets)
    majority = rf // 2 + 1
    width = 0.8 / len(locations)
    for i, loc in enumerate(locations):
        xs = [k + (i - (len(locations) - 1) / 2) * width for k in range(len(tablets))]
        right.bar(xs, [t["by_location"].get(loc, 0) for t in tablets], width=width * 0.95,
                  color=colors[loc], label=loc)
    right.axhline(majority, color="crimson", linestyle="--", linewidth=1.5,
                  label=f"majority of a tablet ({majority} of {rf})")
    right.set_xticks(range(len(tablets)),
                     [f"tablet {k + 1}\n{t['tablet_id'][:8]}" for k, t in enumerate(tablets)],
                     fontsize=8)
    right.set_ylim(0, rf + 0.5)
    right.set_yticks(range(rf + 1))
    right.set_ylabel("replicas of the tablet")
    right.set_title("Each tablet's replicas per location", fontsize=10)
    right.legend(fontsize=8, loc="upper right", ncol=2)
    worst = max(max(t["by_location"].values()) for t in tablets)
    verdict = ("No location holds a majority of any tablet" if worst < majority
               else "A location holds a majority of some tablet")
    fig.suptitle(f"{verdict}: RF={rf}, {len(tablets)} tablets on {len(servers)} tablet "
                 f"servers in {len(locations)} racks")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=7, help="seed of the simulated network")
    parser.add_argument("--rows", type=int, default=100,
                        help="rows to write in part 2 (x10 in parts 3 and 4)")
    parser.add_argument("--racks-only", action="store_true",
                        help="run only part 4, tablet servers in three racks")
    parser.add_argument("--png", metavar="PATH",
                        help="part 4's picture (default: demo_racks.png in its temp dir)")
    parser.add_argument("--workers", type=int, default=6, choices=range(3, 7), metavar="3..6",
                        help="part 4's workers = tablet servers (default 6, two per rack)")
    parser.add_argument("--json", metavar="PATH", help="write part 4's report as JSON")
    args = parser.parse_args()
    code = 0
    if not args.racks_only:
        print("== part 1: Raft consensus, in-process ==")
        run_demo(args.seed, print)
        print("== part 2: a replicated table in Spark ==")
        table_demo(args.rows)
        print("== part 3: spark-submit jobs/ingest.py, then ksck ==", flush=True)
        code = ingest_demo(args.rows * 10)
    print("== part 4: tablet servers in three racks ==", flush=True)
    report = racks_demo(args.rows * 10, workers=args.workers, png=args.png,
                        say=lambda line: print(line, flush=True))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    good = report["ksck_ok"] and report["rows_equal"]
    sys.exit(code or (0 if good else 1))


if __name__ == "__main__":
    main()
