"""Tablet leadership leases in the master (:mod:`pyspark_kudu.master.leases`) and through
the master service of a real one-replica master (embedded, in process)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.leases import MAX_LEASE_S, LeaseTable

A = {"host": "127.0.0.1", "port": 1}
B = {"host": "127.0.0.1", "port": 2}


def test_a_lease_is_granted_renewed_refused_to_others_until_it_lapses_and_released() -> None:
    t = LeaseTable()
    got = t.acquire("a", A, ["t1", "t2"], 10.0, now=0.0)
    assert {k: (v.client, v.expires) for k, v in got.items()} == {"t1": ("a", 10.0),
                                                                   "t2": ("a", 10.0)}
    # Another client is answered the holder, and nothing changes for it.
    got = t.acquire("b", B, ["t1"], 10.0, now=5.0)
    assert got["t1"].client == "a" and got["t1"].endpoint == A and got["t1"].expires == 10.0
    # Renewal by the holder extends it.
    assert t.acquire("a", A, ["t1"], 10.0, now=8.0)["t1"].expires == 18.0
    assert t.acquire("b", B, ["t1"], 10.0, now=17.9)["t1"].client == "a"
    # Lapsed: the next asker gets it.
    got = t.acquire("b", B, ["t1", "t2"], 10.0, now=18.0)
    assert got["t1"].client == "b" and got["t2"].client == "b" and got["t1"].endpoint == B
    # Releasing someone else's lease does nothing; the holder's own release frees it.
    t.release("a", ["t1"])
    assert t.acquire("a", A, ["t1"], 10.0, now=19.0)["t1"].client == "b"
    t.release("b", ["t1"])
    assert t.acquire("a", A, ["t1"], 10.0, now=19.0)["t1"].client == "a"


def test_a_lease_is_capped_and_lapsed_ones_are_forgotten() -> None:
    t = LeaseTable()
    assert t.acquire("a", A, ["t"], 10 * MAX_LEASE_S, now=0.0)["t"].expires == MAX_LEASE_S
    t.expire(now=MAX_LEASE_S)
    assert t._leases == {}


def test_the_master_service_grants_one_holder_per_tablet(tmp_path: Path) -> None:
    with EmbeddedMaster(str(tmp_path), 1) as master, master.client() as client:
        got = client.tablet_lease("a", ["t1"], ttl_s=30.0, endpoint=A)
        assert got["t1"]["client"] == "a" and 0 < got["t1"]["expires_in_s"] <= 30.0
        got = client.tablet_lease("b", ["t1", "t2"], ttl_s=30.0, endpoint=B)
        assert got["t1"]["client"] == "a" and got["t1"]["endpoint"] == A
        assert got["t2"]["client"] == "b"
        client.tablet_lease("a", ["t1"], release=True)
        assert client.tablet_lease("b", ["t1"], ttl_s=30.0, endpoint=B)["t1"]["client"] == "b"
        with pytest.raises(InvalidArgumentError, match="malformed tablet_lease"):
            client.call("tablet_lease", {"client": "a"})


def _wait(cond: Callable[[], bool], what: str, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {deadline_s} s")
        time.sleep(0.05)  # polling a condition under a deadline


def test_the_client_keeper_routes_renews_lets_idle_leases_lapse_and_releases(
    tmp_path: Path,
) -> None:
    from pyspark_kudu.spark.replication.lease_keeper import LeaseKeeper
    from pyspark_kudu.spark.replication.session_client import SessionAddress

    a_addr = SessionAddress("127.0.0.1", 1, "sa")
    b_addr = SessionAddress("127.0.0.1", 2, "sb")
    with EmbeddedMaster(str(tmp_path), 1) as master, master.client() as client:
        # Leases of 2 s, renewed every 0.67 s: a renewal would have to be late by 1.3 s
        # for one to lapse by accident.
        a = LeaseKeeper(client, "a", a_addr, ttl_s=2.0, idle_s=3.0)
        b = LeaseKeeper(client, "b", b_addr, ttl_s=2.0)
        off = LeaseKeeper(client, "off", b_addr, ttl_s=0)
        try:
            assert a.route(["t1", "t2"]) == {"t1": None, "t2": None}
            assert a.holds("t1") and not b.holds("t1")
            # The other client is told where to forward, never the holder's secret (the
            # master does not learn it): it calls with its own application's credential.
            a_for_b = SessionAddress("127.0.0.1", 1, "sb")
            assert b.route(["t1", "t3"]) == {"t1": a_for_b, "t3": None}
            assert b.route(["t1"])["t1"].secret == "sb"
            # Renewed past several leases while in use, however long the use lasts.
            with a.using(["t1"]):
                time.sleep(4.5)  # longer than idle_s and two leases: the use goes on
                assert b.route(["t1"]) == {"t1": a_for_b}
            # Idle longer than idle_s: released, and the other client takes over.
            _wait(lambda: b.route(["t1"])["t1"] is None, "the idle lease lapsing")
            assert not a.holds("t1") and a.route(["t1"]) == {
                "t1": SessionAddress("127.0.0.1", 2, "sa")}
            # Leases off: every tablet is led here, nothing is asked of the master.
            assert off.route(["t1", "t3"]) == {"t1": None, "t3": None}
            # Closing releases at once.
            b.close()
            assert a.route(["t1", "t3"]) == {"t1": None, "t3": None}
        finally:
            a.close()
            b.close()
            off.close()


def test_a_keeper_whose_client_cannot_lead_any_more_lets_its_leases_lapse(
    tmp_path: Path,
) -> None:
    from pyspark_kudu.spark.replication.lease_keeper import LeaseKeeper
    from pyspark_kudu.spark.replication.session_client import SessionAddress

    alive = [True]
    with EmbeddedMaster(str(tmp_path), 1) as master, master.client() as client:
        a = LeaseKeeper(client, "a", SessionAddress("127.0.0.1", 1, "sa"), ttl_s=1.5,
                        alive=lambda: alive[0])
        b = LeaseKeeper(client, "b", SessionAddress("127.0.0.1", 2, "sb"), ttl_s=1.5)
        try:
            with a.using(["t1"]):
                assert a.route(["t1"]) == {"t1": None}
                time.sleep(2.0)  # past the first lease: renewed
                assert b.route(["t1"])["t1"] is not None
                alive[0] = False  # e.g. its SparkContext stopped under an open context
                _wait(lambda: b.route(["t1"])["t1"] is None, "the dead client's lease lapsing")
        finally:
            a.close()
            b.close()


def test_without_a_master_to_ask_the_client_leads_and_keeps_its_leaders() -> None:
    from pyspark_kudu.master.client import MasterClient
    from pyspark_kudu.master.localcluster import free_ports
    from pyspark_kudu.spark.replication.lease_keeper import LeaseKeeper
    from pyspark_kudu.spark.replication.session_client import SessionAddress

    (port,) = free_ports(1)  # nothing listens there
    with MasterClient(f"127.0.0.1:{port}", timeout_s=1.0, rpc_timeout_s=0.5) as client:
        keeper = LeaseKeeper(client, "a", SessionAddress("127.0.0.1", 1, "s"), ttl_s=30.0)
        try:
            assert keeper.route(["t1", "t2"]) == {"t1": None, "t2": None}
            # Counted as held, so the context keeps its cached leaders (terms still fence)
            # instead of electing itself again at every write while the master is away.
            assert keeper.holds("t1") and keeper.holds("t2")
        finally:
            keeper.close()


class _Counting:
    """A master client that counts lease requests (and forwards them to the real one)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls = 0

    def tablet_lease(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.client.tablet_lease(*args, **kwargs)


def test_a_held_lease_is_trusted_without_asking_while_a_third_of_it_is_left(
    tmp_path: Path,
) -> None:
    from pyspark_kudu.spark.replication.lease_keeper import LeaseKeeper
    from pyspark_kudu.spark.replication.session_client import SessionAddress

    with EmbeddedMaster(str(tmp_path), 1) as master, master.client() as client:
        counting = _Counting(client)
        a = LeaseKeeper(counting, "a", SessionAddress("127.0.0.1", 1, "sa"),  # type: ignore[arg-type]
                        ttl_s=60.0)
        try:
            assert a.route(["t1", "t2"]) == {"t1": None, "t2": None} and counting.calls == 1
            for _ in range(5):  # writes to held tablets: no master request
                assert a.route(["t1"]) == {"t1": None}
            assert counting.calls == 1
            assert a.route(["t1", "t3"]) == {"t1": None, "t3": None}  # t3 is new: ask
            assert counting.calls == 2
            a.distrust("t1")  # e.g. fenced: ask again
            assert a.route(["t1"]) == {"t1": None} and counting.calls == 3
            # Another client sees a's leases as held all along.
            assert client.tablet_lease("b", ["t1", "t2", "t3"], ttl_s=1.0)["t2"]["client"] == "a"
        finally:
            a.close()


def test_a_grant_is_continued_only_when_no_other_client_held_the_lease_since() -> None:
    t = LeaseTable()
    assert not t.acquire("a", A, ["t"], 10.0, now=0.0)["t"].continued  # never held before
    assert t.acquire("a", A, ["t"], 10.0, now=5.0)["t"].continued  # renewed
    assert t.acquire("a", A, ["t"], 10.0, now=20.0)["t"].continued  # lapsed, nobody took it
    t.release("a", ["t"])
    assert t.acquire("a", A, ["t"], 10.0, now=21.0)["t"].continued  # released, back
    t.release("a", ["t"])
    assert not t.acquire("b", B, ["t"], 10.0, now=22.0)["t"].continued  # another client
    assert t.acquire("a", A, ["t"], 10.0, now=23.0)["t"].client == "b"  # refused: b holds
    assert not t.acquire("a", A, ["t"], 10.0, now=40.0)["t"].continued  # b held it since
    assert not LeaseTable().acquire("a", A, ["t"], 10.0, now=0.0)["t"].continued  # new master


def test_the_master_service_and_the_keeper_say_which_leases_continued(tmp_path: Path) -> None:
    from pyspark_kudu.spark.replication.lease_keeper import LeaseKeeper
    from pyspark_kudu.spark.replication.session_client import SessionAddress

    with EmbeddedMaster(str(tmp_path), 1) as master, master.client() as client:
        assert client.tablet_lease("a", ["t1"], ttl_s=30.0, endpoint=A)["t1"]["continued"] is False
        client.tablet_lease("a", ["t1"], release=True)
        assert client.tablet_lease("a", ["t1"], ttl_s=30.0, endpoint=A)["t1"]["continued"] is True
        keeper = LeaseKeeper(client, "k", SessionAddress("127.0.0.1", 3, "sk"), ttl_s=30.0)
        try:
            first: set[str] = set()
            assert keeper.route(["t2"], first) == {"t2": None} and first == set()
            client.tablet_lease("k", ["t2"], release=True)
            keeper.distrust("t2")  # ask the master again, as after an idle release
            again: set[str] = set()
            assert keeper.route(["t2"], again) == {"t2": None} and again == {"t2"}
        finally:
            keeper.close()
