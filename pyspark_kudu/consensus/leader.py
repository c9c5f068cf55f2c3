"""The leader's side of replication, split from :mod:`.raft` to keep modules small.

``LeaderSide`` is a mixin of :class:`~pyspark_kudu.consensus.raft.RaftNode` (its methods
take ``self``): handling of followers' responses, AppendEntries/heartbeat/snapshot
sending under the progress state machine of :mod:`.progress`, commit counting (only
current-term entries, Raft §5.4.2; the leader counts itself only for persisted entries,
rule 3 of :mod:`.raft`), leadership transfer (thesis §3.10) and the read lease
(thesis §6.4.1).

Thread-safety: as ``RaftNode`` (not thread-safe).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark_kudu.consensus.messages import NONE, Message, MessageType
from pyspark_kudu.consensus.progress import ProgressState
from pyspark_kudu.consensus.types import Role
from pyspark_kudu.errors import CompactedError, ConsensusError

if TYPE_CHECKING:
    from pyspark_kudu.consensus.progress import ProgressTracker
    from pyspark_kudu.consensus.raft_log import RaftLog
    from pyspark_kudu.consensus.types import Config

__all__ = ["LeaderSide"]

_MT = MessageType


class LeaderSide:
    """Leader-side methods of ``RaftNode`` (see the module docstring).

    The state below is ``RaftNode``'s; the three methods at the end are implemented there.
    """

    id: str
    term: int
    role: Role
    log: RaftLog
    _cfg: Config
    _tracker: ProgressTracker
    _ticks: int
    _lead_transferee: str
    _election_elapsed: int

    def _send(self, m: Message, keep_frm: bool = False) -> None: ...

    def _become_follower(self, term: int, lead: str) -> None: ...

    def _leader_append(self, m: Message) -> None: ...

    def has_read_lease(self) -> bool:
        """True while this leader may serve linearizable reads without a log round.

        Leader lease (thesis §6.4.1): with check-quorum on, a follower ignores vote requests
        for one election timeout after hearing from its leader, so no other leader can be
        elected within that time of a quorum having heard from this one. Time is counted
        from the *send* tick of heartbeats a quorum answered (echoed in the response), and
        the lease is half an election timeout, as margin for ticks that run at slightly
        different rates on different machines. Always False without check-quorum.
        """
        if self.role != Role.LEADER or not self._cfg.check_quorum:
            return False
        voters = self._tracker.voters
        if not voters:
            return False
        contacts = sorted(
            (self._ticks if v == self.id else self._tracker.progress[v].last_contact
             for v in voters), reverse=True)
        oldest_in_quorum = contacts[self._tracker.quorum() - 1]
        return self._ticks - oldest_in_quorum < max(1, self._cfg.election_tick // 2)

    def _step_leader(self, m: Message) -> None:
        match m.type:
            case _MT.BEAT:
                self._bcast_heartbeat()
                return
            case _MT.CHECK_QUORUM:
                if not self._tracker.quorum_active(self.id):
                    self._become_follower(self.term, NONE)
                for pid, other in self._tracker.progress.items():
                    if pid != self.id:
                        other.recent_active = False
                return
            case _MT.PROP:
                self._leader_append(m)
                return
            case _:
                pass
        pr = self._tracker.progress.get(m.frm)
        if pr is None:
            return
        match m.type:
            case _MT.APP_RESP:
                pr.recent_active = True
                if m.reject:
                    hint = m.reject_hint
                    if m.log_term > 0:
                        # Fast backtracking: skip every entry of ours whose term exceeds the
                        # follower's term at ``hint``; they cannot match.
                        hint, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
                    if pr.maybe_decr_to(m.index, hint):
                        if pr.state == ProgressState.REPLICATE:
                            pr.become_probe()
                        self._send_append(m.frm)
                    return
                old_paused = pr.is_paused()
                if not pr.maybe_update(m.index):
                    return
                if pr.state == ProgressState.PROBE:
                    pr.become_replicate()
                elif pr.state == ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
                    pr.become_probe()
                    pr.become_replicate()
                elif pr.state == ProgressState.REPLICATE:
                    pr.inflights.free_le(m.index)
                if self._maybe_commit():
                    self._bcast_append()
                elif old_paused:
                    self._send_append(m.frm)
                while self._maybe_send_append(m.frm, send_if_empty=False):
                    pass
                if m.frm == self._lead_transferee and pr.match == self.log.last_index():
                    self._send(Message(_MT.TIMEOUT_NOW, to=m.frm))
            case _MT.HEARTBEAT_RESP:
                pr.recent_active = True
                # The heartbeat's send tick, echoed back: the follower heard from us no
                # earlier than that, which is what its vote-refusal window counts from.
                if m.context.isdigit():
                    pr.last_contact = max(pr.last_contact, int(m.context))
                pr.probe_sent = False
                if pr.state == ProgressState.REPLICATE and pr.inflights.full():
                    pr.inflights.reset()
                if pr.match < self.log.last_index():
                    self._send_append(m.frm)
            case _MT.SNAP_STATUS:
                if pr.state != ProgressState.SNAPSHOT:
                    return
                if m.reject:
                    pr.pending_snapshot = 0
                pr.become_probe()
                # Wait for the next heartbeat response before probing again.
                pr.probe_sent = True
            case _MT.UNREACHABLE:
                if pr.state == ProgressState.REPLICATE:
                    pr.become_probe()
            case _MT.TRANSFER_LEADER:
                self._handle_transfer_leader(m.frm)
            case _:
                pass

    def _self_persisted(self) -> None:
        """Our own log reached durable state: count ourselves toward commit (rule 3)."""
        me = self._tracker.progress.get(self.id)
        if me is None:
            return
        stable_last = self.log.unstable.offset - 1
        if me.maybe_update(stable_last) and self._maybe_commit():
            self._bcast_append()

    def _maybe_commit(self) -> bool:
        return self.log.maybe_commit(self._tracker.committed(), self.term)

    def _bcast_append(self) -> None:
        for pid in sorted(self._tracker.progress):
            if pid != self.id:
                self._send_append(pid)

    def _bcast_heartbeat(self) -> None:
        for pid in sorted(self._tracker.progress):
            if pid == self.id:
                continue
            pr = self._tracker.progress[pid]
            # Never tell a follower to commit past what it is known to hold.
            commit = min(pr.match, self.log.committed)
            self._send(Message(_MT.HEARTBEAT, to=pid, commit=commit,
                               context=str(self._ticks).encode()))

    def _send_append(self, to: str) -> None:
        self._maybe_send_append(to, send_if_empty=True)

    def _maybe_send_append(self, to: str, send_if_empty: bool) -> bool:
        pr = self._tracker.progress[to]
        if pr.is_paused():
            return False
        prev_index = pr.next - 1
        try:
            prev_term = self.log.term(prev_index)
            ents = self.log.entries_from(pr.next, self._cfg.max_size_per_msg)
        except CompactedError:
            return self._send_snapshot(to)
        if not ents and not send_if_empty:
            return False
        self._send(
            Message(_MT.APP, to=to, index=prev_index, log_term=prev_term,
                    entries=tuple(ents), commit=self.log.committed)
        )
        if ents and pr.state == ProgressState.REPLICATE:
            last = ents[-1].index
            pr.optimistic_update(last)
            pr.inflights.add(last)
        elif pr.state == ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, to: str) -> bool:
        pr = self._tracker.progress[to]
        if not pr.recent_active:
            return False  # do not ship a tablet copy to a peer that may be down
        snap = self.log.snapshot()
        if snap.is_empty():
            raise ConsensusError(
                f"{self.id}: entries for {to} are compacted but no snapshot exists"
            )
        self._send(Message(_MT.SNAP, to=to, snapshot=snap))
        pr.become_snapshot(snap.metadata.index)
        return True

    def _handle_transfer_leader(self, transferee: str) -> None:
        pr = self._tracker.progress.get(transferee)
        if pr is None or pr.is_learner:
            return
        if self._lead_transferee != NONE:
            if self._lead_transferee == transferee:
                return
            self._lead_transferee = NONE
        if transferee == self.id:
            return
        # The transfer must finish within one election timeout, else it is aborted (§3.10).
        self._election_elapsed = 0
        self._lead_transferee = transferee
        if pr.match == self.log.last_index():
            self._send(Message(_MT.TIMEOUT_NOW, to=transferee))
        else:
            self._send_append(transferee)

    def _bcast_append_new_members(self) -> None:
        for pid in sorted(self._tracker.progress):
            pr = self._tracker.progress[pid]
            if pid != self.id and pr.match == 0 and not pr.probe_sent:
                self._send_append(pid)
