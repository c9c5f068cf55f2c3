# Databricks notebook source
# MAGIC %md
# MAGIC # pyspark-kudu quickstart
# MAGIC
# MAGIC Kudu-style replicated tables inside Spark: every table is split into tablets, every
# MAGIC tablet is a Raft group of replicas on executor hosts, and every read or write of a
# MAGIC replica is a Spark task pinned to its host. This notebook
# MAGIC
# MAGIC 1. starts a local SparkSession and a `KuduContext` (an embedded master and four virtual
# MAGIC    tablet servers under a temporary warehouse directory),
# MAGIC 2. creates a table with 4 hash partitions and replication factor 3,
# MAGIC 3. writes a DataFrame and reads it back with predicates,
# MAGIC 4. draws where the replicas are, per location,
# MAGIC 5. retires one tablet server and watches the cluster heal: its replicas are copied to
# MAGIC    the others and evicted, with every row still there.
# MAGIC
# MAGIC Run it in Jupyter with the project's virtualenv as kernel (`notebooks/quickstart.ipynb`,
# MAGIC generated from this file by `notebooks/build_ipynb.py`), or import this file into
# MAGIC Databricks on a cluster whose driver and executors have `pyspark-kudu` installed.

# COMMAND ----------

import os
import shutil
import sys
import tempfile
from collections import Counter

import matplotlib.pyplot as plt
from IPython.display import Image, display
from pyspark.sql import SparkSession
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from pyspark_kudu import HashDimension, KuduContext, PartitionSchema, Predicate
from pyspark_kudu.errors import RowWriteError
from pyspark_kudu.tools.tserver import NO_LOCATION_TEXT

# Spark's Python workers must run this Python, the one where pyspark-kudu is installed.
os.environ["PYSPARK_PYTHON"] = sys.executable

