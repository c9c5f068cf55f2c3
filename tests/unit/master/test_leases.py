"""Tablet leadership leases in the master (:mod:`pyspark_kudu.master.leases`) and through
the master service of a real one-replica master (embedded, in process)."""

from __future__ import annotations

from pathlib import Path

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
