"""Leader election, as the Raft paper states it (§5.1, §5.2, §5.4.1) plus the thesis'
pre-vote (§9.6) and check-quorum (§6.2). Structured like etcd's ``raft_paper_test.go``."""

from __future__ import annotations

import pytest

from pyspark_kudu.consensus import NONE, Message, Role
from pyspark_kudu.consensus.sim import Cluster

from .helpers import IDS3, MT, Peer, cluster, ents, of_type, storage

ROLES = [Role.FOLLOWER, Role.PRE_CANDIDATE, Role.CANDIDATE, Role.LEADER]


def _peer_in(role: Role, term: int = 1) -> Peer:
    """n1 of {n1, n2, n3} in ``role`` at ``term``."""
    p = Peer("n1", storage(term=term - 1 if role in (Role.CANDIDATE, Role.LEADER) else term),
             pre_vote=role == Role.PRE_CANDIDATE)
    if role == Role.LEADER:
        p.elect()
    elif role != Role.FOLLOWER:
        p.node.campaign()
        p.read()
    assert (p.node.role, p.node.term) == (role, term)
    return p


def test_s5_2_a_server_starts_as_a_follower() -> None:
    p = Peer()
    assert p.node.role == Role.FOLLOWER
    assert p.node.term == 0 and p.node.lead == NONE


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.value)
def test_s5_1_a_higher_term_in_any_message_makes_the_receiver_a_follower(role: Role) -> None:
    p = _peer_in(role, term=1)
    p.step(Message(MT.APP, to="n1", frm="n2", term=2))
    assert (p.node.role, p.node.term, p.node.lead) == (Role.FOLLOWER, 2, "n2")


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.value)
def test_s5_1_a_message_with_a_stale_term_is_ignored(role: Role) -> None:
    p = _peer_in(role, term=2)
    log_before = p.log()
    out = p.step(Message(MT.APP, to="n1", frm="n3", term=1, entries=tuple(ents(1))))
    assert (p.node.role, p.node.term) == (role, 2)
    assert p.log() == log_before
    # With pre-vote (or check-quorum) the stale leader is told the newer term, else silence.
    want = [(MT.APP_RESP, "n3", 2)] if role == Role.PRE_CANDIDATE else []
    assert [(m.type, m.to, m.term) for m in out] == want


def test_s5_2_the_leader_broadcasts_heartbeats_every_heartbeat_timeout() -> None:
    p = _peer_in(Role.LEADER)
    p.read()
    out = p.tick()
    want = [("n2", 1), ("n3", 1)]
    assert [(m.to, m.term) for m in of_type(out, MT.HEARTBEAT)] == want
    assert all(m.frm == "n1" for m in out)


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE], ids=lambda r: r.value)
def test_s5_2_a_non_leader_starts_an_election_after_its_election_timeout(role: Role) -> None:
    p = _peer_in(role, term=1)
    out = p.tick(2 * 10)  # the randomized timeout is below 2 * election_tick
    assert (p.node.role, p.node.term) == (Role.CANDIDATE, 2)
    assert p.node.status().vote == "n1"
    votes = of_type(out, MT.VOTE)
    assert sorted((m.to, m.term) for m in votes)[-2:] == [("n2", 2), ("n3", 2)]


