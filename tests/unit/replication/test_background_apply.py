"""Background apply (``spark/host/background_apply``): with a resident server's applier, a
request applies committed entries only for a bounded time and leaves the rest to the
applier; per-row results still reach the writer exactly, configuration entries still apply
when they commit, and every replica ends with the same rows.

The applier runs without its thread here (``start=False``): the tests drive it chunk by
chunk, so what a request applied and what the applier applied is deterministic. The budgets
are 0 s: a request or chunk then applies exactly one entry (it always applies at least one).
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.errors import RoundFailedError
from pyspark_kudu.spark.host import handlers, replica_apply, tserver_client
from pyspark_kudu.spark.host.background_apply import BackgroundApplier, lower_thread_priority
from pyspark_kudu.spark.host.handlers import (
    PeerRequest,
    PeerResponse,
    RequestKind,
    replica_storage,
    tablet_dir,
)
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.host.replica_apply import CONF_FRAME_MAX, read_applied, use_background_apply
from pyspark_kudu.spark.host.round_tasks import HostTask, serve_task_remote
from pyspark_kudu.spark.replication.peer_transport import MAX_ROUNDS, DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, TabletOptions, encode_write_batch
from pyspark_kudu.tablet import tablet as tablet_module
from pyspark_kudu.tablet.superblock import Superblock
from pyspark_kudu.wal import SyncPolicy, WalOptions
from tests.unit.replication.test_tablet_writes import SCHEMA, _rows
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.NONE, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")


@contextlib.contextmanager
def _installed(**options: Any) -> Iterator[BackgroundApplier]:
    """A :class:`BackgroundApplier` with ``options``, this process's applier meanwhile."""
    bg = BackgroundApplier(**options)
    previous = use_background_apply(bg)
    try:
        yield bg
    finally:
        bg.stop()
        use_background_apply(previous)


@pytest.fixture
def applier() -> Iterator[BackgroundApplier]:
    """Chunks of one entry, run only when a test calls ``run_once``."""
    with _installed(leader_inline_s=0.0, chunk_s=0.0, start=False) as bg:
        yield bg


def _group(tmp_path: Path) -> tuple[DirectTransport, TabletLeader]:
    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)
    lead.create(SCHEMA.to_json())
    lead.elect()
    return transport, lead


def _applied(transport: DirectTransport, ts: str) -> int:
    return read_applied(tablet_dir(transport.roots[ts], "t"))


def _batches(n: int) -> list[bytes]:
    """``n`` insert batches; batch k > 0 repeats the last id of batch k - 1 (one
    AlreadyPresent error at its row 0)."""
    return [encode_write_batch(SCHEMA, OpType.INSERT, pa.table(
        {"id": [2 * k - 1, 2 * k, 2 * k + 1] if k else [0, 1],
         "v": [f"v{k}"] * (3 if k else 2)})) for k in range(n)]


def _drain(bg: BackgroundApplier) -> int:
    chunks = 0
    while bg.run_once():
        chunks += 1
        assert chunks < 10_000, "the applier never ran out of work"
    return chunks


def test_a_write_of_more_entries_than_rounds_gets_every_per_row_result(
    tmp_path: Path, applier: BackgroundApplier,
) -> None:
    transport, lead = _group(tmp_path)
    n = 3 * MAX_ROUNDS  # each collecting round applies one entry on the leader's replica
    positions = lead.propose(_batches(n))
    results = lead.take_results([i for i, _ in positions])
    got = [results[i] for i, _ in positions]
    assert got[0].ok and got[0].num_rows == 2
    for k, r in enumerate(got[1:], start=1):
        assert r.num_rows == 3, k
        assert [(e.row, e.status) for e in r.errors] == [(0, "AlreadyPresent")], k
    # Followers were told the commit but applied none of the writes: they are all the
    # applier's, which brings every replica to the same rows.
    last = positions[-1][0]
    assert all(_applied(transport, ts) < positions[0][0] for ts in ("ts-b", "ts-c"))
    assert applier.pending(), "the rest was left to the applier"
    _drain(applier)
    lead.heartbeat()
    _drain(applier)
    want = _rows(transport.roots["ts-a"])
    assert len(want) == 2 * n
    for ts in TS:
        assert _applied(transport, ts) >= last, ts
        assert _rows(transport.roots[ts]) == want, ts


