"""Fixtures for in-process master groups: embedded replicas with fast Raft timing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pyspark_kudu.master.catalog_replica import ReplicaOptions
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.schema import ColumnSchema, Schema
from tests.waiting import wait_until

FAST = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, heartbeat_ticks=2)
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))


def register_tservers(group: EmbeddedMaster, n: int = 3) -> list[TServerMeta]:
    """Heartbeat ``n`` tablet servers to every master (registration on the leader)."""
    tss = [TServerMeta(f"ts{i}", f"127.0.0.{i + 2}", 7050, f"/data/ts{i}") for i in range(n)]
    with group.client() as c:
        leader_addr = group.addresses[group.leader().id]
        for ts in tss:
            for a in group.addresses.values():
                c.heartbeat_to(a, ts)
            wait_until(lambda ts=ts: ts.uuid in group.replicas[group.leader().id].catalog.tservers,
                       5, f"registration of {ts.uuid} via {leader_addr}")
    return tss


@pytest.fixture
def group3(tmp_path: Path) -> Iterator[EmbeddedMaster]:
    g = EmbeddedMaster(str(tmp_path / "wh"), 3, options=FAST)
    try:
        g.leader()
        yield g
    finally:
        g.close()


@pytest.fixture
def group1(tmp_path: Path) -> Iterator[EmbeddedMaster]:
    g = EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST)
    try:
        yield g
    finally:
        g.close()
