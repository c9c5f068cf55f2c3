"""MIT 6.824 (Lab 2) scenarios on the simulated cluster: elections (2A), agreement (2B),
persistence (2C). ``Cluster.one`` is the lab's ``cfg.one``: propose at whoever leads until
the expected number of servers applied the command. Every step runs the safety checker."""

from __future__ import annotations

import random

import pytest

from pyspark_kudu.consensus import Role
from pyspark_kudu.consensus.sim import Cluster

from .helpers import MT

ELECTION = 10


def _cluster(n: int, seed: int = 0, pre_vote: bool = False) -> Cluster:
    return Cluster([f"n{i}" for i in range(1, n + 1)], seed=seed, pre_vote=pre_vote)


def _check_one_leader(c: Cluster, max_ticks: int = 30 * ELECTION) -> str:
    """A leader among the connected majority; never two in one term (the checker's job)."""
    for _ in range(max_ticks):
        c.run(1)
        lead = c.leader()
        if lead is not None:
            reach = [o for o in c.hosts if (lead, o) not in c.net.cut_links and c.hosts[o].alive]
            if len(reach) > len(c.hosts) // 2:
                return lead
    raise AssertionError("expected one leader, got none")


def _check_no_leader_among(c: Cluster, ids: list[str]) -> None:
    assert all(c.node(i).role != Role.LEADER for i in ids if c.hosts[i].alive)


# -- 2A: elections --------------------------------------------------------------------------


def test_2a_initial_election_and_a_stable_term_without_failures() -> None:
    c = _cluster(3)
    lead = _check_one_leader(c)
    terms = {h.node.term for h in c.live()}
    assert len(terms) == 1
    c.run(5 * ELECTION)
    assert {h.node.term for h in c.live()} == terms
    assert c.leader() == lead


def test_2a_re_election_after_network_failures() -> None:
    c = _cluster(3)
    lead1 = _check_one_leader(c)
    c.disconnect(lead1)  # a new leader among the other two
    lead2 = _check_one_leader(c)
    assert lead2 != lead1
    c.connect(lead1)  # the old leader rejoins and follows
    assert _check_one_leader(c) == lead2
    other = next(n for n in c.hosts if n not in (lead2,))
    c.disconnect(lead2)
    c.disconnect(other)  # no majority: no new leader
    c.run(3 * ELECTION)
    third = next(n for n in c.hosts if n not in (lead2, other))
    _check_no_leader_among(c, [third])
    c.connect(other)  # a majority again
    _check_one_leader(c)
    c.connect(lead2)
    _check_one_leader(c)


@pytest.mark.parametrize("pre_vote", [False, True], ids=["plain", "pre-vote"])
def test_2a_many_elections_with_random_disconnections(pre_vote: bool) -> None:
    rng = random.Random(7)
    c = _cluster(7, seed=7, pre_vote=pre_vote)
    _check_one_leader(c)
    for _ in range(10):
        gone = rng.sample(sorted(c.hosts), 3)
        for n in gone:
            c.disconnect(n)
        _check_one_leader(c)
        for n in gone:
            c.connect(n)
    _check_one_leader(c)


# -- 2B: agreement ---------------------------------------------------------------------------


def test_2b_basic_agreement_at_consecutive_indexes() -> None:
    c = _cluster(3)
    _check_one_leader(c)
    indexes = [c.one(f"cmd{i}".encode(), expected=3) for i in range(3)]
    assert indexes == [indexes[0], indexes[0] + 1, indexes[0] + 2]


def test_2b_fail_agree_a_disconnected_follower_catches_up() -> None:
    c = _cluster(3)
    lead = _check_one_leader(c)
    c.one(b"101", expected=3)
    follower = next(n for n in c.hosts if n != lead)
    c.disconnect(follower)
    for cmd in (b"102", b"103", b"104"):
        c.one(cmd, expected=2)
    c.connect(follower)
    c.one(b"106", expected=3)
    assert c.hosts[follower].applied_data() == [b"101", b"102", b"103", b"104", b"106"]