def test_the_applier_applies_one_chunk_at_a_time_and_requeues_the_rest(
    tmp_path: Path, applier: BackgroundApplier,
) -> None:
    transport, lead = _group(tmp_path)
    positions = lead.propose(_batches(5))
    lead.heartbeat()  # tells everyone the commit: no replica applies any of it itself
    last = positions[-1][0]
    before = _applied(transport, "ts-b")
    assert before < last
    assert (transport.roots["ts-b"], "t") in applier.pending()
    while _applied(transport, "ts-b") < last:
        was = _applied(transport, "ts-b")
        assert applier.run_once()
        now = _applied(transport, "ts-b")
        assert now - was <= 1, "a 0 s chunk applies one entry"
        # Between chunks the replica is free: a request on it is served at once.
        state = lead._run_one("ts-b", _read_state("ts-b")).state
        assert state is not None and state.applied == now
    _drain(applier)
    assert applier.pending() == []
    assert applier.report()["scheduled"] == 0
    for ts in TS:
        assert _applied(transport, ts) >= last, ts


def _backlog_of_five(tmp_path: Path, bg: BackgroundApplier) -> None:
    """Five committed writes every replica has yet to apply (the election's entry applied)."""
    _, lead = _group(tmp_path)
    _drain(bg)
    lead.propose(_batches(5))
    lead.heartbeat()
    assert bg.pending(), "nothing was left to the applier"


def test_a_chunk_ends_after_the_entry_it_is_applying_when_a_request_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _installed(leader_inline_s=0.0, chunk_s=60.0, start=False) as bg:
        _backlog_of_five(tmp_path, bg)
        arrived = contextlib.ExitStack()
        came: list[bool] = []
        original = replica_apply.TabletSink.apply

        def apply_while_a_request_arrives(self: replica_apply.TabletSink,
                                          entries: Sequence[Entry], **kw: bool) -> None:
            if not came:
                came.append(True)
                arrived.enter_context(bg.foreground())  # a round's request comes in
            original(self, entries, **kw)

        monkeypatch.setattr(replica_apply.TabletSink, "apply", apply_while_a_request_arrives)
        before = bg.report()
        with arrived:
            assert bg.run_once()
        after = bg.report()
        assert after["entries"] - before["entries"] == 1, "the chunk did not stop for it"
        assert after["yielded"] - before["yielded"] == 1
        monkeypatch.undo()
        _drain(bg)  # the rest is applied later
        assert bg.pending() == []


def test_a_chunk_started_while_requests_were_in_flight_runs_its_whole_budget(
    tmp_path: Path,
) -> None:
    with _installed(leader_inline_s=0.0, chunk_s=60.0, start=False) as bg:
        _backlog_of_five(tmp_path, bg)
        before = bg.report()
        with bg.foreground():  # e.g. the thread's loop gave up waiting after yield_s
            assert bg.run_once()
        after = bg.report()
        assert after["entries"] - before["entries"] >= 5, "the chunk stopped early"
        assert after["yielded"] == before["yielded"]


def _read_state(ts: str) -> PeerRequest:
    return PeerRequest(RequestKind.READ_STATE, "t", ts)


def test_results_of_entries_the_applier_applied_reach_the_writer(
    tmp_path: Path, applier: BackgroundApplier,
) -> None:
    transport, lead = _group(tmp_path)
    positions = lead.propose(_batches(4))
    lead.heartbeat()  # the leader's replica applies one entry, the applier the others
    assert _applied(transport, "ts-a") < positions[-1][0]
    _drain(applier)
    assert _applied(transport, "ts-a") >= positions[-1][0]
    results = lead.take_results([i for i, _ in positions])  # the next PERSIST returns them
    assert [len(results[i].errors) for i, _ in positions] == [0, 1, 1, 1]
    assert applier.report()["results_dropped"] == 0


def test_results_beyond_the_cap_are_dropped_and_the_write_says_it_has_none(
    tmp_path: Path,
) -> None:
    with _installed(leader_inline_s=0.0, chunk_s=60.0, max_results=2, start=False) as bg:
        _, lead = _group(tmp_path)
        positions = lead.propose(_batches(5))
        lead.heartbeat()
        _drain(bg)
        assert bg.report()["results_dropped"] >= 1
        with pytest.raises(RoundFailedError, match="no replica reported applying"):
            lead.take_results([i for i, _ in positions])


