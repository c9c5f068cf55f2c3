"""The leader's view of each peer (``Progress``) and quorum arithmetic (``ProgressTracker``).

A peer's replication goes through three states (etcd-io/raft ``tracker``):

==========  ================================================================================
PROBE       we do not know the peer's log; send one AppendEntries per heartbeat interval
            and wait for an answer (``probe_sent``) before sending another.
REPLICATE   the peer is caught up to ``match``; stream entries optimistically, bounded by
            ``Inflights`` so a slow peer cannot absorb unbounded memory.
SNAPSHOT    the entries the peer needs are compacted; a snapshot (for tablets: a tablet
            copy) is in flight and nothing else is sent until it is reported done/failed.
==========  ================================================================================

Quorum rules: only voters count, for commit (the ``match`` a majority has reached) and for
elections. Learners (Kudu's NON_VOTERs) have a ``Progress`` and receive the log, nothing more.

Thread-safety: not thread-safe; owned by one ``RaftNode``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from pyspark_kudu.consensus.messages import ConfState

__all__ = ["Inflights", "Progress", "ProgressState", "ProgressTracker", "VoteResult"]


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


class Inflights:
    """Last indexes of AppendEntries sent but not yet acknowledged, at most ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._q: deque[int] = deque()

    def add(self, last_index: int) -> None:
        self._q.append(last_index)

    def free_le(self, index: int) -> None:
        while self._q and self._q[0] <= index:
            self._q.popleft()

    def full(self) -> bool:
        return len(self._q) >= self.capacity

    def reset(self) -> None:
        self._q.clear()

    def __len__(self) -> int:
        return len(self._q)


@dataclass
class Progress:
    """Replication progress of one peer, as tracked by the leader."""

    match: int
    next: int
    inflights: Inflights
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False
    pending_snapshot: int = 0
    recent_active: bool = False
    is_learner: bool = False
    last_contact: int = -(1 << 62)  # leader's tick of this peer's last response (read lease)

    def _reset_state(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        # After a snapshot we resume right after it; otherwise after what we know matches.
        if self.state == ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def maybe_update(self, n: int) -> bool:
        """An ack for index ``n``; True if ``match`` advanced."""
        updated = False
        if self.match < n:
            self.match = n
            updated = True
            self.probe_sent = False
        self.next = max(self.next, n + 1)
        return updated

    def optimistic_update(self, n: int) -> None:
        self.next = n + 1

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the probe at ``rejected``; back off to ``match_hint + 1``.

        Returns False for a stale rejection (one about an index we already moved past).
        """
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.probe_sent
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True


class ProgressTracker:
    """Progress of every member plus the votes of the current election."""

    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self.voters: frozenset[str] = frozenset()
        self.learners: frozenset[str] = frozenset()
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}

    def conf_state(self) -> ConfState:
        return ConfState(self.voters, self.learners)

    def apply_conf(self, cs: ConfState, last_index: int) -> None:
        """Adopt configuration ``cs``; new members start probing after ``last_index``."""
        self.voters = cs.voters
        self.learners = cs.learners
        for node in list(self.progress):
            if node not in cs.members():
                del self.progress[node]
        for node in cs.members():
            pr = self.progress.get(node)
            if pr is None:
                pr = Progress(match=0, next=last_index + 1, inflights=Inflights(self.max_inflight))
                # Treat new members as active so check-quorum does not depose the leader
                # before they had a chance to answer.
                pr.recent_active = True
                self.progress[node] = pr
            pr.is_learner = node in cs.learners

    def is_singleton(self) -> bool:
        return len(self.voters) == 1

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def committed(self) -> int:
        """The largest index a majority of voters have durably matched."""
        if not self.voters:
            return 0
        matches = sorted((self.progress[v].match for v in self.voters), reverse=True)
        return matches[self.quorum() - 1]

    def quorum_active(self, self_id: str) -> bool:
        active = sum(
            1 for v in self.voters if v == self_id or self.progress[v].recent_active
        )
        return active >= self.quorum()

    def reset_votes(self) -> None:
        self.votes = {}

    def record_vote(self, node: str, granted: bool) -> None:
        self.votes.setdefault(node, granted)

    def tally_votes(self) -> tuple[int, int, VoteResult]:
        granted = sum(1 for v in self.voters if self.votes.get(v) is True)
        rejected = sum(1 for v in self.voters if self.votes.get(v) is False)
        q = self.quorum()
        if granted >= q:
            return granted, rejected, VoteResult.WON
        if len(self.voters) - rejected < q:
            return granted, rejected, VoteResult.LOST
        return granted, rejected, VoteResult.PENDING
