"""A round's staged batches are resolved a slice at a time on each replica
(pyspark_kudu.spark.host.resolve_slices): a large write never has all of a host's batches in
memory at once, and the log is the same."""

from __future__ import annotations

import random
import string
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pytest

from pyspark_kudu.consensus.messages import Entry, Message, MessageType
from pyspark_kudu.partitioning import Partitioner, PartitionSchema
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host import resolve_slices
from pyspark_kudu.spark.host.dataplane import StagedRef, read_staged, refs_of, stage_batches
from pyspark_kudu.spark.host.handlers import (
    PeerRequest,
    PeerResponse,
    RequestKind,
    handle_requests,
    replica_storage,
)
from pyspark_kudu.spark.host.resolve_slices import append_slices, entry_slices
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, decode_write_batch
from pyspark_kudu.wal import SyncPolicy, WalOptions

# No WAL entry cache: the only references to a delivered batch are the request's own.
OPTS = WalOptions(segment_size=8 << 20, sync_policy=SyncPolicy.NONE, preallocate=False,
                  cache_bytes=0)
TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
MIB = 1 << 20


class _Tracked(bytes):
    """A delivered batch that counts itself among the live ones until it is freed."""

    live: ClassVar[dict[int, int]] = {}

    def __del__(self) -> None:
        _Tracked.live.pop(id(self), None)


class _CountingDelivery(Mapping[str, bytes]):
    """Reads each staged batch when asked for (as a tablet server pulls them) and records,
    at every read, how many bytes of the batches handed out before are still alive."""

    def __init__(self, reqs: Sequence[PeerRequest]) -> None:
        self._refs = {r.path: r for r in refs_of(reqs)}
        self.peak_live = 0
        self.reads = 0

    def __getitem__(self, key: str) -> bytes:
        self.peak_live = max(self.peak_live, sum(_Tracked.live.values()))
        data = read_staged(self._refs[key])
        if data is None:
            raise KeyError(key)
        self.reads += 1
        out = _Tracked(data)
        _Tracked.live[id(out)] = len(out)
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


class _CountingTransport(DirectTransport):
    def __init__(self, roots: Mapping[str, str]) -> None:
        super().__init__(roots, OPTS)
        self.deliveries: dict[str, list[_CountingDelivery]] = {}

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]
            ) -> dict[str, list[PeerResponse] | None]:
        self.rounds += 1
        out: dict[str, list[PeerResponse] | None] = {}
        for ts, reqs in requests.items():
            d = _CountingDelivery(reqs)
            self.deliveries.setdefault(ts, []).append(d)
            out[ts] = handle_requests(self.roots[ts], reqs, host=ts, options=OPTS, delivered=d)
        return out


def _stage(root: Path, n_batches: int, batch_bytes: int) -> list[StagedRef]:
    """``n_batches`` staged batches of one row each, ~``batch_bytes`` of incompressible
    text."""
    fn = stage_batches(SCHEMA, Partitioner(SCHEMA, PartitionSchema(())), OpType.UPSERT, "w",
                       str(root), 1)
    rng = random.Random(3)
    word = "".join(rng.choices(string.ascii_letters, k=batch_bytes))
    batch = pa.RecordBatch.from_pydict(
        {"id": list(range(n_batches)), "v": [word[k:] + word[:k] for k in range(n_batches)]})
    refs = [StagedRef.decode(r) for out in fn(iter([batch])) for r in out.column(0).to_pylist()]
    assert all(r is not None for r in refs)
    return [r for r in refs if r is not None]


def _logged_ids(root: str) -> list[int]:
    with replica_storage(root, "t", OPTS) as st:
        datas = [e.data for e in st.entries(st.first_index(), st.last_index() + 1, None)]
    return sorted(i for d in datas if (wb := decode_write_batch(d)) is not None
                  for i in wb.rows.column("id").to_pylist())


def _entry(index: int, term: int, size: int) -> Entry:
    ref = StagedRef(path=f"staging/w/{index}", host="h", root="", tablet=0, rows=1,
                    size=size, crc=0, op=int(OpType.UPSERT))
    return Entry(index=index, term=term, data=ref.encode())


def test_slices_are_bounded_by_the_batches_bytes_and_chain_their_appends() -> None:
    entries = [_entry(10 + k, 2, size) for k, size in enumerate([3, 3, 3, 9, 1, 1, 1])]
    parts = list(entry_slices(entries, max_bytes=6))
    assert [[e.index for e in p] for p in parts] == [[10, 11], [12], [13], [14, 15, 16]]
    m = Message(MessageType.APP, to="b", frm="a", term=2, index=9, log_term=1,
                entries=tuple(entries), commit=12)
    apps = list(append_slices(m, max_bytes=6))
    assert [(a.index, a.log_term) for a in apps] == [(9, 1), (11, 2), (12, 2), (13, 2)]
    assert [e for a in apps for e in a.entries] == entries
    assert {(a.commit, a.term, a.to, a.frm) for a in apps} == {(12, 2, "b", "a")}
    beat = Message(MessageType.HEARTBEAT, to="b", frm="a", term=2, commit=12)
    assert list(append_slices(beat, max_bytes=6)) == [beat]