def test_a_configuration_entry_applies_in_the_request_that_commits_it(
    tmp_path: Path, applier: BackgroundApplier,
) -> None:
    transport, lead = _group(tmp_path)
    positions = lead.propose(_batches(4))
    lead.remove_replica("ts-c")  # commits after the writes: they apply first, in order
    lead.heartbeat()
    with replica_storage(transport.roots["ts-b"], "t", OPTS) as st:
        assert st.initial_state()[1].voters == frozenset({"ts-a", "ts-b"})
        commit = st.initial_state()[0].commit
    assert _applied(transport, "ts-b") > positions[-1][0]
    assert _applied(transport, "ts-b") <= commit


def test_the_leaders_replica_applies_long_only_in_a_round_collecting_results(
    tmp_path: Path,
) -> None:
    # Long budget for the leader's replica, none for anything else: only a round that
    # collects per-row results may apply a whole backlog inline.
    with _installed(leader_inline_s=600.0, chunk_s=0.0, start=False) as bg:
        transport, lead = _group(tmp_path)
        positions = lead.propose(_batches(6))
        last = positions[-1][0]
        before = _applied(transport, "ts-a")
        lead.heartbeat()  # a settle-like round: all of it left to the applier
        after = _applied(transport, "ts-a")
        assert after == before < last, (before, after, last)
        rounds: list[int] = []
        real_run = transport.run

        def counting_run(requests: Mapping[str, Sequence[PeerRequest]]
                         ) -> dict[str, list[PeerResponse] | None]:
            rounds.append(len(requests))
            return real_run(requests)

        transport.run = counting_run  # type: ignore[method-assign]
        results = lead.take_results([i for i, _ in positions])  # collecting rounds
        assert [len(results[i].errors) for i, _ in positions] == [0] + [1] * 5
        assert _applied(transport, "ts-a") >= last
        assert len(rounds) == 1, f"{len(rounds)} collecting rounds; one applies everything"
        assert bg.report()["chunks"] == 0, "the applier never ran: the requests applied"


def test_the_leaders_replicas_go_before_the_followers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bg = BackgroundApplier(start=False)
    order: list[str] = []

    def fake_apply(root: str, tablet_id: str, options: object, budget_s: float,
                   yield_to: object = None) -> tuple[bool, list[object], int]:
        order.append(tablet_id)
        return tablet_id == "l1" and order.count("l1") < 2, [], 1  # l1: two chunks

    monkeypatch.setattr(handlers, "apply_backlog", fake_apply)
    bg.schedule("r", "f1", None)
    bg.schedule("r", "f2", None)
    bg.schedule("r", "l1", None, leader=True)
    bg.schedule("r", "l2", None, leader=True)
    _drain(bg)
    assert order == ["l1", "l2", "l1", "f1", "f2"], "the leaders' replicas did not go first"
    assert not bg.pending()


