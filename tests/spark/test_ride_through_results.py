"""Riding through a round whose replies were lost after its entries became durable on every
replica (a stage aborted by a dying executor looks like this to the driver): the write's
entries are held by the new leader's log, commit with its next entry, and an insert still
reports its per-row results exactly (they come from the new leader replica's apply).

Local mode, the real ``KuduContext``; the fault is a transport that runs a round for real
and then answers as a stage failed as a whole does (every server ``None``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.errors import RowWriteError
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse, RequestKind

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])


class _LoseReplies:
    """Wraps a transport's ``run``: once armed, the next ``failures`` rounds that persist
    data entries run for real, then report every server as failed (no responses)."""

    def __init__(self, kudu: KuduContext, failures: int) -> None:
        self.real = kudu.transport.run
        self.left = 0
        self.failures = failures
        self.lost = 0

    def arm(self) -> None:
        self.left = self.failures

    def __call__(self, requests: Mapping[str, Sequence[PeerRequest]]
                 ) -> dict[str, list[PeerResponse] | None]:
        out = self.real(requests)
        carries_data = any(r.kind == RequestKind.PERSIST and any(e.data for e in r.entries)
                           for rs in requests.values() for r in rs)
        if self.left and carries_data:
            self.left -= 1
            self.lost += 1
            return dict.fromkeys(out)
        return out


def _term(kudu: KuduContext, tablet_id: str) -> int:
    node = kudu._leaders[tablet_id].node
    assert node is not None, f"no leader of tablet {tablet_id}"
    return node.term


@pytest.fixture
def kudu(spark: SparkSession, tmp_path: Path) -> Iterator[KuduContext]:
    with KuduContext(spark, warehouse=str(tmp_path / "wh")) as ctx:
        yield ctx


def test_an_insert_whose_round_lost_its_replies_reports_its_row_errors_exactly(
        spark: SparkSession, kudu: KuduContext, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pyspark_kudu.spark.api.ride_through")
    kudu.create_table("held", STRUCT, keys=["id"], replicas=3)  # one tablet
    kudu.insert_rows(spark.createDataFrame([(1, "one"), (2, "two")], STRUCT), "held")
    (tablet,) = kudu.master.get_table("held").tablets
    term_before = _term(kudu, tablet.tablet_id)
    lose = _LoseReplies(kudu, failures=3)  # every attempt of the round (run_with_retries)
    monkeypatch.setattr(kudu.transport, "run", lose)
    lose.arm()
    with pytest.raises(RowWriteError) as info:
        kudu.insert_rows(spark.createDataFrame([(2, "dup"), (3, "three"), (4, "four")],
                                               STRUCT), "held")
    assert lose.lost == 3, f"the fault hit {lose.lost} rounds, not the 3 attempts of one"
    err = info.value
    assert err.rows_written == 2, err
    assert [(e[1], e[2]) for e in err.errors] == [({"id": 2}, "AlreadyPresent")], err.errors
    got = {r["id"]: r["v"] for r in kudu.read_table("held").collect()}
    assert got == {1: "one", 2: "two", 3: "three", 4: "four"}
    # A new leader finished the write (the old one's replies never arrived).
    assert _term(kudu, tablet.tablet_id) > term_before
    # ... and its entry was held (committed with the new leader's), not proposed again.
    assert re.search(r"\(0 of [1-9]\d* batches proposed again\)", caplog.text), caplog.text


def test_an_upsert_whose_round_lost_its_replies_is_applied_once(
        spark: SparkSession, kudu: KuduContext, monkeypatch: pytest.MonkeyPatch) -> None:
    kudu.create_table("once", STRUCT, keys=["id"], replicas=3,
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.upsert_rows(spark.createDataFrame([(1, "a")], STRUCT), "once")
    lose = _LoseReplies(kudu, failures=3)
    monkeypatch.setattr(kudu.transport, "run", lose)
    lose.arm()
    summary = kudu.upsert_rows(spark.createDataFrame([(i, f"v{i}") for i in range(10)],
                                                     STRUCT), "once")
    assert lose.lost == 3, f"the fault hit {lose.lost} rounds, not the 3 attempts of one"
    assert summary.rows_written == 10, summary
    got = sorted((r["id"], r["v"]) for r in kudu.read_table("once").collect())
    assert got == [(i, f"v{i}") for i in range(10)]


def test_a_write_whose_leader_failed_over_meanwhile_finishes_without_another_election(
        spark: SparkSession, kudu: KuduContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader replica's executor is lost between a write's routing and its round, and
    the fail-over (``KuduContext.fail_over``) elects a new leader on another replica: the
    write, whose round finds its leader given up, finishes under the new one (ride-through)
    and does not elect a third over it."""
    from pyspark_kudu.spark.api import writes

    kudu.create_table("moved", STRUCT, keys=["id"], replicas=3)  # one tablet
    kudu.upsert_rows(spark.createDataFrame([(1, "a")], STRUCT), "moved")
    (tablet,) = kudu.master.get_table("moved").tablets
    tid = tablet.tablet_id
    old = kudu._leaders[tid]
    elections: list[list[str]] = []
    real_elect = writes.elect_all

    def counted_elect(transport: object, batch: Sequence[object]) -> object:
        elections.append([b.leader_id for b in batch])  # type: ignore[attr-defined]
        return real_elect(transport, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(writes, "elect_all", counted_elect)
    real_submit = kudu._service.submit
    moved: list[list[str]] = []

    def submit(lead: object, batches: Sequence[bytes], **kw: object) -> object:
        if lead is old and not moved:  # the fail-over lands between routing and round
            moved.append(kudu._service.call(lambda: kudu.fail_over({old.leader_id})).result())
        return real_submit(lead, batches, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(kudu._service, "submit", submit)
    summary = kudu.upsert_rows(spark.createDataFrame([(1, "b"), (2, "c")], STRUCT), "moved")
    assert moved == [[tid]], f"the fail-over moved {moved}"
    assert summary.rows_written == 2 and summary.row_errors == 0
    assert len(elections) == 1, f"elections after the fail-over's own: {elections[1:]}"
    assert old.leader_id not in elections[0]
    new = kudu._leaders[tid]
    assert new is not old and new.node is not None and new.leader_id != old.leader_id
    got = sorted(tuple(r) for r in kudu.read_table("moved").collect())
    assert got == [(1, "b"), (2, "c")]
