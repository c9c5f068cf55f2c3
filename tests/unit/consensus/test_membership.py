"""Learners, one-by-one membership changes (thesis §4.1-§4.2), leadership transfer (thesis
§3.10) and snapshots for lagging followers (§7). Seed: ``kudu-raft-config-change.txt``."""

from __future__ import annotations

import pytest

from pyspark_kudu.consensus import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Message,
    Role,
    Snapshot,
    SnapshotMetadata,
)
from pyspark_kudu.consensus.sim import Cluster
from pyspark_kudu.errors import InvalidArgumentError, ProposalDroppedError

from .helpers import IDS3, MT, Peer, cluster, ents, storage

ADD_VOTER, ADD_LEARNER, REMOVE = (
    ConfChangeType.ADD_VOTER, ConfChangeType.ADD_LEARNER, ConfChangeType.REMOVE,
)


def _with_learner() -> Cluster:
    """n1..n3 vote, n4 learns (configuration in every replica's storage)."""
    storages = {n: storage(IDS3, ["n4"]) for n in ("n1", "n2", "n3", "n4")}
    c = Cluster(list(IDS3), storages=storages)
    c.campaign("n1")
    c.drain()
    return c


def _change(c: Cluster, lead: str, cc: ConfChange) -> None:
    assert c.propose_conf_change(lead, cc)
    c.drain()
    c.run(2)


# -- learners (Kudu NON_VOTER) ----------------------------------------------------------------


def test_s4_2_1_a_learner_receives_and_applies_the_log() -> None:
    c = _with_learner()
    c.one(b"x", expected=4)
    assert c.hosts["n4"].applied_data() == [b"x"]
    assert c.node("n1").status().progress["n4"][0] == c.hosts["n1"].storage.last_index()


def test_s4_2_1_a_learner_never_campaigns() -> None:
    c = _with_learner()
    c.isolate("n4")
    term = c.node("n4").term
    c.run(100)
    c.campaign("n4")
    c.drain()
    assert (c.node("n4").role, c.node("n4").term) == (Role.FOLLOWER, term)


def test_s4_2_1_a_learner_is_not_counted_toward_commit() -> None:
    storages = {n: storage(["n1", "n2"], ["n3"]) for n in IDS3}
    c = Cluster(["n1", "n2"], storages=storages)
    c.campaign("n1")
    c.drain()
    c.cut("n1", "n2")
    c.propose("n1", b"x")
    c.drain()
    assert c.hosts["n3"].storage.last_index() == c.hosts["n1"].storage.last_index()
    assert c.node("n1").commit_index < c.hosts["n1"].storage.last_index()


def test_s4_2_1_a_learner_is_not_asked_for_votes_and_its_vote_does_not_count() -> None:
    p = Peer("n1", storage(["n1", "n2", "n3"], ["n4"]))
    p.node.campaign()
    out = p.read()
    assert sorted(m.to for m in out if m.type == MT.VOTE) == ["n2", "n3"]
    p.step(Message(MT.VOTE_RESP, to="n1", frm="n4", term=1))
    assert p.node.role == Role.CANDIDATE


def test_s4_2_1_a_promoted_learner_counts_and_may_lead() -> None:
    c = _with_learner()
    _change(c, "n1", ConfChange(ADD_VOTER, "n4"))
    assert c.node("n4").conf_state == ConfState.of(["n1", "n2", "n3", "n4"])
    # Four voters: with two of them cut off, nothing commits.
    c.isolate("n3")
    c.isolate("n4")
    c.propose("n1", b"x")
    c.drain()
    assert c.hosts["n1"].applied_data() == []
    c.recover()
    c.crash("n1")
    for _ in range(300):
        c.run(1)
        if c.leader() is not None:
            break
    # n2 alone holds "x", so only it can collect 3 of the 4 votes; its no-op commits "x".
    assert c.leader() == "n2"
    c.run(2)
    assert c.hosts["n4"].applied_data() == [b"x"]


def test_s4_2_1_a_demoted_leader_steps_down_and_no_longer_campaigns() -> None:
    c = cluster(lead="n1")
    _change(c, "n1", ConfChange(ADD_LEARNER, "n1"))
    assert c.node("n1").role == Role.FOLLOWER
    assert c.node("n1").conf_state.learners == frozenset({"n1"})
    c.run(60)
    assert c.leader() in ("n2", "n3")
    c.one(b"after", expected=3)


# -- one-by-one membership changes ------------------------------------------------------------