spark = (SparkSession.builder.master("local[2]").appName("pyspark-kudu-quickstart")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")  # keep stage bars out of the cells
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
warehouse = tempfile.mkdtemp(prefix="kudu-quickstart-")
print(f"Spark {spark.version} on {spark.sparkContext.master}; warehouse {warehouse}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## A KuduContext
# MAGIC
# MAGIC With no `master=` argument the context embeds the master (the catalog, replicated with
# MAGIC Raft) in this driver and keeps it under the warehouse directory. In `local[*]` mode it
# MAGIC runs `local_tablet_servers` virtual tablet servers, each with its own data root; on a
# MAGIC cluster there is one tablet server per executor host.

# COMMAND ----------

kudu = KuduContext(spark, warehouse=warehouse, local_tablet_servers=4)
for server in kudu.servers:
    print(f"tablet server {server.uuid[:8]} on host {server.host}, data root {server.root}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Create a table: 4 tablets, 3 replicas each
# MAGIC
# MAGIC The primary key column is NOT NULL. Rows are routed to tablets by a hash of the key;
# MAGIC the master places each tablet's 3 replicas on 3 different tablet servers.

# COMMAND ----------

schema = StructType([
    StructField("id", LongType(), False),
    StructField("city", StringType()),
    StructField("temperature", DoubleType()),
])
kudu.create_table("weather", schema, keys=["id"], replicas=3,
                  partitioning=PartitionSchema((HashDimension(("id",), 4),)))
table = kudu.master.get_table("weather")
print(f"table weather: {len(table.tablets)} tablets x {table.table.replication_factor} replicas")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Write a DataFrame
# MAGIC
# MAGIC `kudu.write(df, table, operation)` returns once every batch is committed on a majority of
# MAGIC its tablet's replicas. Kudu's per-row errors (here: inserting a key that exists) are
# MAGIC reported per row; the other rows of the write are written.

# COMMAND ----------

cities = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka"]
df = spark.createDataFrame([(i, cities[i % 5], 10.0 + i) for i in range(50)], schema)
print(kudu.write(df, "weather", "upsert"))
try:
    kudu.write(spark.createDataFrame([(7, "Lisbon", 99.0)], schema), "weather", "insert")
except RowWriteError as e:
    print(f"per-row error: {e.errors[0][2]} for {e.errors[0][1]}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Read with predicates
# MAGIC
# MAGIC `read_table` is a lazy DataFrame. An equality predicate on the hash key prunes the scan
# MAGIC to one tablet; predicates are evaluated inside the replica scans.

# COMMAND ----------

one = kudu.read_table("weather", predicates=[Predicate.eq("id", 7)])
print(f"id = 7 scans {one.rdd.getNumPartitions()} of {len(table.tablets)} tablets")
one.show()
first = kudu.read_table("weather", columns=["id", "city"], predicates=[Predicate.lt("id", 5)])
print("id < 5:", sorted(tuple(r) for r in first.collect()))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Where the replicas are
# MAGIC
# MAGIC The master knows each tablet's replicas, each tablet server's location (from the
# MAGIC `location_mapping_cmd`, e.g. `conf/location_mapping.sh`) and each tablet's current
# MAGIC leader. In local mode the virtual tablet servers share the driver's host, so they share
# MAGIC one location; on the test cluster they spread over three racks and the placement policy
# MAGIC keeps at most a minority of each tablet's replicas in any one rack.

# COMMAND ----------

table = kudu.master.get_table("weather")
replicas: Counter[str] = Counter()
leaders: Counter[str] = Counter()
for tablet in table.tablets:
    replicas.update(r.ts_uuid for r in tablet.replicas)
    if tablet.leader:
        leaders[tablet.leader] += 1
servers = sorted(table.tservers.values(), key=lambda t: (t.location or "", t.uuid))
locations = sorted({t.location or NO_LOCATION_TEXT for t in servers})
for loc in locations:
    here = [t for t in servers if (t.location or NO_LOCATION_TEXT) == loc]
    print(f"location {loc}: {len(here)} tablet servers, "
          f"{sum(replicas[t.uuid] for t in here)} replicas, "
          f"{sum(leaders[t.uuid] for t in here)} leaders")

fig, ax = plt.subplots(figsize=(7, 3.5))
xs = range(len(servers))
colors = [f"C{locations.index(t.location or NO_LOCATION_TEXT)}" for t in servers]
ax.bar(xs, [replicas[t.uuid] for t in servers], color=colors, label="replicas")
ax.bar(xs, [leaders[t.uuid] for t in servers], color="black", width=0.3, label="leaders")
ax.set_xticks(list(xs), [f"{t.uuid[:8]}\n{t.location or NO_LOCATION_TEXT}" for t in servers])
ax.set_ylim(0, max(replicas.values()) + 1.5)
ax.yaxis.get_major_locator().set_params(integer=True)
ax.set_ylabel("replicas of table weather")
ax.set_title("Replicas and leaders per tablet server (colour: location)")
ax.legend(loc="upper right", ncols=2)
fig.tight_layout()
chart = os.path.join(warehouse, "placement.png")
fig.savefig(chart, dpi=80)
plt.close(fig)
display(Image(filename=chart))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Kill and heal
# MAGIC
# MAGIC An operator retires a tablet server (say its disk reports errors) by marking its
# MAGIC replicas REPLACE. The master plans, for each, a new replica elsewhere; the context's
# MAGIC healer carries it out with Spark jobs: add the new replica as a non-voter, copy the
# MAGIC tablet to it (a pinned read, a shuffle, a pinned write), promote it, evict the old one
# MAGIC (3-4-3). A *dead* server heals the same way once the master has not heard from it for
# MAGIC `follower_unavailable_considered_failed_sec`: on the standalone test cluster, SIGKILL
# MAGIC one worker and watch `jobs/ksck.py` go from UNDER_REPLICATED back to HEALTHY.

# COMMAND ----------

def replicas_per_server() -> dict[str, int]:
    counts = Counter(v for t in kudu.master.get_table("weather").tablets for v in t.voters)
    return {s.uuid[:8]: counts.get(s.uuid, 0) for s in kudu.servers}


retired = max(kudu.servers, key=lambda s: replicas_per_server()[s.uuid[:8]]).uuid
print("before:", replicas_per_server(), "- retiring", retired[:8])
for t in kudu.master.get_table("weather").tablets:
    if t.replica(retired) is not None:
        kudu.master.set_replace(t.tablet_id, retired)
quiet, steps = kudu.healer.until_quiet(timeout_s=300)
for step in steps:
    print(f"  {step.action:<15} tablet {step.tablet_id[:8]} on {step.ts_uuid[:8]}: "
          f"{step.outcome} ({step.seconds:.1f} s)")
print("after: ", replicas_per_server(), "- healed" if quiet else "- NOT healed")
print("rows still there:", kudu.read_table("weather").count())
print("evicted replicas deleted:", kudu.sweep_replicas())

# COMMAND ----------

# MAGIC %md
# MAGIC ## Clean up
# MAGIC
# MAGIC Close the context (it owns the embedded master), stop Spark, remove the warehouse.

# COMMAND ----------

kudu.close()
spark.stop()
shutil.rmtree(warehouse)
print("done")