def test_a_large_write_is_resolved_a_slice_at_a_time_and_logged_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resolve_slices, "RESOLVE_SLICE_BYTES", 4 * MIB)
    transport = _CountingTransport({ts: str(tmp_path / ts) for ts in TS})
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)
    lead.create(SCHEMA.to_json())
    lead.elect()
    refs = _stage(tmp_path / "exec", 24, MIB)
    total = sum(r.size for r in refs)
    assert total > 20 * MIB and max(r.size for r in refs) < 1.1 * MIB
    positions = lead.propose([r.encode() for r in refs])
    lead.take_results([i for i, _ in positions])
    lead.heartbeat()
    for ts in TS:
        assert _logged_ids(transport.roots[ts]) == list(range(24)), ts
        busiest = max(transport.deliveries[ts], key=lambda d: d.reads)
        assert busiest.reads == 24, (ts, [d.reads for d in transport.deliveries[ts]])
        # Resolving the whole request first would hold ~23 MiB before its last read.
        assert busiest.peak_live <= 4 * MIB + 1.1 * MIB, (ts, busiest.peak_live / MIB)
    assert not _Tracked.live  # nothing kept a delivered batch after its round


def _follower_at_start(tmp_path: Path) -> tuple[dict[str, str], int, list[StagedRef], int, int]:
    """A tablet with an elected leader, six staged 1 MiB batches, and follower ts-b's log
    end: (roots, term, refs, last index, its term)."""
    roots = {ts: str(tmp_path / ts) for ts in TS}
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", DirectTransport(roots, OPTS))
    lead.create(SCHEMA.to_json())
    term = lead.elect()
    refs = _stage(tmp_path / "exec", 6, MIB)
    with replica_storage(roots["ts-b"], "t", OPTS) as st:
        return roots, term, refs, st.last_index(), st.term(st.last_index())


def test_a_refused_slice_is_not_followed_by_the_rest_of_its_append(tmp_path: Path) -> None:
    roots, term, refs, last, _ = _follower_at_start(tmp_path)
    # An append that skips an index the follower lacks: its first slice is refused, and the
    # slices after it must not be stepped (each would be refused again).
    entries = tuple(Entry(index=last + 2 + k, term=term, data=r.encode())
                    for k, r in enumerate(refs))
    app = Message(MessageType.APP, to="ts-b", frm="ts-a", term=term, index=last + 1,
                  log_term=term, entries=entries, commit=last)
    (resp,) = handle_requests(roots["ts-b"], [PeerRequest(
        RequestKind.STEP, "t", "ts-b", messages=(app,))], host="ts-b", options=OPTS,
        delivered={r.path: data for r in refs if (data := read_staged(r)) is not None})
    assert resp.ok, resp.error
    replies = [m for m in resp.messages if m.type == MessageType.APP_RESP]
    assert len(replies) == 1 and replies[0].reject, replies
    with replica_storage(roots["ts-b"], "t", OPTS) as st:
        assert st.last_index() == last


def test_a_batch_missing_from_a_later_slice_refuses_the_request_without_a_ref_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resolve_slices, "RESOLVE_SLICE_BYTES", 2 * MIB)
    roots, term, refs, last, last_term = _follower_at_start(tmp_path)
    entries = tuple(Entry(index=last + 1 + k, term=term, data=r.encode())
                    for k, r in enumerate(refs))
    app = Message(MessageType.APP, to="ts-b", frm="ts-a", term=term, index=last,
                  log_term=last_term, entries=entries, commit=last)
    delivered = {r.path: data for r in refs[:-1] if (data := read_staged(r)) is not None}
    (resp,) = handle_requests(roots["ts-b"], [PeerRequest(
        RequestKind.STEP, "t", "ts-b", messages=(app,))], host="ts-b", options=OPTS,
        delivered=delivered)
    assert not resp.ok and "was not delivered" in (resp.error or ""), resp.error
    assert not resp.replica_failed  # the replica is fine: only the batch is missing
    # The slices before the missing batch are a valid prefix of the leader's log.
    with replica_storage(roots["ts-b"], "t", OPTS) as st:
        got = st.entries(last + 1, st.last_index() + 1, None)
    assert 0 < len(got) < len(refs)
    assert [e.data for e in got] == [read_staged(r) for r in refs[:len(got)]]
