"""Three standalone masters, SIGKILL of the leader in the middle of DDL (issue 5 tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from pyspark_kudu.errors import (
    AlreadyPresentError,
    InvalidArgumentError,
    KuduError,
    NotFoundError,
    TimedOutError,
)
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.localcluster import MasterProcessCluster
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.schema import ColumnSchema

from .conftest import SCHEMA, TOKEN, wait_until

PS = PartitionSchema((HashDimension(("id",), 3),))


class _Workload:
    """Create -> alter -> rename -> delete, table after table, checking every outcome."""

    def __init__(self, client: MasterClient) -> None:
        self.c = client
        self.done = 0
        self.outcomes: dict[str, int] = {}
        self.problems: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _op(self, what: str, fn: Callable[[], object], tolerated: type[KuduError]) -> None:
        try:
            fn()
            key = f"{what}:ok"
        except tolerated:
            key = f"{what}:{tolerated.__name__}"  # the first attempt had been applied
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.done += 1

    def _check(self, cond: bool, msg: str) -> None:
        if not cond:
            self.problems.append(msg)

    def _run(self) -> None:
        i = 0
        try:
            while not self.stop.is_set():
                name, renamed = f"k{i}", f"k{i}_r"
                self._op("create", lambda n=name: self.c.create_table(n, SCHEMA, PS),
                         AlreadyPresentError)
                t = self.c.get_table(name)
                self._check(len(t.tablets) == 3 and all(
                    tb.table_id == t.table.table_id for tb in t.tablets),
                    f"{name} half-created: {t}")
                self._op("alter", lambda n=name: self.c.alter_table(
                    n, add_columns=[ColumnSchema("x", "int32")]), AlreadyPresentError)
                self._check(self.c.get_table(name).table.schema.has_column("x"),
                            f"{name} lacks column x after AlterTable")
                self._op("rename", lambda n=name, r=renamed: self.c.alter_table(n, rename_to=r),
                         NotFoundError)
                t = self.c.get_table(renamed)
                self._check(t.table.schema.has_column("x") and len(t.tablets) == 3,
                            f"{renamed} is not the altered table: {t}")
                self._op("delete", lambda r=renamed: self.c.delete_table(r), NotFoundError)
                try:
                    self.c.get_table(renamed)
                    self.problems.append(f"{renamed} still exists after DeleteTable")
                except NotFoundError:
                    pass
                i += 1
        except Exception as e:  # any other outcome is a failure of the test
            self.problems.append(f"workload stopped at table k{i}: {type(e).__name__}: {e}")


def test_ddl_ends_ok_already_present_or_not_found_when_the_leader_is_sigkilled(
    quorum: MasterProcessCluster,
) -> None:
    client = quorum.client(timeout_s=60)
    w = _Workload(client)
    w.thread.start()
    try:
        for k in range(3):
            wait_until(lambda k=k: w.done >= 8 * (k + 1) or w.problems, 60,
                       f"8 more DDL operations before kill #{k + 1}")
            leader = quorum.wait_for_leader(30)
            quorum.kill(leader)  # SIGKILL, mid-stream of DDL
            others = [m for m in quorum.peers if m != leader]
            new = quorum.wait_for_leader(30, among=others)
            assert new != leader
            quorum.restart(leader)
        wait_until(lambda: w.done >= 8 * 4 or w.problems, 60, "DDL continuing after the kills")
    finally:
        w.stop.set()
        w.thread.join(timeout=120)
    assert not w.thread.is_alive(), "the workload hung"
    assert w.problems == []
    assert set(k.split(":")[1] for k in w.outcomes) <= {
        "ok", "AlreadyPresentError", "NotFoundError"}


def test_a_killed_master_restarts_and_catches_up(quorum: MasterProcessCluster) -> None:
    client = quorum.client(timeout_s=60)
    leader = quorum.wait_for_leader(30)
    quorum.kill(leader)
    for i in range(5):
        client.create_table(f"while_down_{i}", SCHEMA)
    quorum.restart(leader)
    addr = quorum.peers[leader]
    target = client.statuses()
    want = max(s["commit"] for s in target.values() if isinstance(s, dict))
    with MasterClient(addr, token=TOKEN, check_master_count=False) as one:
        wait_until(lambda: _applied(one, addr) >= want, 30, f"{leader} catching up to {want}")
        names = one.list_tables(max_staleness_s=10)
    assert {f"while_down_{i}" for i in range(5)} <= set(names)
    assert names == client.list_tables()


def _applied(c: MasterClient, addr: str) -> int:
    try:
        return int(c._channel(addr).call("status", {}, 1.0)["applied"])
    except KuduError:
        return -1


def test_a_client_given_one_master_of_three_names_the_expected_count(
    quorum: MasterProcessCluster,
) -> None:
    one = next(iter(quorum.peers.values()))
    with MasterClient(one, token=TOKEN, timeout_s=10) as c:
        with pytest.raises(InvalidArgumentError, match=r"with 1 master\(s\).*expects 3 master"):
            c.list_tables()


def test_all_masters_down_is_a_timeout_not_a_hang(quorum: MasterProcessCluster) -> None:
    for m in list(quorum.peers):
        quorum.kill(m)
    t0 = time.monotonic()
    with quorum.client(timeout_s=3) as c:
        with pytest.raises(TimedOutError, match=r"timed out after 3\.0 s.*unreachable"):
            c.create_table("nobody_home", SCHEMA)
    assert time.monotonic() - t0 < 25  # did not hang
    for m in list(quorum.peers):  # the whole group restarts from its logs
        quorum.restart(m)
    quorum.wait_for_leader(60)
    with quorum.client(timeout_s=30) as c:
        assert "while_down_0" in c.list_tables()