def test_s4_1_only_one_configuration_change_may_be_pending() -> None:
    c = cluster(lead="n1", spares=["n4", "n5"])
    c.filters.append(lambda m: False)  # nothing commits
    assert c.propose_conf_change("n1", ConfChange(ADD_LEARNER, "n4"))
    with pytest.raises(ProposalDroppedError):
        c.node("n1").propose_conf_change(ConfChange(ADD_LEARNER, "n5"))
    c.filters.clear()
    c.run(3)
    assert c.node("n1").conf_state.learners == frozenset({"n4"})
    assert c.propose_conf_change("n1", ConfChange(ADD_LEARNER, "n5"))


def test_s4_1_a_new_leader_accepts_no_change_before_its_no_op_is_applied() -> None:
    """The fix for the single-server change bug (Ongaro, raft-dev, 2015)."""
    c = cluster(lead="n1", spares=["n4"])
    c.filters.append(lambda m: m.type not in (MT.APP, MT.APP_RESP))
    c.campaign("n2")
    c.drain()
    assert c.leader() == "n2"
    with pytest.raises(ProposalDroppedError):
        c.node("n2").propose_conf_change(ConfChange(ADD_LEARNER, "n4"))
    c.filters.clear()
    c.run(3)
    assert c.propose_conf_change("n2", ConfChange(ADD_LEARNER, "n4"))


def test_s4_1_a_change_that_changes_nothing_or_removes_the_last_voter_is_refused() -> None:
    c = cluster(["n1"], lead="n1")
    with pytest.raises(InvalidArgumentError):
        c.node("n1").propose_conf_change(ConfChange(ADD_VOTER, "n1"))
    with pytest.raises(InvalidArgumentError):
        c.node("n1").propose_conf_change(ConfChange(REMOVE, "n1"))


def test_s4_1_a_change_takes_effect_when_applied_and_changes_the_quorum() -> None:
    c = cluster(lead="n1", spares=["n4"])
    c.start("n4")
    _change(c, "n1", ConfChange(ADD_LEARNER, "n4"))
    _change(c, "n1", ConfChange(ADD_VOTER, "n4"))
    assert {h.node.conf_state for h in c.live()} == {ConfState.of(["n1", "n2", "n3", "n4"])}
    c.isolate("n3")
    c.isolate("n4")
    c.propose("n1", b"needs 3 of 4")
    c.run(3)
    assert c.hosts["n1"].applied_data() == []
    c.connect("n4")
    c.run(3)
    assert c.hosts["n1"].applied_data() == [b"needs 3 of 4"]


def test_s4_1_removing_a_voter_shrinks_the_quorum() -> None:
    c = cluster(lead="n1")
    _change(c, "n1", ConfChange(REMOVE, "n3"))
    c.crash("n3")
    c.one(b"2 of 2", expected=2)
    c.isolate("n2")
    c.propose("n1", b"needs n2")
    c.run(3)
    assert c.hosts["n1"].applied_data() == [b"2 of 2"]


def test_s4_1_a_joiner_learns_the_founders_configuration_from_the_log() -> None:
    c = cluster(lead="n1", spares=["n4"])
    c.one(b"before", expected=3)
    c.start("n4")
    assert c.node("n4").conf_state == ConfState()
    _change(c, "n1", ConfChange(ADD_LEARNER, "n4"))
    c.run(3)
    assert c.node("n4").conf_state == ConfState.of(list(IDS3), ["n4"])
    assert c.hosts["n4"].applied_data() == [b"before"]


def test_s4_2_2_a_removed_server_with_pre_vote_does_not_disrupt_the_cluster() -> None:
    c = cluster(lead="n1", pre_vote=True, check_quorum=True)
    c.isolate("n3")
    _change(c, "n1", ConfChange(REMOVE, "n3"))
    term = c.node("n1").term
    c.recover()
    c.run(100)
    assert (c.leader(), c.node("n1").term) == ("n1", term)


# -- leadership transfer (thesis §3.10) -------------------------------------------------------


