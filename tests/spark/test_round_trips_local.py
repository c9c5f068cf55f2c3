"""Real replication rounds give the driver a round-trip estimate per host, its heartbeats
carry it to the master, and ``cluster ksck`` prints it (local mode, issue 20 point 5)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.replication import latency
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
        # A round becomes a sample once Spark's listener recorded its job (asynchronously).
        wait_until(lambda: set(kudu.transport.host_rtt()) == {host}, 30,
                   "an estimate for the host from the rounds' recorded task timings")
        est = kudu.transport.host_rtt()
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


def test_task_delays_read_as_one_json_text_equal_the_task_by_task_walk(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round's task timings come back as one JSON text (Spark's Jackson with its Scala
    module) instead of ~8 Py4J calls per task; they must be the same timings."""
    sc = spark.sparkContext
    group = "test-task-delays-json"

    def job() -> None:  # its own thread: the job group is a thread's local property
        sc.setJobGroup(group, "four tasks to read the timings of")
        sc.parallelize(range(4), 4).map(lambda x: x).collect()

    runner = threading.Thread(target=job)
    runner.start()
    runner.join()
    assert latency._task_mapper(sc) is not None  # this Spark has the mapper: JSON is read
    as_json = latency.spark_task_delays(sc)
    got: list[Mapping[int, float] | None] = [None]

    def recorded() -> bool:
        got[0] = as_json(group)
        return got[0] is not None

    wait_until(recorded, 30, "the status store recording the finished job")
    monkeypatch.setattr(latency, "_task_mapper", lambda sc: None)
    walked = latency.spark_task_delays(sc)(group)
    assert got[0] == walked
    assert got[0] is not None and set(got[0]) == {0, 1, 2, 3}
    assert all(0.0 <= d < 60.0 for d in got[0].values())
