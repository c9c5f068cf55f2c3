"""Concurrent writers' commit reports reach the master together (group commit) and still
before each write returns (local mode, real master and Spark)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from tests.waiting import wait_until

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
WRITERS = 6


def test_writers_reporting_during_a_report_share_the_next_and_return_after_it(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with KuduContext(spark, warehouse=str(tmp_path / "wh")) as kudu:
        kudu.create_table("t", STRUCT, keys=["id"], replicas=3,
                          partitioning=PartitionSchema((HashDimension(("id",), 3),)))
        kudu.upsert_rows(spark.createDataFrame([(-1, "x")], STRUCT), "t")  # leaders elected
        frames = [spark.createDataFrame([(i, f"v{i}")], STRUCT) for i in range(WRITERS)]
        reported: list[list[str]] = []  # tablets of each report-carrying heartbeat
        gate = threading.Event()
        heartbeat = kudu.master.heartbeat_to

        def held(address: str, meta: Any, reports: Any = (), **kw: Any) -> Any:
            if reports:  # the liveness reporter's heartbeats carry none: never held
                reported.append([r["tablet_id"] for r in reports])
                if len(reported) == 1:
                    assert gate.wait(120), "the test never let the first report through"
            return heartbeat(address, meta, reports, **kw)

        monkeypatch.setattr(kudu.master, "heartbeat_to", held)
        own: dict[int, tuple[str, int]] = {}  # writer thread -> its write's tablet, index
        note_acked = kudu._note_acked

        def noted(tid: str, leader_id: str, outcome: Any) -> None:
            own[threading.get_ident()] = (tid, max(i for i, _, _ in outcome))
            note_acked(tid, leader_id, outcome)

        monkeypatch.setattr(kudu, "_note_acked", noted)
        before = (kudu._commit_reports.sends, kudu._commit_reports.reports)
        returned: dict[int, int] = {}  # writer -> report sends begun when it returned
        errors: list[BaseException] = []

        def write(i: int) -> None:
            try:
                kudu.upsert_rows(frames[i], "t")
                returned[i] = kudu._commit_reports.sends - before[0]
                # Its entry is committed in the master's view when the write returns.
                tid, index = own[threading.get_ident()]
                assert tid == _tablet_of(kudu, i)
                known = {t.tablet_id: t.committed_index
                         for t in kudu.master.get_table("t").tablets}
                assert known[tid] >= index, (i, tid, known[tid], index)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        first = threading.Thread(target=write, args=(0,))
        first.start()
        wait_until(lambda: len(reported) == 1, 60, "the first writer's report being sent")
        rest = [threading.Thread(target=write, args=(i,)) for i in range(1, WRITERS)]
        for t in rest:
            t.start()
        wait_until(lambda: kudu._commit_reports.reports - before[1] == WRITERS, 120,
                   "every writer replicating its write and reporting it")
        assert not returned, f"writers returned before their report was sent: {returned}"
        gate.set()
        for t in [first, *rest]:
            t.join(120)
            assert not t.is_alive(), "a writer did not return"
        assert not errors, errors
        # One send for the first writer, one for the other five together (each a heartbeat
        # per leader's tablet server), not one per write.
        assert kudu._commit_reports.sends - before[0] == 2
        assert sorted(returned) == list(range(WRITERS))
        assert all(n == 2 for i, n in returned.items() if i), returned
        later = {t for hb in reported[1:] for t in hb}
        assert later == {_tablet_of(kudu, i) for i in range(1, WRITERS)}
        assert sorted(r[0] for r in kudu.read_table("t").collect()) == [-1, *range(WRITERS)]


def _tablet_of(kudu: KuduContext, key: int) -> str:
    """The tablet holding ``key`` (routed as writes route it)."""
    info = kudu.master.get_table("t")
    part = Partitioner(info.table.schema, PartitionSchema.from_dict(
        info.table.partition_schema, info.table.schema))
    return info.tablets[part.route_row({"id": key})].tablet_id
