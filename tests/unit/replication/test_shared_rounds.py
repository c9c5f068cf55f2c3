"""Many tablets share one stage per round, and concurrent writers share rounds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import (
    TabletLeader,
    TabletReplicas,
    elect_all,
    replicate,
)
from pyspark_kudu.spark.replication.write_service import ReplicationService
from pyspark_kudu.wal import SyncPolicy, WalOptions

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")


@pytest.fixture
def transport(tmp_path: Path) -> DirectTransport:
    return DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)


def _leaders(t: DirectTransport, n: int) -> list[TabletLeader]:
    out = []
    for k in range(n):
        tablet = TabletReplicas(f"tab-{k}", TS)
        lead = TabletLeader(tablet, TS[k % 3], t)
        lead.create()
        lead.elect()
        out.append(lead)
    return out


def _round_sizes(svc: ReplicationService) -> list[int]:
    """A list that receives the number of writes each round of ``svc`` carries from now on."""
    sizes: list[int] = []
    run = svc._run

    def counted(batch: list) -> None:  # type: ignore[type-arg]
        sizes.append(len(batch))
        run(batch)

    svc._run = counted  # type: ignore[method-assign]
    return sizes


def test_writes_to_many_tablets_cost_the_rounds_of_one(transport: DirectTransport) -> None:
    one = _leaders(transport, 1)
    before = transport.rounds
    replicate(transport, {one[0]: [b"x"]})
    rounds_for_one = transport.rounds - before

    many = _leaders(transport, 6)
    before = transport.rounds
    results = replicate(transport, {lead: [f"{k}".encode()] for k, lead in enumerate(many)})
    assert all(not isinstance(r, Exception) for r in results.values()), results
    assert transport.rounds - before == rounds_for_one


def test_concurrent_writers_share_rounds_and_each_gets_its_own_positions(
    transport: DirectTransport,
) -> None:
    (lead,) = _leaders(transport, 1)
    writers = 16
    per_writer = 5
    positions: dict[int, list[tuple[int, int]]] = {}
    with ReplicationService(transport) as svc:
        start = threading.Barrier(writers)

        def write(w: int) -> None:
            start.wait()
            got: list[tuple[int, int]] = []
            for i in range(per_writer):
                got += [(idx, term) for idx, term, _ in
                        svc.submit(lead, [f"{w}-{i}".encode()]).result(timeout=60)]
            positions[w] = got

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert svc.writes == writers * per_writer
        assert svc.rounds < svc.writes, "no two writes shared a round"
    indexes = [i for got in positions.values() for i, _ in got]
    assert len(indexes) == len(set(indexes)) == writers * per_writer
    assert lead.node is not None
    assert max(indexes) <= lead.node.commit_index


def test_electing_many_tablets_costs_the_rounds_of_one(transport: DirectTransport) -> None:
    def fresh(n: int, prefix: str) -> list[TabletLeader]:
        out = []
        for k in range(n):
            lead = TabletLeader(TabletReplicas(f"{prefix}-{k}", TS), TS[k % 3], transport)
            lead.create()
            out.append(lead)
        return out

    one = fresh(1, "solo")
    before = transport.rounds
    assert all(isinstance(t, int) for t in elect_all(transport, one).values())
    rounds_for_one = transport.rounds - before
    many = fresh(6, "many")
    before = transport.rounds
    terms = elect_all(transport, many)
    assert all(isinstance(t, int) for t in terms.values()), terms
    assert transport.rounds - before == rounds_for_one
    assert all(lead.node is not None and lead.node.commit_index >= 2 for lead in many)


def test_the_driver_keeps_only_the_log_tail_and_a_replica_back_later_still_catches_up(
    transport: DirectTransport,
) -> None:
    (lead,) = _leaders(transport, 1)
    follower = next(ts for ts in TS if ts != lead.leader_id)
    transport.down = {follower}
    for k in range(150):
        lead.propose([f"w{k}".encode()])
    assert lead.node is not None
    # With one follower down its match pins the floor: nothing it lacks may be dropped.
    kept = lead.node.log.last_index() - lead.node.log.first_index() + 1
    assert kept >= 150
    transport.down = set()
    for _ in range(4):
        lead.heartbeat()
    assert lead.node.status().progress[follower][0] == lead.node.log.last_index()
    for k in range(150, 300):
        lead.propose([f"w{k}".encode()])
    lead.heartbeat()
    kept = lead.node.log.last_index() - lead.node.log.first_index() + 1
    assert kept < 150, f"the driver still mirrors {kept} entries"


def test_writers_that_shared_a_round_share_the_next_and_a_lone_writer_never_waits(
    transport: DirectTransport,
) -> None:
    """Writers back from a round are waited for (at most ``linger_s``), so rounds carry all
    of them instead of alternating between the one that queued during the round and the
    rest; a lone writer's rounds never wait."""
    (lead,) = _leaders(transport, 1)
    writers, per_writer = 8, 6
    # A linger far longer than any wait here: if the rule is wrong, rounds carry fewer
    # writers (counted below), never just slower ones.
    with ReplicationService(transport, linger_s=5.0, linger_idle_s=2.0) as svc:
        for i in range(5):
            svc.submit(lead, [f"lone-{i}".encode()]).result(timeout=60)
        assert svc.rounds == 5 and svc.lingered == 0, "a lone writer must never wait"

        sizes = _round_sizes(svc)
        start = threading.Barrier(writers)

        def write(w: int) -> None:
            start.wait()
            for i in range(per_writer):
                svc.submit(lead, [f"{w}-{i}".encode()]).result(timeout=60)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert sum(sizes) == writers * per_writer
    # The first rounds learn how many writers there are; from then on each carries all.
    full = [n for n in sizes if n == writers]
    assert len(full) >= per_writer - 2, f"rounds did not carry every writer: {sizes}"
    assert len(sizes) <= per_writer + 3, f"writers did not share rounds: {sizes}"


