"""Log replication and the commit rule, as the Raft paper states them (§5.3, §5.4.2), with
Figure 7 (follower logs a-f) and Figure 8 (commit only entries of the current term)."""

from __future__ import annotations

import pytest

from pyspark_kudu.consensus import ConfState, Entry, HardState, MemoryStorage, Message, Role
from pyspark_kudu.consensus.sim import Cluster

from .helpers import IDS3, MT, Peer, cluster, ents, log_of, of_type, storage


def _leader_cluster(size: int = 3) -> Cluster:
    return cluster([f"n{i}" for i in range(1, size + 1)], lead="n1")


def test_s5_3_the_leader_appends_a_proposal_and_sends_it_to_every_follower() -> None:
    c = _leader_cluster()
    lead = c.node("n1")
    last, commit, term = c.hosts["n1"].storage.last_index(), lead.commit_index, lead.term
    c.record = []
    c.filters.append(lambda m: False)  # keep everything in the air
    c.propose("n1", b"some data")
    apps = of_type(c.record, MT.APP)
    want_entry = (Entry(term, last + 1, data=b"some data"),)
    assert [(m.to, m.index, m.log_term, m.entries, m.commit) for m in apps] == [
        ("n2", last, term, want_entry, commit), ("n3", last, term, want_entry, commit),
    ]
    # Persisted by the leader, but not committed before a majority acknowledged it.
    assert c.hosts["n1"].storage.last_index() == last + 1
    assert lead.commit_index == commit


def test_s5_3_an_entry_commits_once_a_majority_stored_it_and_every_server_applies_it() -> None:
    c = _leader_cluster()
    c.cut("n1", "n3")
    c.propose("n1", b"x")
    c.drain()
    index = c.hosts["n1"].storage.last_index()
    assert c.node("n1").commit_index == index
    assert c.hosts["n1"].applied_data()[-1] == b"x"
    c.recover()
    c.run(3)
    assert all(h.sm[-1].data == b"x" for h in c.hosts.values())


@pytest.mark.parametrize(
    ("size", "acceptors", "want_commit"),
    [
        (1, [], True),
        (3, [], False),
        (3, ["n2"], True),
        (3, ["n2", "n3"], True),
        (5, [], False),
        (5, ["n2"], False),
        (5, ["n2", "n3"], True),
        (5, ["n2", "n3", "n4"], True),
        (5, ["n2", "n3", "n4", "n5"], True),
    ],
)
def test_s5_3_the_leader_commits_once_a_majority_acknowledged(
    size: int, acceptors: list[str], want_commit: bool
) -> None:
    c = _leader_cluster(size)
    for nid in c.hosts:
        if nid != "n1" and nid not in acceptors:
            c.cut("n1", nid)
    c.propose("n1", b"x")
    c.drain()
    index = c.hosts["n1"].storage.last_index()
    assert (c.node("n1").commit_index == index) is want_commit


@pytest.mark.parametrize(
    "previous_terms", [[], [2], [1, 2], [1]], ids=["empty", "t2", "t1-t2", "t1"]
)
def test_s5_3_committing_an_entry_commits_every_preceding_entry(previous_terms: list[int]) -> None:
    log = ents(*previous_terms)
    storages = {n: storage(log=log, term=2) for n in IDS3}
    c = Cluster(list(IDS3), storages=storages)
    c.campaign("n1")
    c.drain()
    c.propose("n1", b"some data")
    c.drain()
    applied = c.hosts["n1"].sm
    assert [(e.term, e.index) for e in applied] == [
        *[(e.term, e.index) for e in log], (3, len(log) + 1), (3, len(log) + 2),
    ]
    assert applied[-1].data == b"some data"