def test_a_leaders_replica_is_scheduled_as_the_leaders_and_a_followers_as_a_followers(
    tmp_path: Path, applier: BackgroundApplier, monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduled: list[tuple[str, bool]] = []
    real = applier.schedule

    def spy(root: str, tablet_id: str, options: WalOptions | None, *,
            leader: bool = False) -> None:
        scheduled.append((Path(root).name, leader))
        real(root, tablet_id, options, leader=leader)

    monkeypatch.setattr(applier, "schedule", spy)
    _, lead = _group(tmp_path)
    lead.propose(_batches(4))
    lead.heartbeat()
    assert ("ts-a", True) in scheduled, scheduled
    assert {ts for ts, leader in scheduled if not leader} >= {"ts-b", "ts-c"}, scheduled
    assert all(leader == (ts == "ts-a") for ts, leader in scheduled), scheduled


def test_the_applier_thread_finishes_a_backlog_while_requests_come_and_go(
    tmp_path: Path,
) -> None:
    with _installed(leader_inline_s=0.0, chunk_s=0.0, yield_s=0.05) as bg:
        transport, lead = _group(tmp_path)
        positions = lead.propose(_batches(6))
        with bg.foreground():  # a request in flight: the applier waits at most yield_s
            lead.heartbeat()
        assert bg.wait_idle(60), f"still scheduled: {bg.pending()}"
        last = positions[-1][0]
        wait_until(lambda: all(_applied(transport, ts) >= last for ts in TS), 30,
                   "every replica applying the whole backlog")
        want = _rows(transport.roots["ts-a"])
        for ts in TS:
            assert _rows(transport.roots[ts]) == want, ts


def test_no_chunk_starts_while_a_leader_applies_for_a_waiting_write(tmp_path: Path) -> None:
    with _installed(leader_inline_s=30.0, chunk_s=0.0, yield_s=0.05) as bg:
        transport, lead = _group(tmp_path)
        # The election's entry is applied in the background too: let that finish first (a
        # chunk already running when an urgent apply starts is not stopped).
        assert bg.wait_idle(60), f"still scheduled: {bg.pending()}"
        before = {ts: _applied(transport, ts) for ts in TS}
        with bg.foreground(), bg.urgent():
            positions = lead.propose(_batches(4))
            lead.heartbeat()  # every replica now has a backlog, left to the applier
            last = positions[-1][0]
            assert bg.pending(), "the requests left nothing to the applier"
            # Well past yield_s, nothing was applied: the urgent apply is not shared.
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                now = {ts: _applied(transport, ts) for ts in TS}
                assert now == before, f"the applier ran a chunk meanwhile: {now}"
                time.sleep(0.02)  # observing a window in which nothing may happen
        # Once it is over the applier goes on.
        wait_until(lambda: all(_applied(transport, ts) >= last for ts in TS), 30,
                   "every replica applying the backlog after the urgent apply")


# -- through a real resident server ------------------------------------------------------------

_SECRET = b"b" * 32
_DAEMON = textwrap.dedent("""
    import sys
    from pyspark_kudu.spark.host.tablet_server import start_resident
    print(start_resident(), flush=True)
    sys.stdin.read()  # like pyspark's daemon: lives until the executor closes stdin
""")


class _ServerTransport:
    """Every tablet server's requests served by one resident server process (three data
    roots on this host), as a round task on its host hands them over."""

    def __init__(self, address: str, roots: dict[str, str]) -> None:
        self.address = address
        self.roots = roots
        self.uuids = {ts: ensure_instance(r).uuid for ts, r in roots.items()}

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]
            ) -> dict[str, list[PeerResponse] | None]:
        out: dict[str, list[PeerResponse] | None] = {}
        for ts, reqs in requests.items():
            task = HostTask("127.0.0.1", ((self.uuids[ts], self.roots[ts], tuple(reqs)),), OPTS)
            ((_, resps, why),) = serve_task_remote(self.address, _SECRET, task)
            assert resps is not None, why
            out[ts] = resps
        return out

    def unreachable(self) -> set[str]:
        return set()