def test_the_first_round_waits_for_writers_that_announced_their_writes(
    transport: DirectTransport,
) -> None:
    """Writers starting together announce their writes before preparing them: the first
    round carries all of them, not the first one alone (no previous round says how many
    there are)."""
    (lead,) = _leaders(transport, 1)
    writers = 8
    # Linger bounds far above the arrivals' spread: a wrong rule shows as a split round.
    with ReplicationService(transport, linger_s=5.0, linger_idle_s=2.0) as svc:
        sizes = _round_sizes(svc)
        announced = threading.Barrier(writers)

        def write(w: int) -> None:
            me = threading.get_ident()
            svc.expect_write(me)
            announced.wait()
            time.sleep(0.03 * w)  # preparing: the writers come one after another
            svc.submit(lead, [f"w-{w}".encode()]).result(timeout=60)
            svc.expected_write_ended(me)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert sizes == [writers], f"the announced writers did not share the first round: {sizes}"


def test_rounds_do_not_wait_for_stale_ended_or_anonymous_announcements(
    transport: DirectTransport,
) -> None:
    """Only a writer that announced less than ``linger_s`` ago, and has neither submitted
    nor ended its write, is waited for; an announcement without a writer (a
    ``format("kudu")`` plan) holds only the settle round."""
    (lead,) = _leaders(transport, 1)
    with ReplicationService(transport, linger_s=0.2, linger_idle_s=0.1) as svc:
        other = threading.get_ident() + 1  # a writer thread that never submits
        svc.expect_write()  # anonymous
        svc.submit(lead, [b"after-anonymous"]).result(timeout=60)
        svc.expect_write(other)
        svc.expected_write_ended(other)
        svc.submit(lead, [b"after-ended"]).result(timeout=60)
        svc.expect_write(other)
        time.sleep(0.3)  # the announcement is older than linger_s now
        svc.submit(lead, [b"after-stale"]).result(timeout=60)
        assert svc.lingered == 0, "a round waited for a writer it should not expect"
        svc.expect_write(other)  # fresh and pending: this one is waited for (at most 0.2 s)
        svc.submit(lead, [b"after-fresh"]).result(timeout=60)
        assert svc.lingered == 1, "a round did not wait for a freshly announced writer"