def test_s5_3_a_follower_commits_what_the_leader_says_it_committed() -> None:
    p = Peer("n1", storage(term=1))
    p.step(Message(MT.APP, to="n1", frm="n2", term=1, index=0, log_term=0,
                   entries=tuple(ents(1, 1, 1)), commit=2))
    assert p.node.commit_index == 2
    assert [(e.term, e.index) for e in p.applied] == [(1, 1), (1, 2)]


@pytest.mark.parametrize(
    ("log_term", "index", "want_index", "want_reject", "want_hint"),
    [
        (0, 0, 1, False, 0),  # below the commit index: answered with the commit index
        (1, 1, 1, False, 0),  # matches a committed entry
        (2, 2, 2, False, 0),  # matches an uncommitted entry
        (1, 2, 2, True, 1),  # our entry 2 has another term
        (3, 3, 3, True, 2),  # we have no entry 3
    ],
)
def test_s5_3_a_follower_rejects_an_append_whose_previous_entry_it_lacks(
    log_term: int, index: int, want_index: int, want_reject: bool, want_hint: int
) -> None:
    p = Peer("n1", storage(log=ents(1, 2), term=2, commit=1))
    out = p.step(Message(MT.APP, to="n1", frm="n2", term=2, index=index, log_term=log_term,
                         commit=1))
    assert [(m.type, m.index, m.reject, m.reject_hint) for m in out] == [
        (MT.APP_RESP, want_index, want_reject, want_hint)
    ]


@pytest.mark.parametrize(
    ("index", "log_term", "new", "want_log"),
    [
        (2, 2, [(3, 3)], [(1, 1), (2, 2), (3, 3)]),
        (1, 1, [(3, 2), (4, 3)], [(1, 1), (3, 2), (4, 3)]),  # conflict at 2: truncate, append
        (0, 0, [(1, 1)], [(1, 1), (2, 2)]),  # already there: nothing is truncated
        (0, 0, [(3, 1)], [(3, 1)]),  # conflict at 1: everything after goes
    ],
)
def test_s5_3_a_follower_deletes_conflicting_entries_and_appends_new_ones(
    index: int, log_term: int, new: list[tuple[int, int]], want_log: list[tuple[int, int]]
) -> None:
    p = Peer("n1", storage(log=ents(1, 2), term=2))
    p.step(Message(MT.APP, to="n1", frm="n2", term=2, index=index, log_term=log_term,
                   entries=tuple(Entry(t, i) for t, i in new)))
    assert p.log() == want_log


# Figure 7: the leader of term 8 and six possible follower logs (terms of entries 1, 2, ...).
FIG7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIG7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],  # missing entries
    "b": [1, 1, 1, 4],  # missing entries
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],  # an extra uncommitted entry
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],  # extra entries of a later term
    "e": [1, 1, 1, 4, 4, 4, 4],  # missing entries and extra ones of term 4
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],  # a leader of terms 2 and 3 that never committed
}


@pytest.mark.parametrize("situation", sorted(FIG7_FOLLOWERS))
def test_s5_3_figure_7_the_leader_brings_every_follower_log_in_line(situation: str) -> None:
    storages = {
        "n1": storage(log=ents(*FIG7_LEADER), term=8),
        "n2": storage(log=ents(*FIG7_FOLLOWERS[situation]), term=7),
        "n3": storage(term=7),
    }
    c = Cluster(list(IDS3), storages=storages)
    c.crash("n3")  # a silent third server; its vote is injected below (as etcd's test does)
    c.campaign("n1")
    c.step(Message(MT.VOTE_RESP, to="n1", frm="n3", term=9))
    c.drain()
    assert c.leader() == "n1"
    c.propose("n1", b"")
    c.drain()
    assert log_of(c, "n2") == log_of(c, "n1")
    assert c.node("n2").commit_index == c.node("n1").commit_index == len(FIG7_LEADER) + 2


