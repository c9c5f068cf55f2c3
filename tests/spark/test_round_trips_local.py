"""Real replication rounds give the driver a round-trip estimate per host, its heartbeats
carry it to the master, and ``cluster ksck`` prints it (local mode, issue 20 point 5)."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.tools.cli_cluster import ksck_report
from pyspark_kudu.tools.connect import RemoteSource
from tests.waiting import wait_until

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])


def test_rounds_estimate_the_round_trip_to_their_host_and_ksck_prints_it(
    spark: SparkSession, tmp_path: Path,
) -> None:
    with KuduContext(spark, warehouse=str(tmp_path / "wh")) as kudu:
        kudu.create_table("t", STRUCT, keys=["id"], replicas=3,
                          partitioning=PartitionSchema((HashDimension(("id",), 2),)))
        kudu.insert_rows(spark.createDataFrame([(i, str(i)) for i in range(20)], STRUCT), "t")
        (host,) = {s.host for s in kudu.servers}  # local mode: virtual servers on one host
        est = kudu.transport.host_rtt()
        assert set(est) == {host}, est
        # Every round so far was a sample (creating, electing, writing, committing).
        assert 1 <= est[host].samples <= kudu.transport.rounds
        assert 0.0 <= est[host].ms < 10_000.0

        def reported() -> bool:
            return all("round_trip_ms" in t for t in kudu.master.list_tservers())

        wait_until(reported, 30, "the heartbeats carrying the estimate to the master")
        state = RemoteSource(kudu.master).state(masters=True)
        ok, text = ksck_report(state)
        assert ok, text  # one host, no location: nothing to warn about
        lines = text.splitlines()
        at = lines.index("Round trips from the driver (replication rounds)")
        rows = [[c.strip() for c in line.split("|")] for line in lines[at + 3:at + 6]]
        assert sorted(r[0] for r in rows) == sorted(s.uuid for s in kudu.servers), text
        for _, _, ms, samples, _ in rows:
            assert float(ms) >= 0.0 and int(samples) >= 1
        data = json.loads(ksck_report(state, "json")[1])
        assert {r["UUID"] for r in data["round_trips"]} == {s.uuid for s in kudu.servers}
        assert data["slow_tablets"] == [] and data["location_round_trips"] == []
