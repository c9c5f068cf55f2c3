"""Shared rounds for membership changes (spark/replication/sharedrounds.py): concurrent replica
adds of several tablets run as one round per step, and each tablet gets exactly its own
answers."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import KuduError
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse, RequestKind, replica_storage
from pyspark_kudu.spark.host.wal_committed_log import WalCommittedLog
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.sharedrounds import SharedRounds
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, Tablet, encode_write_batch
from pyspark_kudu.wal import SyncPolicy, WalOptions

OPTS = WalOptions(segment_size=64 << 10, sync_policy=SyncPolicy.FDATASYNC, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))


def _rows(root: str, tablet_id: str) -> list[tuple[int, str]]:
    with replica_storage(root, tablet_id, OPTS) as st:
        t = Tablet.open(root, tablet_id, log=WalCommittedLog(st))
        try:
            return sorted((r["id"], r["v"]) for r in t.scan_table().to_pylist())
        finally:
            t.close()


def _tablets(tmp_path: Path, n: int) -> tuple[DirectTransport, list[TabletLeader]]:
    transport = DirectTransport({ts: str(tmp_path / ts) for ts in (*TS, "ts-d")}, OPTS)
    leaders = []
    for k in range(n):
        tablet = TabletReplicas(f"t{k}", TS)
        TabletLeader(tablet, TS[k % 3], transport).create(SCHEMA.to_json())
        lead = TabletLeader(tablet, TS[k % 3], transport)
        lead.elect()
        for j in range(3):
            lo = 1000 * k + 100 * j
            lead.propose([encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
                "id": list(range(lo, lo + 100)), "v": [f"t{k}-{i}" for i in range(100)]}))])
        leaders.append(lead)
    return transport, leaders


def _add_all(shared: SharedRounds, leaders: Sequence[TabletLeader], ts: str
             ) -> list[KuduError | None]:
    def member(lead: TabletLeader) -> KuduError | None:
        try:
            with lead.rounds_via(shared):
                lead.add_replica(ts)
            return None
        except KuduError as e:
            return e
        finally:
            shared.leave()

    with ThreadPoolExecutor(len(leaders)) as pool:
        return list(pool.map(member, leaders))


def test_three_tablets_add_a_replica_in_the_rounds_of_one(tmp_path: Path) -> None:
    transport, leaders = _tablets(tmp_path, 4)
    solo, party = leaders[0], leaders[1:]
    before = transport.rounds
    solo.add_replica("ts-d")
    one_add = transport.rounds - before

    before = transport.rounds
    shared = SharedRounds(transport, len(party))
    assert _add_all(shared, party, "ts-d") == [None, None, None]
    merged = transport.rounds - before
    print(f"one add: {one_add} rounds; three concurrent adds: {merged} rounds")
    assert shared.requests >= 3 * (one_add - 1), (shared.requests, one_add)
    assert merged <= one_add, (
        f"three concurrent adds took {merged} rounds; one alone took {one_add}")
    for lead in leaders:
        tid = lead.tablet.tablet_id
        assert "ts-d" in lead.conf_state().voters
        want = _rows(transport.roots[lead.leader_id], tid)
        assert len(want) == 300
        assert _rows(transport.roots["ts-d"], tid) == want


class _Recording:
    """A transport that records each merged call and answers every request itself."""

    def __init__(self) -> None:
        self.calls: list[dict[str, list[str]]] = []
        self.lock = threading.Lock()

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]
            ) -> dict[str, list[PeerResponse] | None]:
        with self.lock:
            self.calls.append({ts: [r.tablet_id for r in rs] for ts, rs in requests.items()})
        return {ts: None if ts == "dead" else
                [PeerResponse(r.tablet_id, ts, ok=True, error=f"{r.tablet_id}@{ts}")
                 for r in rs]
                for ts, rs in requests.items()}

    def unreachable(self) -> set[str]:
        return {"dead"}


def test_each_member_gets_its_own_answers_and_a_leaving_member_releases_the_rest() -> None:
    inner = _Recording()
    shared = SharedRounds(inner, 3)
    got: dict[str, list[object]] = {}

    def member(name: str, rounds: int, targets: Sequence[str]) -> None:
        try:
            for _ in range(rounds):
                out = shared.run({ts: [PeerRequest(RequestKind.READ_STATE, name, ts)]
                                  for ts in targets})
                got.setdefault(name, []).append(
                    {ts: None if r is None else [x.error for x in r] for ts, r in out.items()})
        finally:
            shared.leave()

    with ThreadPoolExecutor(3) as pool:
        futs = [pool.submit(member, "x", 1, ["s1", "s2"]),
                pool.submit(member, "y", 3, ["s1", "dead"]),
                pool.submit(member, "z", 2, ["s2"])]
        for f in futs:
            f.result(timeout=30)
    # Round 1 carries all three, round 2 the two left, round 3 y alone.
    assert [sorted({t for ids in c.values() for t in ids}) for c in inner.calls] == [
        ["x", "y", "z"], ["y", "z"], ["y"]]
    assert sorted(inner.calls[0]["s1"]) == ["x", "y"]
    assert got["x"] == [{"s1": ["x@s1"], "s2": ["x@s2"]}]
    assert got["y"] == [{"s1": ["y@s1"], "dead": None}] * 3
    assert got["z"] == [{"s2": ["z@s2"]}] * 2
    assert shared.rounds == 3 and shared.requests == 6


def test_an_error_of_the_inner_transport_reaches_every_member() -> None:
    class Broken:
        def run(self, requests: object) -> dict[str, list[PeerResponse] | None]:
            raise OSError("the stage could not be submitted")

        def unreachable(self) -> set[str]:
            return set()

    shared = SharedRounds(Broken(), 2)

    def member(name: str) -> str:
        try:
            shared.run({"s": [PeerRequest(RequestKind.READ_STATE, name, "s")]})
            return "no error"
        except OSError as e:
            return str(e)
        finally:
            shared.leave()

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(member, ["a", "b"], timeout=30)) == [
            "the stage could not be submitted"] * 2
    with pytest.raises(RuntimeError, match="has left"):
        shared.run({"s": [PeerRequest(RequestKind.READ_STATE, "late", "s")]})
