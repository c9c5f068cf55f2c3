"""An in-process, lossless driver for a group of ``RaftNode``s (demo, benchmark, embedded use).

``LocalGroup`` plays the application's part of the ``Ready`` contract for every node: persist
to the node's storage, deliver messages to the other nodes in order, apply committed entries.
It is the friendly counterpart of the simulator (:mod:`pyspark_kudu.consensus.sim`, the
cluster model, driven by :mod:`pyspark_kudu.consensus.sim_run`'s adversary: drops, reorders,
partitions, crashes), which checks safety invariants.

Storage is any ``WritableStorage`` (empty; the group bootstraps it); the default makes a
``MemoryStorage`` per node.

Thread-safety: not thread-safe.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from pyspark_kudu.consensus.messages import (
    EntryType,
    Message,
)
from pyspark_kudu.consensus.raft import Config, RaftNode, Role
from pyspark_kudu.consensus.raft_storage import MemoryStorage, WritableStorage, bootstrap
from pyspark_kudu.errors import IllegalStateError

__all__ = ["LocalGroup"]


class LocalGroup:
    """N nodes on a perfect in-process network. ``applied[id]`` is each node's state machine."""

    def __init__(
        self,
        ids: list[str],
        seed: int = 0,
        storage_factory: Callable[[str], WritableStorage] | None = None,
        **config: object,
    ) -> None:
        self._rng = random.Random(seed)
        self._factory = storage_factory or (lambda _id: MemoryStorage())
        self._config = config
        self.storages: dict[str, WritableStorage] = {i: self._factory(i) for i in ids}
        for st in self.storages.values():
            bootstrap(st, ids)
        self.nodes: dict[str, RaftNode] = {}
        self.applied: dict[str, list[bytes]] = {i: [] for i in ids}
        self.down: set[str] = set()
        for i in ids:
            self._start(i)

    def _start(self, node_id: str) -> None:
        cfg = Config(id=node_id, storage=self.storages[node_id],
                     rng=random.Random(self._rng.random()), **self._config)  # type: ignore[arg-type]
        self.nodes[node_id] = RaftNode(cfg)
        self.applied[node_id] = []  # replayed from storage (applied=0)

    # -- driving -----------------------------------------------------------------------------
    def pump(self, max_rounds: int = 10_000) -> int:
        """Process Readies and deliver messages until quiet; returns messages delivered."""
        delivered = 0
        inbox: deque[Message] = deque()
        for _ in range(max_rounds):
            progressed = False
            for nid, node in self.nodes.items():
                if nid in self.down or not node.has_ready():
                    continue
                progressed = True
                rd = node.ready()
                st = self.storages[nid]
                if rd.snapshot is not None:
                    st.apply_snapshot(rd.snapshot)
                if rd.entries:
                    st.append(rd.entries)
                if rd.hard_state is not None:
                    st.set_hard_state(rd.hard_state)
                inbox.extend(rd.messages)
                for e in rd.committed_entries:
                    if e.type == EntryType.NORMAL and e.data:
                        self.applied[nid].append(e.data)
                before = node.conf_state
                node.advance(rd)
                if node.conf_state != before:
                    st.set_conf_state(node.conf_state)
            while inbox:
                m = inbox.popleft()
                if m.to in self.nodes and m.to not in self.down:
                    self.nodes[m.to].step(m)
                    delivered += 1
                    progressed = True
            if not progressed:
                return delivered
        raise IllegalStateError(f"group did not quiesce within {max_rounds} rounds")

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            for nid, node in self.nodes.items():
                if nid not in self.down:
                    node.tick()
            self.pump()

    def leader(self) -> RaftNode | None:
        leaders = [n for i, n in self.nodes.items() if i not in self.down and n.role == Role.LEADER]
        return max(leaders, key=lambda n: n.term) if leaders else None

    def elect(self, max_ticks: int = 1000) -> RaftNode:
        """Tick until a live leader exists whose no-op is committed; return it."""
        for _ in range(max_ticks):
            lead = self.leader()
            if lead is not None and lead.commit_index >= lead.log.last_index():
                return lead
            self.tick()
        raise IllegalStateError(f"no leader elected within {max_ticks} ticks")

    def crash(self, node_id: str) -> None:
        """Stop a node: it loses its in-memory state, keeps what its storage persisted."""
        self.down.add(node_id)

    def restart(self, node_id: str) -> None:
        self.down.discard(node_id)
        self._start(node_id)
        self.pump()