def test_2b_fail_no_agree_without_a_majority_nothing_commits() -> None:
    c = _cluster(5)
    c.one(b"10", expected=5)
    lead = c.leader()
    assert lead is not None
    followers = [n for n in sorted(c.hosts) if n != lead][:3]
    for n in followers:
        c.disconnect(n)
    assert c.propose(lead, b"20")
    c.run(2 * ELECTION)
    assert c.n_applied(b"20") == 0
    for n in followers:
        c.connect(n)
    c.one(b"30", expected=5)
    # "20" may have been overwritten by a newer leader, but is never applied out of order.
    assert all(h.applied_data()[-1] == b"30" for h in c.hosts.values())


def test_2b_concurrent_starts_all_commit_exactly_once() -> None:
    c = _cluster(3)
    lead = _check_one_leader(c)
    cmds = [f"c{i}".encode() for i in range(5)]
    for cmd in cmds:
        assert c.propose(lead, cmd)
    c.run(3)
    for h in c.hosts.values():
        assert sorted(h.applied_data()) == sorted(cmds)


def test_2b_rejoin_of_a_partitioned_leader_discards_its_uncommitted_entries() -> None:
    c = _cluster(3)
    c.one(b"101", expected=3)
    lead1 = c.leader()
    assert lead1 is not None
    c.disconnect(lead1)  # it keeps accepting proposals that can never commit
    for cmd in (b"102", b"103", b"104"):
        c.propose(lead1, cmd)
    c.drain()
    c.one(b"103'", expected=2)
    lead2 = c.leader()
    assert lead2 is not None
    c.disconnect(lead2)
    c.connect(lead1)
    c.one(b"104'", expected=2)
    c.connect(lead2)
    c.one(b"105", expected=3)
    for h in c.hosts.values():
        assert h.applied_data() == [b"101", b"103'", b"104'", b"105"]


def test_2b_backup_a_leader_backs_up_quickly_over_incorrect_follower_logs() -> None:
    c = _cluster(5, seed=1)
    c.one(b"first", expected=5)
    lead1 = c.leader()
    assert lead1 is not None
    others = [n for n in sorted(c.hosts) if n != lead1]
    # Leader and one follower on the minority side collect 50 entries that never commit.
    c.partition([lead1, others[0]], others[1:])
    for i in range(50):
        c.propose(lead1, f"lost{i}".encode())
    c.drain()
    # The majority side commits 50 others.
    for i in range(50):
        c.one(f"kept{i}".encode(), expected=3)
    lead2 = c.leader()
    assert lead2 in others[1:]
    # Now the other minority: lead2 plus one, 50 more uncommitted entries.
    c.partition([lead2, others[1] if others[1] != lead2 else others[2]],
                [lead1, others[0], *(o for o in others[1:] if o != lead2)][:3])
    for i in range(50):
        c.propose(lead2, f"lost-again{i}".encode())
    c.drain()
    c.recover()
    c.record = []
    c.one(b"last", expected=5)
    rejects = [m for m in c.record if m.type == MT.APP_RESP and m.reject]
    assert len(rejects) < 20, "reject hints should skip whole terms, not one entry at a time"
    want = [b"first", *(f"kept{i}".encode() for i in range(50))]
    assert all(h.applied_data()[: len(want)] == want for h in c.hosts.values())
    assert all(h.applied_data()[-1] == b"last" for h in c.hosts.values())


def test_2b_rpc_count_an_idle_agreement_is_cheap() -> None:
    c = _cluster(3)
    _check_one_leader(c)
    c.one(b"warm up", expected=3)
    before = c.stats["delivered"]
    for i in range(10):
        c.propose(c.leader() or "n1", f"x{i}".encode())
        c.drain()
    # Per proposal and follower: the APP, its ack, the commit-carrying APP and its ack.
    assert c.stats["delivered"] - before <= 10 * 2 * 4


