"""Fixtures for in-process master groups: embedded replicas with fast Raft timing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.replica import ReplicaOptions
from pyspark_kudu.schema import ColumnSchema, Schema

FAST = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, heartbeat_ticks=2)
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``cond`` until truthy; fail saying ``what`` did not happen."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {timeout:.1f} s")
        time.sleep(0.01)


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
