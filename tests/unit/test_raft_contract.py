"""Pins the design decisions of ``RaftNode`` that go beyond the Raft paper (module rules 3-5).

The paper-section tests and the simulator live in ``tests/unit/consensus/``.
"""

from __future__ import annotations

import random

import pytest

from pyspark_kudu.consensus import (
    ConfChange,
    ConfChangeType,
    Config,
    ConfState,
    EntryType,
    MemoryStorage,
    RaftNode,
    Role,
    decode_conf_change,
)
from pyspark_kudu.consensus.confchange import apply_conf_change
from pyspark_kudu.consensus.local import LocalGroup
from pyspark_kudu.errors import (
    ConsensusError,
    InvalidArgumentError,
    ProposalDroppedError,
)


def _single(node_id: str = "n1") -> tuple[RaftNode, MemoryStorage]:
    st = MemoryStorage.bootstrapped([node_id])
    node = RaftNode(Config(id=node_id, storage=st, rng=random.Random(1)))
    return node, st


def _drain(node: RaftNode, st: MemoryStorage) -> None:
    while node.has_ready():
        rd = node.ready()
        st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        node.advance(rd)


def test_leader_counts_itself_only_for_entries_it_persisted() -> None:
    node, st = _single()
    _drain(node, st)  # apply the bootstrap config first: no campaign with changes unapplied
    node.campaign()
    _drain(node, st)
    assert node.role == Role.LEADER
    committed_before = node.commit_index
    node.propose(b"x")
    rd = node.ready()
    assert [e.data for e in rd.entries] == [b"x"]
    # Not yet persisted: even a single-voter group must not call it committed.
    assert node.commit_index == committed_before
    assert rd.committed_entries == ()
    st.append(rd.entries)
    node.advance(rd)
    assert node.commit_index == rd.entries[-1].index
    assert [e.data for e in node.ready().committed_entries] == [b"x"]


def test_ready_must_be_advanced_before_the_next_one() -> None:
    node, _ = _single()
    node.ready()
    assert not node.has_ready()
    with pytest.raises(ConsensusError, match="before advance"):
        node.ready()


def test_new_leader_accepts_no_conf_change_until_its_noop_is_applied() -> None:
    group = LocalGroup(["a", "b", "c"], seed=3)
    group.tick(30)
    lead = group.leader()
    assert lead is not None
    # Freshly elected leaders in LocalGroup have applied their no-op after pump(); force the
    # pending state by proposing a change and trying a second one before it is applied.
    lead.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    with pytest.raises(ProposalDroppedError, match="still pending"):
        lead.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e"))


def test_conf_change_that_changes_nothing_or_removes_last_voter_is_refused() -> None:
    node, st = _single()
    _drain(node, st)
    node.campaign()
    _drain(node, st)
    with pytest.raises(InvalidArgumentError, match="changes nothing"):
        node.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, "n1"))
    with pytest.raises(InvalidArgumentError, match="last voter"):
        node.propose_conf_change(ConfChange(ConfChangeType.REMOVE, "n1"))
    with pytest.raises(InvalidArgumentError, match="only be written by bootstrap"):
        node.propose_conf_change(ConfChange(ConfChangeType.BOOTSTRAP, "n1", b"{}"))


def test_joiner_learns_founding_config_from_the_log_and_never_elects_itself_alone() -> None:
    group = LocalGroup(["a", "b", "c"], seed=5)
    lead = group.elect()
    group.storages["d"] = MemoryStorage()  # a joiner starts empty: no config at all
    group.applied["d"] = []
    group.nodes["d"] = RaftNode(Config(id="d", storage=group.storages["d"], rng=random.Random(9)))
    lead.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    group.tick(5)
    lead = group.elect()
    lead.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, "d"))
    group.tick(5)
    assert group.nodes["d"].conf_state.voters == {"a", "b", "c", "d"}
    # With the others gone, d must not win an election on its own vote.
    for other in ("a", "b", "c"):
        group.crash(other)
    group.tick(100)
    assert group.nodes["d"].role != Role.LEADER


def test_proposals_on_a_follower_are_dropped_with_the_leader_named() -> None:
    group = LocalGroup(["a", "b", "c"], seed=11)
    lead = group.elect()
    follower = next(n for i, n in group.nodes.items() if i != lead.id)
    with pytest.raises(ProposalDroppedError, match=f"leader: {lead.id}"):
        follower.propose(b"x")


def test_proposals_are_dropped_during_leader_transfer() -> None:
    group = LocalGroup(["a", "b", "c"], seed=13)
    lead = group.elect()
    target = next(i for i in group.nodes if i != lead.id)
    group.crash(target)  # the transfer cannot complete while the target is down
    lead.transfer_leader(target)
    with pytest.raises(ProposalDroppedError, match="transfer"):
        lead.propose(b"x")
    group.tick(25)  # more than one election timeout: the transfer is aborted
    assert lead.role == Role.LEADER and lead.lead_transferee == ""
    lead.propose(b"after-abort")
    group.pump()
    assert b"after-abort" in group.applied[lead.id]


def test_campaign_waits_until_committed_conf_changes_are_applied() -> None:
    node, st = _single()
    node.campaign()  # the bootstrap ADD_VOTER entries are committed but not applied yet
    assert node.role == Role.FOLLOWER
    _drain(node, st)
    node.campaign()
    assert node.role == Role.LEADER


def test_bootstrap_is_one_committed_entry_carrying_the_whole_configuration() -> None:
    st = MemoryStorage.bootstrapped(["x", "y", "z"])
    ents = st.entries(1, st.last_index() + 1)
    assert [e.type for e in ents] == [EntryType.CONF_CHANGE]
    cc = decode_conf_change(ents[0].data)
    assert cc.type == ConfChangeType.BOOTSTRAP
    assert apply_conf_change(ConfState(), cc) == ConfState.of(["x", "y", "z"])
    hs, cs = st.initial_state()
    assert (hs.term, hs.commit) == (1, 1)
    assert cs.voters == {"x", "y", "z"}
    with pytest.raises(InvalidArgumentError, match="empty storage"):
        from pyspark_kudu.consensus.raft_storage import bootstrap

        bootstrap(st, ["x"])


def test_read_lease_needs_check_quorum_and_lapses_without_heartbeat_answers() -> None:
    """Thesis §6.4.1: the leader may read locally only while a quorum recently heard it."""
    group = LocalGroup(["a", "b", "c"], seed=17, check_quorum=True)
    lead = group.elect()
    group.tick(2)  # heartbeats sent and answered
    assert lead.has_read_lease()
    others = [i for i in ("a", "b", "c") if i != lead.id]
    group.crash(others[0])
    group.crash(others[1])
    for _ in range(lead._cfg.election_tick // 2 + 1):
        group.tick()
    assert not lead.has_read_lease()
    plain = LocalGroup(["a", "b", "c"], seed=17)
    assert not plain.elect().has_read_lease()  # without check-quorum there is no lease