def test_a_resident_server_applies_a_large_backlog_in_the_background(tmp_path: Path) -> None:
    env = dict(os.environ, PYSPARK_KUDU_SECRET=_SECRET.decode(), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_KUDU_LEADER_APPLY_S="0",
               PYSPARK_KUDU_MAINTENANCE_INTERVAL_S="0")
    proc = subprocess.Popen([sys.executable, "-c", _DAEMON], env=env, cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address and address != "None", "the resident server did not start"
        transport = _ServerTransport(address, {ts: str(tmp_path / ts) for ts in TS})
        lead = TabletLeader(TabletReplicas("t", TS), "ts-a", transport)  # type: ignore[arg-type]
        lead.create(SCHEMA.to_json())
        lead.elect()
        n = 2 * MAX_ROUNDS
        positions = lead.propose(_batches(n))
        results = lead.take_results([i for i, _ in positions])
        assert [len(results[i].errors) for i, _ in positions] == [0] + [1] * (n - 1)
        lead.heartbeat()
        report = wait_until(
            lambda: (r := tserver_client.ping(address, _SECRET)["background_apply"])
            and r["scheduled"] == 0 and r, 60, "the server's applier running out of work")
        assert report["entries"] > 0 and report["failures"] == 0, report
        last = positions[-1][0]
        for ts in TS:
            assert _applied(transport, ts) >= last, ts  # type: ignore[arg-type]
            assert _rows(transport.roots[ts]) == _rows(transport.roots["ts-a"]), ts
        assert len(_rows(transport.roots["ts-b"])) == 2 * n
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def test_a_request_that_leaves_a_backlog_unapplied_does_not_read_it(
    tmp_path: Path, applier: BackgroundApplier, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas told of a large committed backlog they will not apply now (followers, and
    the leader's replica outside a round collecting results) read none of it, request after
    request: the writes are held by index, known to be writes from their frame sizes alone.
    Before, every request read up to ``READY_LIMIT_BYTES`` of the oldest backlog per drain
    only to hold it (half the tablet servers' CPU in a 50M-row composite-key insert)."""
    from pyspark_kudu.wal import WalStorage

    transport, lead = _group(tmp_path)
    rng = random.Random(7)  # incompressible values: every batch is well over 64 KiB
    big = [encode_write_batch(SCHEMA, OpType.UPSERT, pa.table(
        {"id": list(range(k * 3000, (k + 1) * 3000)),
         "v": [rng.randbytes(24).hex() for _ in range(3000)]})) for k in range(12)]
    assert all(len(b) > CONF_FRAME_MAX for b in big)
    positions = lead.propose(big)
    read: list[int] = []
    real = WalStorage.entries

    def counting(self: WalStorage, lo: int, hi: int, max_size: int | None = None) -> list:  # type: ignore[type-arg]
        got = real(self, lo, hi, max_size)
        read.extend(e.index for e in got if len(e.data) > CONF_FRAME_MAX)
        return got

    monkeypatch.setattr(WalStorage, "entries", counting)
    lead.heartbeat()  # every replica learns the commit and holds the writes
    lead.heartbeat()  # ... and again
    assert read == [], f"write entries read only to be held: {read}"
    monkeypatch.setattr(WalStorage, "entries", real)
    for ts in TS:
        assert _applied(transport, ts) < positions[0][0], ts
    _drain(applier)
    want = _rows(transport.roots["ts-a"])
    assert len(want) == 12 * 3000
    for ts in TS:
        assert _applied(transport, ts) >= positions[-1][0], ts
        assert _rows(transport.roots[ts]) == want, ts


def test_the_leaders_apply_for_results_leaves_its_flush_to_the_applier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every MemRowSet is over the flush threshold here: an apply not deferred flushes at once.
    monkeypatch.setattr(tablet_module, "TabletOptions", lambda: TabletOptions(
        flush_threshold_bytes=1, deferred_flush_max_bytes=1 << 20))
    with _installed(leader_inline_s=600.0, chunk_s=0.0, start=False) as bg:
        transport, lead = _group(tmp_path)
        positions = lead.propose(_batches(6))
        last = positions[-1][0]
        results = lead.take_results([i for i, _ in positions])  # the leader applies inline
        assert [len(results[i].errors) for i, _ in positions] == [0] + [1] * 5
        leader_dir = tablet_dir(transport.roots["ts-a"], "t")
        assert _applied(transport, "ts-a") >= last
        assert Superblock.load(leader_dir).last_flushed_index < positions[0][0], (
            "the leader flushed while the write waited for its results")
        assert (transport.roots["ts-a"], "t") in bg.pending(), "no flush was scheduled"
        _drain(bg)
        assert Superblock.load(leader_dir).last_flushed_index >= last, (
            "the applier did not run the deferred flush")
        lead.heartbeat()
        _drain(bg)
        want = _rows(transport.roots["ts-a"])
        assert len(want) == 12
        for ts in TS:  # the followers applied in the background, flushing as they went
            assert Superblock.load(tablet_dir(transport.roots[ts], "t")).last_flushed_index \
                >= last, ts
            assert _rows(transport.roots[ts]) == want, ts


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="per-thread nice values are Linux's (elsewhere the call does nothing)")
def test_the_applier_thread_runs_at_a_lower_priority_and_the_process_does_not() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    bg = BackgroundApplier(nice=3)
    try:
        thread = bg._thread
        assert thread is not None and thread.native_id is not None
        tid = thread.native_id
        wait_until(lambda: os.getpriority(os.PRIO_PROCESS, tid) == min(base + 3, 19), 30.0,
                   f"the applier thread {tid} running at nice {base + 3}")
        assert os.getpriority(os.PRIO_PROCESS, 0) == base, "the whole process was reniced"
        assert lower_thread_priority(0) == 0 and os.getpriority(os.PRIO_PROCESS, 0) == base
    finally:
        bg.stop()