@pytest.mark.parametrize(
    ("size", "votes", "want_role"),
    [
        (1, {}, Role.LEADER),
        (3, {"n2": True, "n3": True}, Role.LEADER),
        (3, {"n2": True}, Role.LEADER),
        (5, {"n2": True, "n3": True, "n4": True, "n5": True}, Role.LEADER),
        (5, {"n2": True, "n3": True, "n4": True}, Role.LEADER),
        (5, {"n2": True, "n3": True}, Role.LEADER),
        # a majority of rejections: back to follower
        (3, {"n2": False, "n3": False}, Role.FOLLOWER),
        (5, {"n2": False, "n3": False, "n4": False, "n5": False}, Role.FOLLOWER),
        (5, {"n2": True, "n3": False, "n4": False, "n5": False}, Role.FOLLOWER),
        # no majority either way: keep waiting
        (3, {}, Role.CANDIDATE),
        (5, {"n2": True}, Role.CANDIDATE),
        (5, {"n2": False, "n3": False}, Role.CANDIDATE),
        (5, {}, Role.CANDIDATE),
    ],
)
def test_s5_2_an_election_is_decided_in_one_round_of_vote_requests(
    size: int, votes: dict[str, bool], want_role: Role
) -> None:
    ids = [f"n{i}" for i in range(1, size + 1)]
    p = Peer("n1", storage(ids))
    p.node.campaign()
    p.read()
    for frm, granted in votes.items():
        p.step(Message(MT.VOTE_RESP, to="n1", frm=frm, term=1, reject=not granted))
    assert p.node.role == want_role
    assert p.node.term == 1


@pytest.mark.parametrize(
    ("vote", "candidate", "want_reject"),
    [
        (NONE, "n2", False),
        (NONE, "n3", False),
        ("n2", "n2", False),
        ("n3", "n3", False),
        ("n2", "n3", True),
        ("n3", "n2", True),
    ],
)
def test_s5_2_a_follower_votes_for_at_most_one_candidate_per_term(
    vote: str, candidate: str, want_reject: bool
) -> None:
    p = Peer("n1", storage(term=1, vote=vote))
    out = p.step(Message(MT.VOTE, to="n1", frm=candidate, term=1))
    assert [(m.type, m.to, m.term, m.reject) for m in out] == [
        (MT.VOTE_RESP, candidate, 1, want_reject)
    ]
    assert p.storage.hard_state.vote == (vote or candidate)


@pytest.mark.parametrize("term", [1, 2], ids=["same-term", "higher-term"])
def test_s5_2_a_candidate_falls_back_to_follower_on_hearing_from_a_leader(term: int) -> None:
    p = _peer_in(Role.CANDIDATE, term=1)
    p.step(Message(MT.APP, to="n1", frm="n2", term=term))
    assert (p.node.role, p.node.term, p.node.lead) == (Role.FOLLOWER, term, "n2")


def test_s5_2_election_timeouts_are_randomized_in_election_tick_to_twice_that() -> None:
    seen = set()
    for seed in range(60):
        p = Peer("n1", storage(term=1), seed=seed)
        ticks = 0
        while p.node.role != Role.CANDIDATE and ticks < 25:
            p.tick()
            ticks += 1
        seen.add(ticks)
    assert min(seen) >= 10 and max(seen) <= 19
    assert len(seen) >= 6, f"timeouts {sorted(seen)} are not spread out"


# -- §5.4.1 election restriction -------------------------------------------------------------


def test_s5_4_1_a_vote_request_carries_the_candidates_last_log_position() -> None:
    p = Peer("n1", storage(log=ents(1, 1, 2), term=2))
    p.node.campaign()
    votes = of_type(p.read(), MT.VOTE)
    assert {(m.to, m.term, m.index, m.log_term) for m in votes} == {
        ("n2", 3, 3, 2), ("n3", 3, 3, 2),
    }


@pytest.mark.parametrize(
    ("voter_log", "cand_index", "cand_log_term", "want_reject"),
    [
        # same last term: the longer-or-equal log wins
        ([1], 1, 1, False),
        ([1], 2, 1, False),
        ([1, 1], 1, 1, True),
        # candidate's last term is higher
        ([1], 1, 2, False),
        ([1], 2, 2, False),
        ([1, 1], 1, 2, False),
        # voter's last term is higher
        ([2], 1, 1, True),
        ([2], 2, 1, True),
        ([2, 1], 1, 1, True),
    ],
)
def test_s5_4_1_a_voter_denies_a_candidate_whose_log_is_less_up_to_date(
    voter_log: list[int], cand_index: int, cand_log_term: int, want_reject: bool
) -> None:
    p = Peer("n1", storage(log=ents(*voter_log), term=max(voter_log)))
    out = p.step(Message(MT.VOTE, to="n1", frm="n2", term=3, index=cand_index,
                         log_term=cand_log_term))
    assert [(m.type, m.reject) for m in out] == [(MT.VOTE_RESP, want_reject)]