# -- 2C: persistence -------------------------------------------------------------------------


def test_2c_persist_crash_and_restart_of_all_servers() -> None:
    c = _cluster(3)
    c.one(b"11", expected=3)
    for n in sorted(c.hosts):
        c.crash(n)
    for n in sorted(c.hosts):
        c.start(n)
    c.one(b"12", expected=3)
    lead = c.leader()
    assert lead is not None
    c.crash(lead)
    c.start(lead)
    c.one(b"13", expected=3)
    lead = c.leader()
    assert lead is not None
    c.crash(lead)
    c.one(b"14", expected=2)
    c.start(lead)
    c.one(b"15", expected=3)
    for h in c.hosts.values():
        assert h.applied_data() == [b"11", b"12", b"13", b"14", b"15"]


@pytest.mark.parametrize("volatile", [False, True], ids=["durable-sm", "volatile-sm"])
def test_2c_persist_followers_crash_one_by_one_and_come_back(volatile: bool) -> None:
    c = _cluster(5, seed=2)
    index = 0
    for i in range(5):
        c.one(f"a{i}".encode(), expected=5 if i == 0 else 4)
        lead = c.leader()
        assert lead is not None
        down = [n for n in sorted(c.hosts) if n != lead][:2]
        for n in down:
            c.crash(n)
        c.one(f"b{i}".encode(), expected=3)
        for n in down:
            c.start(n, volatile=volatile)
        index = c.one(f"c{i}".encode(), expected=5)
    assert index > 0
    assert len({tuple(h.applied_data()) for h in c.hosts.values()}) == 1


def test_2c_persist_a_partitioned_leader_and_follower_crash_and_the_leader_restarts() -> None:
    c = _cluster(3)
    c.one(b"101", expected=3)
    lead = c.leader()
    assert lead is not None
    follower = next(n for n in sorted(c.hosts) if n != lead)
    c.disconnect(follower)
    c.one(b"102", expected=2)
    c.crash(lead)
    c.crash(next(n for n in sorted(c.hosts) if n not in (lead, follower)))
    c.connect(follower)
    c.start(lead)
    c.one(b"103", expected=2)
    c.start(next(n for n in sorted(c.hosts) if not c.hosts[n].alive))
    c.one(b"104", expected=3)
    for h in c.hosts.values():
        assert h.applied_data() == [b"101", b"102", b"103", b"104"]


@pytest.mark.parametrize("seed", range(4))
def test_2c_figure_8_unreliable_churn_then_agreement(seed: int) -> None:
    """Drops, duplicates, delays, reordering and crashes for a while; then heal and agree."""
    rng = random.Random(seed)
    c = _cluster(5, seed=seed, pre_vote=seed % 2 == 1)
    c.net.drop_rate, c.net.dup_rate, c.net.max_delay = 0.1, 0.05, 3
    c.auto_ready = 0.8
    for i in range(300):
        lead = c.leader()
        if lead is not None and rng.random() < 0.3:
            c.propose(lead, f"u{i}".encode())
        if rng.random() < 0.05 and len(c.live()) > 3:
            c.crash(rng.choice(c.live()).id)
        if rng.random() < 0.1:
            down = [n for n, h in c.hosts.items() if not h.alive]
            if down:
                c.start(rng.choice(down))
        c.tick()
        for _ in range(rng.randint(0, 12)):
            f = c._pop_due(fifo=False)
            if f is not None:
                c.deliver(f)
    for n, h in c.hosts.items():
        if not h.alive:
            c.start(n)
    c.net.drop_rate = c.net.dup_rate = 0.0
    c.net.max_delay = 0
    c.auto_ready = 1.0
    c.one(b"final", expected=5, max_ticks=100 * ELECTION)
    assert len({tuple(h.applied_data()) for h in c.hosts.values()}) == 1
