"""Defects of the Raft core found by the simulator, each shrunk to a minimal scenario.

Every test here states the property the core should have; a failing test is an open bug
in ``pyspark_kudu/consensus/`` (the docstring says how it was found and suggests a fix).
Fixed ones stay as regression tests.
"""

from __future__ import annotations

import pytest

from pyspark_kudu.consensus import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    Message,
    Role,
    Snapshot,
    SnapshotMetadata,
    encode_conf_change,
)
from pyspark_kudu.consensus.sim import Cluster
from pyspark_kudu.consensus.sim_checks import InvariantViolation

from .helpers import MT, Peer, storage


def test_a_re_added_replica_replaying_the_bootstrap_entries_cannot_elect_itself() -> None:
    """Fixed in 3dc2884 (single BOOTSTRAP entry). Found by the sweep: seed 250 (3 nodes, 3000
    steps) of an early simulator version, seed 13249 of a later one.

    ``storage.bootstrap`` wrote the founding configuration as one ``ADD_VOTER`` entry per
    founder. A replica that joins with empty storage replays them one by one, so after
    applying entry 1 (``ADD_VOTER n1``) it believes the configuration is ``{n1}``. That is
    harmless for a new id, but a founder re-added under its old id (Kudu re-adds a replica on
    the same tablet server after a tablet copy) is then the sole voter of its own config and
    elects itself: two leaders commit different entries at index 2.

    Fix suggestions: bootstrap with a single entry that carries the whole configuration
    (Kudu's CHANGE_CONFIG_OP carries the full new config), or have joiners start from the
    leader's snapshot/tablet copy and its committed config instead of an empty one.
    """
    c = Cluster(["n1", "n2", "n3"], max_size_per_msg=1)  # one entry per AppendEntries
    c.campaign("n2")
    c.drain()
    assert c.propose_conf_change("n2", ConfChange(ConfChangeType.REMOVE, "n1"))
    c.run(2)
    c.crash("n1")
    c.tombstone("n1")  # a fresh, empty replica under the old id
    c.start("n1")
    # n1 gets entry 1 (ADD_VOTER n1, committed) and then loses contact with the leader.
    c.filters.append(lambda m: not (
        m.to == "n1" and m.type == MT.APP and any(e.index >= 2 for e in m.entries)))
    assert c.propose_conf_change("n2", ConfChange(ConfChangeType.ADD_LEARNER, "n1"))
    c.run(2)
    assert c.hosts["n1"].storage.last_index() == 1
    c.isolate("n1")
    try:
        c.run(40)
    except InvariantViolation as e:
        raise AssertionError(f"n1 elected itself from a half-replayed bootstrap: {e}") from e
    assert c.node("n1").role != Role.LEADER, c.node("n1").conf_state