def test_s5_3_fast_backtracking_skips_a_whole_divergent_term_per_probe() -> None:
    """The reject hint (term and index) lets the leader skip 50 conflicting entries at once."""
    storages = {
        "n1": storage(log=ents(1, *[3] * 50), term=3),
        "n2": storage(log=ents(1, *[2] * 50), term=3),
        "n3": storage(log=ents(1, *[3] * 50), term=3),
    }
    c = Cluster(list(IDS3), storages=storages)
    c.record = []
    c.campaign("n1")
    c.drain()
    assert log_of(c, "n2") == log_of(c, "n1")
    rejects = [m for m in c.record if m.type == MT.APP_RESP and m.reject and m.frm == "n2"]
    assert 1 <= len(rejects) <= 2
    assert (rejects[0].reject_hint, rejects[0].log_term) == (51, 2)


@pytest.mark.parametrize(
    ("leader_log", "follower_log", "want_probes"),
    [
        ([1, 2, 2, 2, 2], [1, 1, 1, 1, 1], 2),  # follower behind in term: one hint suffices
        ([1, 1, 1, 4, 4, 4], [1, 1, 1, 2, 2, 3, 3, 3], 2),
        ([1, *[5] * 40], [1, *[2] * 10, *[3] * 10, *[4] * 10], 2),
        ([1, *[2] * 20], [1], 1),  # follower is just short
    ],
)
def test_s5_3_reject_hints_bound_the_number_of_probes(
    leader_log: list[int], follower_log: list[int], want_probes: int
) -> None:
    term = max(leader_log)
    storages = {
        "n1": storage(log=ents(*leader_log), term=term),
        "n2": storage(log=ents(*follower_log), term=term),
        "n3": storage(log=ents(*leader_log), term=term),
    }
    c = Cluster(list(IDS3), storages=storages)
    c.record = []
    c.campaign("n1")
    c.drain()
    assert log_of(c, "n2") == log_of(c, "n1")
    rejects = [m for m in c.record if m.type == MT.APP_RESP and m.reject and m.frm == "n2"]
    assert len(rejects) <= want_probes


# -- §5.4.2 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("acked", "want_commit"), [(1, 0), (2, 0), (3, 3)])
def test_s5_4_2_a_leader_commits_by_counting_replicas_only_entries_of_its_term(
    acked: int, want_commit: int
) -> None:
    p = Peer("n1", storage(voters=["n1", "n2"], log=ents(1, 2), term=2))
    p.elect(voters=["n1", "n2"])  # term 3; the no-op is entry 3
    p.step(Message(MT.APP_RESP, to="n1", frm="n2", term=3, index=acked))
    assert p.node.commit_index == want_commit


def test_s5_4_2_figure_8_an_old_term_entry_on_a_majority_is_not_committed() -> None:
    """Figure 8 (a)-(d) on five servers; ``b`` is the bootstrap prefix, then:

    (a) S1 leads term 2 and replicates entry b+2 to S2 only; (b) S5 wins term 3 with S3, S4
    and appends its own b+2 nobody gets; (c) S1 wins term 4 and gets its b+2 (term 2) onto S3:
    a majority stores it, yet it must not count as committed; (d) S5 wins term 5 and
    overwrites b+2 everywhere, which is safe only because (c) did not commit it.
    """
    ids = ["n1", "n2", "n3", "n4", "n5"]
    c = cluster(ids, lead="n1", max_size_per_msg=1)
    b = c.node("n1").commit_index - 1  # bootstrap entries; b+1 is the term-2 no-op
    # (a)
    c.partition(["n1", "n2"], ["n3", "n4", "n5"])
    c.propose("n1", b"term 2")
    c.drain()
    assert log_of(c, "n2")[-1] == (2, b + 2)
    # (b)
    c.crash("n1")
    c.filters.append(lambda m: not (m.frm == "n5" and m.type == MT.APP))
    c.campaign("n5")
    c.drain()
    assert (c.leader(), c.node("n5").term) == ("n5", 3)
    assert log_of(c, "n5")[-1] == (3, b + 2)
    # (c) S4 is out of reach, so S1's term-4 no-op can reach at most S1 and S2.
    c.crash("n5")
    c.filters.clear()
    c.recover()
    c.cut("n1", "n4")
    c.start("n1")
    c.filters.append(lambda m: not (
        m.frm == "n1" and m.to == "n3" and m.type == MT.APP
        and c.hosts["n3"].storage.last_index() >= b + 2 and any(e.index > b + 2 for e in m.entries)
    ))
    _campaign_until_leader(c, "n1")
    c.run(3)
    assert c.node("n1").term == 4
    assert [log_of(c, n)[b + 1] for n in ("n1", "n2", "n3")] == [(2, b + 2)] * 3
    assert c.node("n1").commit_index == b + 1
    # (d)
    c.crash("n1")
    c.filters.clear()
    c.recover()
    c.start("n5")
    _campaign_until_leader(c, "n5")
    c.propose("n5", b"term 5")
    c.drain()
    assert [log_of(c, n)[b + 1] for n in ("n2", "n3", "n4", "n5")] == [(3, b + 2)] * 4
    assert c.hosts["n5"].applied_data() == [b"term 5"]


