"""§4.1 with the tablet driver's early apply: the next configuration change is proposed as
soon as the previous one is committed, before the leader's host recorded the commit or the
followers heard of it (``Cluster.lazy_commit``, modelling ``TabletLeader.apply_ahead``).

Safe because the carried commit index is persisted ahead of anything proposed after it:
no replica ever holds two configuration changes above its commit index (checked by the
simulator after every persisted Ready). A driver that forgets it is caught.
"""

from __future__ import annotations

import pytest

from pyspark_kudu.consensus.messages import ConfChange, ConfChangeType
from pyspark_kudu.consensus.sim import Cluster
from pyspark_kudu.consensus.sim_checks import InvariantViolation
from pyspark_kudu.consensus.sim_run import simulate


def _replace_c_by_d(c: Cluster) -> None:
    """3-4-3 at leader a: add d as a learner, promote it, and evict c the moment the
    leader's node applied the promotion (nothing delivered or persisted in between)."""
    c.campaign("a")
    c.drain()
    c.start("d")
    assert c.propose_conf_change("a", ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    c.drain()
    assert c.propose_conf_change("a", ConfChange(ConfChangeType.ADD_VOTER, "d"))
    promoted = c.node("a").log.last_index()
    for _ in range(1000):  # one message at a time until the leader applies the promotion
        if c.node("a").log.applied >= promoted:
            break
        f = c._pop_due(fifo=True)
        assert f is not None, c.describe()
        c.deliver(f)
    assert c.propose_conf_change("a", ConfChange(ConfChangeType.REMOVE, "c"))
    c.drain()


def test_s4_1_a_change_proposed_once_the_previous_is_committed_at_the_leader_is_safe() -> None:
    c = Cluster(["a", "b", "c"], spares=["d"])
    c.lazy_commit = 1.0
    _replace_c_by_d(c)
    assert c.stats["carried_commits"] > 0
    c.run(3)  # heartbeats carry the last commit notice
    assert c.node("a").conf_state.voters == {"a", "b", "d"}
    assert c.checker.conf.voters == {"a", "b", "d"}
    c.crash("c")
    assert c.one(b"after", 3) > 0


def test_s4_1_recording_the_carried_commit_after_the_next_change_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken driver: it persists the carried commit index on the leader's host after
    the next Ready's entries, so that host holds the promotion and the eviction both above
    its commit index -- restarted there, a leader would count in a configuration two
    changes old."""
    handle, flush = Cluster.handle_ready, Cluster.flush_carried

    def late(self: Cluster, nid: str) -> bool:
        h = self.hosts[nid]
        carried, h.carried = h.carried, None
        done = handle(self, nid)
        if carried is not None:
            newer, h.carried = h.carried, carried
            if done:  # the next Ready went first: now the carried commit index
                flush(self, nid)
                h.carried = newer
        return done

    monkeypatch.setattr(Cluster, "handle_ready", late)
    c = Cluster(["a", "b", "c"], spares=["d"])
    c.lazy_commit = 1.0
    with pytest.raises(InvariantViolation, match="one change at a time"):
        _replace_c_by_d(c)


def test_seeded_histories_with_carried_commits_stay_safe() -> None:
    ran = 0
    for seed in range(12):
        res = simulate(seed, 3, 800)
        if res.knobs.lazy_commit > 0:
            ran += 1
            assert res.stats["carried_commits"] > 0, res.summary()
    assert ran >= 3