def test_a_snapshot_restored_between_ready_and_advance_keeps_its_configuration() -> None:
    """Fixed in 3dc2884. etcd's ``Node`` steps messages while a ``Ready`` is outstanding; so
    may ours (the simulator's ``split_ready`` knob does it).

    A follower holds a ``Ready`` whose committed entries contain ``ADD_LEARNER n4`` (index 2)
    when a snapshot at index 5 arrives whose configuration no longer has n4. ``advance`` used
    to apply the stale change on top of the snapshot's configuration, and the replica kept
    ``n4`` as a learner forever (applied 5, configuration not the one at 5).
    """
    p = Peer("n2", storage(["n1", "n2", "n3"], term=1))
    add_n4 = Entry(1, 2, EntryType.CONF_CHANGE,
                   encode_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n4")))
    p.node.step(Message(MT.APP, to="n2", frm="n1", term=1, index=0, log_term=0,
                        entries=(Entry(1, 1), add_n4), commit=2))
    rd = p.node.ready()
    p.storage.append(rd.entries)
    assert rd.hard_state is not None
    p.storage.set_hard_state(rd.hard_state)
    assert [e.index for e in rd.committed_entries] == [1, 2]
    snap = Snapshot(SnapshotMetadata(5, 1, ConfState.of(["n1", "n2", "n3"])), b"copy")
    p.node.step(Message(MT.SNAP, to="n2", frm="n1", term=1, snapshot=snap))
    p.node.advance(rd)
    p.read()
    assert p.node.status().applied == 5
    assert p.node.conf_state == ConfState.of(["n1", "n2", "n3"])


def test_re_added_replicas_replaying_an_old_configuration_cannot_elect_each_other() -> None:
    """Fixed by raft.py rule 6 (no campaign before applying one's own ADD_VOTER); ids reused
    after a wipe remain unsupported (the runtime uses incarnation ids). The single BOOTSTRAP
    entry fixed the case of one re-added founder, not of two
    (found by reasoning about that fix; the sweep can reach it only rarely: two tombstoned
    founders must be cut off together right after entry 1).

    A replica re-added under an old id starts from empty storage (joiners do) and replays
    the log from index 1, so for a while it believes in *old* configurations, in which it was
    a voter. Founders {n1, n2, n3} become {n1, n4, n5}; n2 and n3 are removed, tombstoned and
    re-added as learners. Cut off after entry 1, both think the configuration is
    {n1, n2, n3}: n3 campaigns, n2 (whose log is just as short) grants, and n3 leads a new
    term, commits its no-op at index 2 with n2 and applies it where the group committed
    another entry. Raft assumes a voter never forgets its log; an id reused after a wipe
    breaks that. Fixes: seed a joiner from the leader's snapshot (a tablet copy, as Kudu does)
    so it never applies a configuration older than the one that added it; or give a joiner
    the index of the change that added it and keep it unpromotable until it applied that
    index; or keep a tombstone's last log position for the vote check (Kudu's tombstoned
    voting); or never reuse an id.
    """
    c = Cluster(["n1", "n2", "n3"], spares=["n4", "n5"], max_size_per_msg=1)
    c.campaign("n1")
    c.drain()

    def change(t: ConfChangeType, nid: str) -> None:
        assert c.propose_conf_change("n1", ConfChange(t, nid)), (t, nid)
        c.run(3)

    for nid in ("n4", "n5"):
        c.start(nid)
        change(ConfChangeType.ADD_LEARNER, nid)
        change(ConfChangeType.ADD_VOTER, nid)
    change(ConfChangeType.REMOVE, "n2")
    change(ConfChangeType.REMOVE, "n3")
    for nid in ("n2", "n3"):
        c.crash(nid)
        c.tombstone(nid)
        c.start(nid)
    c.filters.append(lambda m: not (
        m.to in ("n2", "n3") and m.type == MT.APP and any(e.index >= 2 for e in m.entries)))
    change(ConfChangeType.ADD_LEARNER, "n2")
    change(ConfChangeType.ADD_LEARNER, "n3")
    assert c.node("n2").conf_state == ConfState.of(["n1", "n2", "n3"])  # entry 1 only
    c.partition(["n1", "n4", "n5"], ["n2", "n3"])
    try:
        c.run(60)
    except InvariantViolation as e:
        raise AssertionError(f"a re-added replica led with a stale configuration: {e}") from e
    assert Role.LEADER not in (c.node("n2").role, c.node("n3").role)


@pytest.mark.parametrize("local", [MT.HUP, MT.CHECK_QUORUM], ids=lambda t: t.value)
def test_step_drops_local_only_messages_that_arrive_from_a_peer(local: MT) -> None:
    """Fixed: public ``step`` drops local-only kinds and proposals.
    ``step`` is for peer messages, and irrelevant ones must be dropped (the API
    contract; etcd's ``RawNode.Step`` returns ErrStepLocalMsg). Today a HUP from the wire
    forces an election and two CHECK_QUORUMs depose a healthy leader.
    Fix: public ``step`` refuses ``is_local_message`` types (messages.py already has the
    predicate); ``tick``/``campaign``/``report_*`` use an internal entry point.
    """
    p = Peer("n1", storage(term=1), check_quorum=True)
    p.elect()
    p.step(Message(MT.APP_RESP, to="n1", frm="n2", term=2, index=1))
    for _ in range(2):
        p.step(Message(local, to="n1", frm="n2", term=0))
    assert (p.node.role, p.node.term) == (Role.LEADER, 2)
    q = Peer("n2", storage(term=1))
    q.step(Message(local, to="n2", frm="n3", term=0))
    assert (q.node.role, q.node.term) == (Role.FOLLOWER, 1)


def test_a_proposal_arriving_through_step_respects_the_one_pending_change_rule() -> None:
    """Fixed: ``step`` drops PROP (proposals only enter through ``propose*``).
    ``propose_conf_change`` refuses a second pending change, but a PROP message
    stepped in (a forwarded proposal) goes straight to ``_leader_append``: two unapplied
    configuration changes end up in the log, breaking one-by-one membership (thesis §4.1).
    Fix: refuse PROP from peers (followers never forward here), or apply the same checks.
    """
    p = Peer("n1", storage(term=1))
    p.elect()
    p.step(Message(MT.APP_RESP, to="n1", frm="n2", term=2, index=1))
    p.node.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n4"))
    p.read()
    remove = Entry(0, 0, EntryType.CONF_CHANGE,
                   encode_conf_change(ConfChange(ConfChangeType.REMOVE, "n3")))
    p.step(Message(MT.PROP, to="n1", frm="n2", term=0, entries=(remove,)))
    st = p.storage
    kinds = [e.type for e in st.entries(st.first_index(), st.last_index() + 1)]
    assert kinds.count(EntryType.CONF_CHANGE) == 1