@pytest.mark.parametrize(
    ("pre_vote", "check_quorum"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_s3_10_transfer_to_an_up_to_date_follower_is_immediate(
    pre_vote: bool, check_quorum: bool
) -> None:
    """TimeoutNow makes the target campaign at once, past pre-vote and leader leases."""
    c = cluster(lead="n1", pre_vote=pre_vote, check_quorum=check_quorum)
    term = c.node("n1").term
    c.transfer_leader("n1", "n2")
    c.drain()
    assert (c.leader(), c.node("n2").term) == ("n2", term + 1)
    c.one(b"x", expected=3)


def test_s3_10_a_follower_forwards_a_transfer_request_to_the_leader() -> None:
    c = cluster(lead="n1")
    c.transfer_leader("n3", "n3")
    c.drain()
    assert c.leader() == "n3"


def test_s3_10_the_leader_catches_a_lagging_target_up_before_handing_over() -> None:
    c = cluster(lead="n1")
    c.isolate("n3")
    for i in range(5):
        c.propose("n1", f"w{i}".encode())
    c.drain()
    c.transfer_leader("n1", "n3")
    c.drain()
    assert c.node("n1").status().lead_transferee == "n3"
    with pytest.raises(ProposalDroppedError):
        c.node("n1").propose(b"during transfer")
    c.recover()
    c.run(2)
    assert c.leader() == "n3"
    assert c.hosts["n3"].storage.last_index() >= c.hosts["n1"].storage.last_index() - 1


def test_s3_10_a_transfer_is_aborted_after_an_election_timeout() -> None:
    c = cluster(lead="n1")
    c.isolate("n3")
    c.propose("n1", b"n3 lacks this")
    c.drain()
    c.transfer_leader("n1", "n3")
    c.drain()
    assert c.node("n1").status().lead_transferee == "n3"
    c.run(9)
    assert c.node("n1").status().lead_transferee == "n3"
    c.run(1)
    assert c.node("n1").status().lead_transferee == NONE
    assert c.leader() == "n1"
    assert c.propose("n1", b"accepted again")


@pytest.mark.parametrize("target", ["n1", "n9", "learner"])
def test_s3_10_transfer_to_self_a_stranger_or_a_learner_is_ignored(target: str) -> None:
    c = _with_learner()
    c.transfer_leader("n1", "n4" if target == "learner" else target)
    c.run(3)
    assert c.leader() == "n1"
    assert c.node("n1").status().lead_transferee == NONE


# -- snapshots (§7) ---------------------------------------------------------------------------


def test_s7_a_follower_whose_entries_were_compacted_gets_a_snapshot() -> None:
    c = cluster(lead="n1")
    c.crash("n3")
    for i in range(10):
        c.one(f"w{i}".encode(), expected=2)
    c.compact("n1")
    c.compact("n2")
    c.record = []
    c.start("n3")
    c.run(3)
    assert [m.to for m in c.record if m.type == MT.SNAP] == ["n3"]
    assert c.hosts["n3"].storage.first_index() > 1
    assert c.hosts["n3"].applied_data() == c.hosts["n1"].applied_data()
    c.one(b"after", expected=3)
    assert c.hosts["n3"].applied_data()[-1] == b"after"


def test_s7_a_lost_snapshot_is_reported_and_sent_again() -> None:
    c = cluster(lead="n1")
    c.crash("n3")
    for i in range(3):
        c.one(f"w{i}".encode(), expected=2)
    c.compact("n1")
    c.compact("n2")
    lost: list[Message] = []

    def drop_first_snapshot(m: Message) -> bool:
        if m.type == MT.SNAP and not lost:
            lost.append(m)
            return False
        return True

    c.filters.append(drop_first_snapshot)
    c.start("n3")
    c.run(10)
    assert len(lost) == 1
    assert c.hosts["n3"].applied_data() == c.hosts["n1"].applied_data()


def test_s7_a_snapshot_the_follower_already_covers_only_moves_its_commit() -> None:
    p = Peer("n2", storage(["n1", "n2"], log=[], term=1))
    p.step(Message(MT.APP, to="n2", frm="n1", term=1, index=0, log_term=0,
                   entries=tuple(ents(1, 1, 1)), commit=0))
    snap = Snapshot(SnapshotMetadata(2, 1, ConfState.of(["n1", "n2"])), b"copy")
    out = p.step(Message(MT.SNAP, to="n2", frm="n1", term=1, snapshot=snap))
    assert p.node.commit_index == 2
    assert p.log() == [(1, 1), (1, 2), (1, 3)]
    assert [(m.type, m.index) for m in out] == [(MT.APP_RESP, 2)]



def test_s7_a_restart_with_applied_0_replays_only_what_the_snapshot_does_not_cover() -> None:
    st = storage(log=ents(1, 1, 1, 1, 1, 1, 1, 1), term=1, commit=8)
    st.create_snapshot(5, ConfState.of(list(IDS3)), b"state at 5")
    st.compact(5)
    p = Peer("n1", st)
    assert p.node.status().applied == 5
    p.read()
    assert [e.index for e in p.applied] == [6, 7, 8]
