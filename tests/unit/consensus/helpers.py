"""Small builders shared by the consensus tests (etcd ``raft_paper_test.go`` style).

``Peer`` is one ``RaftNode`` over its ``MemoryStorage`` with the application's side of the
``Ready`` contract; tests step crafted messages into it and read what it sends. Multi-node
tests use :class:`pyspark_kudu.consensus.sim.Cluster`, whose checker validates every step.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark_kudu.consensus import (
    Config,
    ConfState,
    Entry,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    RaftNode,
    Role,
)
from pyspark_kudu.consensus.sim import Cluster

MT = MessageType
IDS3 = ("n1", "n2", "n3")


def ents(*terms: int, start: int = 1) -> list[Entry]:
    """Entries with the given terms at consecutive indexes from ``start`` (empty payloads)."""
    return [Entry(term=t, index=start + i) for i, t in enumerate(terms)]


def storage(
    voters: Sequence[str] = IDS3,
    learners: Sequence[str] = (),
    log: Iterable[Entry] = (),
    term: int = 0,
    vote: str = "",
    commit: int = 0,
) -> MemoryStorage:
    """Storage with the configuration in its (index 0) snapshot, like etcd's test storage."""
    st = MemoryStorage(ConfState.of(list(voters), list(learners)))
    st.append(list(log))
    st.set_hard_state(HardState(term, vote, commit))
    return st


class Peer:
    """One node plus the application loop: persist, send (collect), apply, advance."""

    def __init__(
        self,
        node_id: str = "n1",
        st: MemoryStorage | None = None,
        *,
        election: int = 10,
        heartbeat: int = 1,
        pre_vote: bool = False,
        check_quorum: bool = False,
        seed: int = 0,
        max_size_per_msg: int | None = 1 << 20,
    ) -> None:
        self.id = node_id
        self.storage = st if st is not None else storage()
        self.node = RaftNode(Config(
            id=node_id, storage=self.storage, election_tick=election, heartbeat_tick=heartbeat,
            pre_vote=pre_vote, check_quorum=check_quorum, rng=random.Random(seed),
            max_size_per_msg=max_size_per_msg,
        ))
        self.applied: list[Entry] = []

    def read(self) -> list[Message]:
        """Handle every pending Ready; return the messages they carried."""
        out: list[Message] = []
        while self.node.has_ready():
            rd = self.node.ready()
            if rd.snapshot is not None:
                self.storage.apply_snapshot(rd.snapshot)
            self.storage.append(rd.entries)
            if rd.hard_state is not None:
                self.storage.set_hard_state(rd.hard_state)
            out.extend(rd.messages)
            self.applied.extend(rd.committed_entries)
            self.node.advance(rd)
            if self.node.conf_state != self.storage.initial_state()[1]:
                self.storage.set_conf_state(self.node.conf_state)
        return out

    def step(self, *msgs: Message) -> list[Message]:
        for m in msgs:
            self.node.step(m)
        return self.read()

    def tick(self, n: int = 1) -> list[Message]:
        out: list[Message] = []
        for _ in range(n):
            self.node.tick()
            out += self.read()
        return out

    def log(self) -> list[tuple[int, int]]:
        """The persisted log as ``(term, index)`` pairs."""
        st = self.storage
        return [(e.term, e.index) for e in st.entries(st.first_index(), st.last_index() + 1)] \
            if st.last_index() >= st.first_index() else []

    def elect(self, voters: Sequence[str] = IDS3) -> list[Message]:
        """Campaign and collect a majority of grants; returns the leader's first messages."""
        self.read()
        self.node.campaign()
        self.read()
        term = self.node.term
        others = [v for v in voters if v != self.id]
        out: list[Message] = []
        for v in others[: len(voters) // 2]:
            out += self.step(Message(MT.VOTE_RESP, to=self.id, frm=v, term=term))
        assert self.node.role == Role.LEADER, self.node
        return out


def of_type(msgs: Iterable[Message], t: MessageType) -> list[Message]:
    return [m for m in msgs if m.type == t]


def cluster(ids: Sequence[str] = IDS3, *, lead: str | None = "n1", **kw: Any) -> Cluster:
    """A bootstrapped cluster; with ``lead``, that node campaigns and its no-op commits."""
    c = Cluster(list(ids), **kw)
    if lead is not None:
        c.campaign(lead)
        c.drain()
        assert c.leader() == lead
    return c


def log_of(c: Cluster, nid: str) -> list[tuple[int, int]]:
    st = c.hosts[nid].storage
    if st.last_index() < st.first_index():
        return []
    return [(e.term, e.index) for e in st.entries(st.first_index(), st.last_index() + 1)]