def test_s5_4_1_a_server_missing_committed_entries_cannot_be_elected() -> None:
    c = cluster(lead="n1")
    c.isolate("n3")
    c.one(b"x", expected=2)
    c.crash("n1")
    c.recover()
    c.campaign("n3")
    c.drain()
    assert c.node("n3").role != Role.LEADER
    c.run(60)
    assert c.leader() == "n2"


# -- thesis §9.6 pre-vote, §6.2 check-quorum ---------------------------------------------------


@pytest.mark.parametrize(
    ("pre_vote", "want_term_bumped"), [(True, False), (False, True)], ids=["pre-vote", "plain"]
)
def test_s9_6_pre_vote_keeps_a_partitioned_server_from_raising_its_term(
    pre_vote: bool, want_term_bumped: bool
) -> None:
    c = cluster(lead="n1", pre_vote=pre_vote)
    term = c.node("n1").term
    c.isolate("n3")
    c.one(b"while n3 was away", expected=2)
    c.run(100)
    assert (c.node("n3").term > term) is want_term_bumped
    if pre_vote:
        assert c.node("n3").role == Role.PRE_CANDIDATE
    c.recover()
    c.run(30)
    # With pre-vote the rejoining server is told about the log it lacks and follows; without,
    # its higher term deposes the leader (the "disruptive server" of thesis §4.2.3).
    assert (c.leader() != "n1" or c.node("n1").term > term) is want_term_bumped
    c.one(b"after", expected=3)


def test_s9_6_pre_vote_is_answered_with_the_future_term_and_does_not_change_the_voter() -> None:
    p = Peer("n1", storage(term=2))
    out = p.step(Message(MT.PRE_VOTE, to="n1", frm="n2", term=3, index=0, log_term=0))
    assert [(m.type, m.term, m.reject) for m in out] == [(MT.PRE_VOTE_RESP, 3, False)]
    assert (p.node.term, p.node.status().vote) == (2, NONE)


def test_s6_2_check_quorum_makes_an_isolated_leader_step_down() -> None:
    c = cluster(lead="n1", check_quorum=True)
    c.isolate("n1")
    c.run(2 * 10)
    assert c.node("n1").role == Role.FOLLOWER
    c.run(2 * 10)
    assert c.leader() in ("n2", "n3")


def test_s6_2_without_check_quorum_an_isolated_leader_keeps_believing() -> None:
    c = cluster(lead="n1", check_quorum=False)
    c.isolate("n1")
    c.run(2 * 10)
    assert c.node("n1").role == Role.LEADER


def test_s4_2_3_with_check_quorum_followers_ignore_a_disruptive_vote_request() -> None:
    c = cluster(lead="n1", check_quorum=True)
    term = c.node("n1").term
    c.step(Message(MT.VOTE, to="n2", frm="n3", term=term + 5, index=10**6, log_term=term + 5))
    assert (c.node("n2").term, c.node("n2").lead) == (term, "n1")


def test_s5_2_a_three_node_cluster_elects_exactly_one_leader() -> None:
    c = Cluster(list(IDS3), seed=3)
    c.run(50)
    leaders = [h.id for h in c.live() if h.node.role == Role.LEADER]
    assert len(leaders) == 1
    assert {h.node.lead for h in c.live()} == {leaders[0]}


def test_s5_2_followers_that_stop_hearing_from_the_leader_elect_another() -> None:
    c = cluster(lead="n1")
    term = c.node("n1").term
    c.ignore(MT.HEARTBEAT)
    c.ignore(MT.APP)
    c.run(3 * 10)
    assert c.node("n2").term > term or c.node("n3").term > term
    c.recover()
    c.run(30)
    lead = c.leader()
    assert lead is not None and c.node(lead).term > term