def _campaign_until_leader(c: Cluster, nid: str) -> None:
    for _ in range(5):
        c.campaign(nid)
        c.drain()
        if c.leader() == nid:
            return
    raise AssertionError(f"{nid} did not win an election")


def test_s5_4_2_figure_8_e_once_a_current_term_entry_is_on_a_majority_all_before_commit() -> None:
    ids = ["n1", "n2", "n3", "n4", "n5"]
    c = cluster(ids, lead="n1")
    c.partition(["n1", "n2"], ["n3", "n4", "n5"])
    c.propose("n1", b"term 2")
    c.drain()
    c.crash("n1")
    c.recover()
    c.start("n1")
    c.cut("n1", "n5")
    c.cut("n1", "n4")
    _campaign_until_leader(c, "n1")
    # S1's term-3 no-op reached S2 and S3: it and the term-2 entry before it are committed.
    assert c.hosts["n3"].storage.last_index() == c.node("n1").commit_index
    assert c.hosts["n1"].applied_data() == [b"term 2"]


def test_s5_3_a_leader_never_overwrites_or_deletes_its_own_entries() -> None:
    st = MemoryStorage(ConfState.of(list(IDS3)))
    st.append(ents(1, 1))
    st.set_hard_state(HardState(1, "", 0))
    p = Peer("n1", st)
    p.elect()
    before = p.log()
    p.step(Message(MT.APP_RESP, to="n1", frm="n2", term=2, index=1, reject=True,
                   reject_hint=0))
    p.node.propose(b"x")
    p.read()
    assert p.log()[: len(before)] == before
    assert p.node.role == Role.LEADER


def test_committed_entries_skipped_unread_are_only_stable_ones_and_are_not_handed_out() -> None:
    """``unread_committed``/``skip_committed`` (a replica leaving writes to a later apply
    without reading them): the range named stops before the unstable tail -- entries the
    next ``ready`` persists first, which storage does not have yet -- and skipped entries
    are not handed out again, while the rest of the commit still is."""
    p = Peer("n2", storage(log=ents(1, 1, 1), term=1))
    app = Message(MT.APP, to="n2", frm="n1", term=1, index=3, log_term=1,
                  entries=tuple(ents(1, 1, start=4)), commit=5)
    p.node.step(app)
    assert p.node.unread_committed() == (1, 3)
    p.node.skip_committed(3)
    assert p.node.unread_committed() is None  # 4 and 5 are committed but not yet stored
    rd = p.node.ready()
    assert [e.index for e in rd.entries] == [4, 5]
    assert [e.index for e in rd.committed_entries] == [4, 5]
    p.storage.append(list(rd.entries))
    p.node.advance(rd)
    assert p.node.unread_committed() is None and not p.node.has_ready()
