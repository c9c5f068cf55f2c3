"""A sans-IO Raft node, modelled on etcd-io/raft's ``RawNode``.

Rules of this module:

1. No I/O, no threads, no clocks. Inputs are :meth:`RaftNode.tick` (a logical clock tick),
   :meth:`RaftNode.step` (a message from a peer) and the proposal / control calls. Output is a
   :class:`Ready` drained with :meth:`RaftNode.ready` and acknowledged with
   :meth:`RaftNode.advance`.
2. Terms are checked once, role-independently, in :meth:`RaftNode.step` (Raft Fig. 2 "Rules for
   all servers"); role behaviour lives in ``_step_leader`` / ``_step_candidate`` /
   ``_step_follower``, swapped on ``_become_*``, each one ``match`` on the message type.
3. Durability is the caller's: a ``Ready``'s hard state and entries must be persisted before
   its messages are sent. A leader counts *itself* toward a commit quorum only for entries it
   has persisted (acknowledged through ``advance``), so "committed" always means "durable on
   a majority of voters" (DESIGN §3).
4. A leader commits only entries of its own term by counting replicas (Raft §5.4.2); older
   entries commit indirectly. A new leader appends an empty no-op to get there quickly.
5. Membership changes go one server at a time (Raft thesis §4.1), at most one pending: the
   next one is refused until the previous entry is applied, and a new leader accepts none
   until its no-op is applied (the fix for the single-server change bug, Ongaro 2015).
   A configuration takes effect when its entry is *applied* (etcd's choice), see ``advance``.

6. A replica that starts without being a voter in its durable configuration (a joiner, or
   one re-created under an old id after its data was lost) does not campaign until it has
   applied the ``ADD_VOTER`` of itself, or installed a snapshot in which it is a voter:
   replaying the log from index 1 it would otherwise campaign in old configurations (found
   by the simulator). It still grants votes (a lagging voter's vote may be needed to elect
   the leader that will catch it up). Raft assumes a voter never forgets its log, so the
   runtime must not reuse a replica id after wiping its data: a re-created replica gets a
   new incarnation id (documented requirement for re-replication).

Extensions that are switchable: pre-vote (thesis §9.6) and check-quorum (thesis §6.2).

Thread-safety: not thread-safe. One owner drives a node; wrap it in a lock to share it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark_kudu.consensus.confchange import apply_conf_change, check_conf_change
from pyspark_kudu.consensus.leader import LeaderSide
from pyspark_kudu.consensus.messages import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    decode_conf_change,
    encode_conf_change,
    is_local_message,
)
from pyspark_kudu.consensus.progress import ProgressState, ProgressTracker, VoteResult
from pyspark_kudu.consensus.raft_log import RaftLog
from pyspark_kudu.consensus.types import Config, Ready, Role, SoftState, Status
from pyspark_kudu.errors import (
    CompactedError,
    ConsensusError,
    ProposalDroppedError,
)

__all__ = ["Config", "RaftNode", "Ready", "Role", "SoftState", "Status"]  # re-exported types

_MT = MessageType
_TRANSFER_CONTEXT = b"CampaignTransfer"


class RaftNode(LeaderSide):
    """One Raft participant. See the module docstring for the rules it follows."""

    def __init__(self, config: Config) -> None:
        config.validate()
        self.id = config.id
        self._cfg = config
        self._rng = config.rng
        self.log = RaftLog(config.storage, config.max_committed_size_per_ready)
        hs, cs = config.storage.initial_state()
        self._tracker = ProgressTracker(config.max_inflight_msgs)
        self._tracker.apply_conf(cs, self.log.last_index())
        # Rule 6: a replica that starts without being a voter in its own durable
        # configuration (a joiner, or a replica re-created under an old id) may not campaign
        # until it applied the change that made it a voter.
        self._may_campaign = self.id in cs.voters
        self.term = 0
        self.vote = NONE
        self.lead = NONE
        self.role = Role.FOLLOWER
        if not hs.is_empty():
            if hs.commit < self.log.committed or hs.commit > self.log.last_index():
                raise ConsensusError(
                    f"{self.id}: persisted commit {hs.commit} is out of range "
                    f"[{self.log.committed}, {self.log.last_index()}]"
                )
            self.log.committed = hs.commit
            self.term = hs.term
            self.vote = hs.vote
        if config.applied > 0:
            self.log.applied_to(config.applied)
        self._msgs: list[Message] = []
        self._ticks = 0  # logical clock, only for the read lease
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_election_timeout = config.election_tick
        self._lead_transferee = NONE
        self._pending_conf_index = 0
        self._outstanding: Ready | None = None
        self._become_follower(self.term, NONE)
        self._prev_soft = SoftState(self.lead, self.role)
        self._prev_hard = hs

    def __repr__(self) -> str:
        return f"RaftNode({self.id}, {self.role.value}, term={self.term}, lead={self.lead!r})"

    # == public API ==========================================================================
    @property
    def conf_state(self) -> ConfState:
        return self._tracker.conf_state()

    @property
    def commit_index(self) -> int:
        return self.log.committed

    @property
    def lead_transferee(self) -> str:
        return self._lead_transferee

    def tick(self) -> None:
        """Advance the logical clock by one tick."""
        self._ticks += 1
        if self.role == Role.LEADER:
            self._tick_heartbeat()
        else:
            self._tick_election()

    def campaign(self) -> None:
        """Start an election now (a pre-vote first, if enabled).

        Ignored (as in etcd) while committed configuration changes are not yet applied: the
        configuration may change under the election. Drain ``ready()``/``advance()`` first.
        """
        self._step(Message(_MT.HUP, frm=self.id))

    def propose(self, data: bytes) -> None:
        """Append ``data`` to the log. Raises ProposalDroppedError unless we lead."""
        self._propose(Entry(0, 0, EntryType.NORMAL, data))

    def propose_batch(self, datas: Sequence[bytes]) -> None:
        """Append several entries at once: one AppendEntries per follower carries them all."""
        if datas:
            self._propose(*(Entry(0, 0, EntryType.NORMAL, d) for d in datas))

    def propose_conf_change(self, cc: ConfChange) -> None:
        """Propose a one-server membership change (validated against the current config)."""
        check_conf_change(self.conf_state, cc)
        if self.role == Role.LEADER and self._pending_conf_index > self.log.applied:
            raise ProposalDroppedError(
                f"{self.id}: a configuration change (index {self._pending_conf_index}) is still "
                f"pending (applied {self.log.applied}); propose the next one after it is applied"
            )
        self._propose(Entry(0, 0, EntryType.CONF_CHANGE, encode_conf_change(cc)))

    def transfer_leader(self, to: str) -> None:
        """Ask the leader to hand leadership to ``to`` (thesis §3.10)."""
        self._step(Message(_MT.TRANSFER_LEADER, frm=to, to=self.id))

    def report_unreachable(self, node: str) -> None:
        self._step(Message(_MT.UNREACHABLE, frm=node, to=self.id))

    def report_snapshot(self, node: str, ok: bool) -> None:
        """The application finished (or failed) sending a snapshot / tablet copy to ``node``."""
        self._step(Message(_MT.SNAP_STATUS, frm=node, to=self.id, reject=not ok))

    def status(self) -> Status:
        progress: dict[str, tuple[int, int]] = {}
        if self.role == Role.LEADER:
            progress = {k: (p.match, p.next) for k, p in sorted(self._tracker.progress.items())}
        return Status(
            self.id, self.term, self.vote, self.log.committed, self.log.applied, self.lead,
            self.role, self.conf_state, self._lead_transferee, progress,
        )

    # -- Ready / advance ---------------------------------------------------------------------
    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        return (
            SoftState(self.lead, self.role) != self._prev_soft
            or self._hard_state() != self._prev_hard
            or bool(self.log.unstable.entries)
            or self.log.unstable.snapshot is not None
            or bool(self._msgs)
            or self.log.has_next_committed()
        )

    def ready(self) -> Ready:
        """Everything the caller must persist, send and apply now. Call ``advance`` after."""
        if self._outstanding is not None:
            raise ConsensusError(f"{self.id}: ready() called again before advance()")
        soft = SoftState(self.lead, self.role)
        hard = self._hard_state()
        rd = Ready(
            soft_state=soft if soft != self._prev_soft else None,
            hard_state=hard if hard != self._prev_hard else None,
            entries=tuple(self.log.unstable_entries()),
            snapshot=self.log.unstable.snapshot,
            messages=tuple(self._msgs),
            committed_entries=tuple(self.log.next_committed()),
        )
        self._msgs = []
        self._prev_soft = soft
        self._prev_hard = hard
        self._outstanding = rd
        return rd

    def unread_committed(self) -> tuple[int, int] | None:
        """``(lo, hi)``: committed entries ``[lo, hi]`` the next ``ready`` would start
        handing out that are already in stable storage (the unstable tail is persisted by
        that ``ready`` first), or None if there are none or a snapshot is pending."""
        if self._outstanding is not None or self.log.unstable.snapshot is not None:
            return None
        lo = max(self.log.applied + 1, self.log.first_index())
        hi = min(self.log.committed, self.log.unstable.offset - 1)
        return (lo, hi) if hi >= lo else None

    def skip_committed(self, to: int) -> None:
        """Take committed entries up to ``to`` as handed out and applied without reading
        them: for a caller that leaves them to a later apply through a node rebuilt from its
        own applied index (a replica's request leaving writes to its background applier).
        Only for entries that are not configuration changes -- the caller checks -- whose
        effect on this node's configuration would be skipped with them."""
        if self._outstanding is not None:
            raise ConsensusError(f"{self.id}: skip_committed() between ready() and advance()")
        self.log.applied_to(to)

    def advance(self, rd: Ready) -> None:
        """Acknowledge that ``rd`` was persisted, sent and applied."""
        if rd is not self._outstanding:
            raise ConsensusError(f"{self.id}: advance() must be given the last Ready")
        self._outstanding = None
        if rd.snapshot is not None:
            self.log.stable_snap_to(rd.snapshot.metadata.index)
            if rd.snapshot.metadata.index > self.log.applied:
                self.log.applied_to(rd.snapshot.metadata.index)
        if rd.entries:
            last = rd.entries[-1]
            self.log.stable_to(last.index, last.term)
            if self.role == Role.LEADER:
                self._self_persisted()
        if rd.committed_entries:
            # A snapshot restored after this Ready was taken supersedes its older entries:
            # applying their configuration changes on top of the snapshot's would be wrong.
            pending = self.log.unstable.snapshot
            superseded = pending.metadata.index if pending is not None else 0
            for e in rd.committed_entries:
                if e.index <= self.log.applied or e.index <= superseded:
                    continue
                self.log.applied_to(e.index)
                if e.type == EntryType.CONF_CHANGE:
                    self._apply_conf_change(decode_conf_change(e.data))

    # == message handling ====================================================================
    def step(self, m: Message) -> None:
        """Process one message from a peer. Stale-term messages are answered or dropped (Fig. 2).

        Local-only kinds (``HUP``, ``BEAT``, ``CHECK_QUORUM``, ``UNREACHABLE``,
        ``SNAP_STATUS``) and proposals (``PROP``) are dropped: they are this node's own inputs
        (``tick``, ``campaign``, ``propose``, ``report_*``, ``broadcast_heartbeat``) and a
        peer must not be able to force an election, depose a leader or bypass the
        one-pending-change rule (etcd: ErrStepLocalMsg).
        """
        if is_local_message(m.type) or m.type == _MT.PROP:
            return
        self._step(m)

    def broadcast_heartbeat(self) -> None:
        """Leader only: send heartbeats now (a commit-only round); ignored otherwise."""
        self._step(Message(_MT.BEAT, frm=self.id))

    def _step(self, m: Message) -> None:
        if m.term == 0:
            pass  # local message
        elif m.term > self.term:
            if m.type in (_MT.VOTE, _MT.PRE_VOTE):
                force = m.context == _TRANSFER_CONTEXT
                in_lease = (
                    self._cfg.check_quorum
                    and self.lead != NONE
                    and self._election_elapsed < self._cfg.election_tick
                )
                if not force and in_lease:
                    # Thesis §4.2.3: a server that heard from a current leader within the
                    # minimum election timeout ignores vote requests (disruptive servers).
                    return
            if m.type == _MT.PRE_VOTE:
                pass  # a pre-vote never changes our term
            elif m.type == _MT.PRE_VOTE_RESP and not m.reject:
                pass  # granted pre-votes carry the future term; we bump it on winning
            elif m.type in (_MT.APP, _MT.HEARTBEAT, _MT.SNAP):
                self._become_follower(m.term, m.frm)
            else:
                self._become_follower(m.term, NONE)
        elif m.term < self.term:
            if (self._cfg.check_quorum or self._cfg.pre_vote) and m.type in (
                _MT.HEARTBEAT, _MT.APP,
            ):
                # Tell a stale leader about the newer term; otherwise, with check-quorum or
                # pre-vote, a partitioned-then-healed leader could stay stuck forever.
                self._send(Message(_MT.APP_RESP, to=m.frm))
            elif m.type == _MT.PRE_VOTE:
                self._send(Message(_MT.PRE_VOTE_RESP, to=m.frm, term=self.term, reject=True))
            return

        match m.type:
            case _MT.HUP:
                self._hup(transfer=False)
            case _MT.VOTE | _MT.PRE_VOTE:
                self._handle_vote_request(m)
            case _:
                if self.role == Role.LEADER:
                    self._step_leader(m)
                elif self.role == Role.FOLLOWER:
                    self._step_follower(m)
                else:
                    self._step_candidate(m)

    def _handle_vote_request(self, m: Message) -> None:
        can_vote = (
            self.vote == m.frm
            or (self.vote == NONE and self.lead == NONE)
            or (m.type == _MT.PRE_VOTE and m.term > self.term)
        )
        resp = _MT.VOTE_RESP if m.type == _MT.VOTE else _MT.PRE_VOTE_RESP
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # Granted responses carry the request's term (a pre-vote's future term).
            self._send(Message(resp, to=m.frm, term=m.term))
            if m.type == _MT.VOTE:
                self._election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(Message(resp, to=m.frm, term=self.term, reject=True))

    def _step_candidate(self, m: Message) -> None:
        my_resp = _MT.PRE_VOTE_RESP if self.role == Role.PRE_CANDIDATE else _MT.VOTE_RESP
        match m.type:
            case _MT.APP:
                self._become_follower(m.term, m.frm)
                self._handle_append(m)
            case _MT.HEARTBEAT:
                self._become_follower(m.term, m.frm)
                self._handle_heartbeat(m)
            case _MT.SNAP:
                self._become_follower(m.term, m.frm)
                self._handle_snapshot(m)
            case t if t == my_resp:
                self._tracker.record_vote(m.frm, not m.reject)
                _, _, result = self._tracker.tally_votes()
                if result == VoteResult.WON:
                    if self.role == Role.PRE_CANDIDATE:
                        self._campaign(pre=False, transfer=False)
                    else:
                        self._become_leader()
                        self._bcast_append()
                elif result == VoteResult.LOST:
                    self._become_follower(self.term, NONE)
            case _:
                pass  # proposals are refused by propose(); TIMEOUT_NOW ignored mid-election

    def _step_follower(self, m: Message) -> None:
        match m.type:
            case _MT.APP:
                self._election_elapsed = 0
                self.lead = m.frm
                self._handle_append(m)
            case _MT.HEARTBEAT:
                self._election_elapsed = 0
                self.lead = m.frm
                self._handle_heartbeat(m)
            case _MT.SNAP:
                self._election_elapsed = 0
                self.lead = m.frm
                self._handle_snapshot(m)
            case _MT.TRANSFER_LEADER:
                if self.lead != NONE:
                    self._send(Message(_MT.TRANSFER_LEADER, to=self.lead, frm=m.frm), keep_frm=True)
            case _MT.TIMEOUT_NOW:
                self._hup(transfer=True)
            case _:
                pass

    # -- follower-side handlers ----------------------------------------------------------------
    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self._send(Message(_MT.APP_RESP, to=m.frm, index=self.log.committed))
            return
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._send(Message(_MT.APP_RESP, to=m.frm, index=last_new))
            return
        # Reject with a hint (etcd "fast backtracking"): the largest index <= the probe whose
        # term is <= the probe's term, so the leader can skip a whole divergent term at once.
        hint_index = min(m.index, self.log.last_index())
        hint_index, hint_term = self.log.find_conflict_by_term(hint_index, m.log_term)
        self._send(
            Message(
                _MT.APP_RESP, to=m.frm, index=m.index, reject=True,
                reject_hint=hint_index, log_term=hint_term,
            )
        )

    def _handle_heartbeat(self, m: Message) -> None:
        self.log.commit_to(m.commit)
        self._send(Message(_MT.HEARTBEAT_RESP, to=m.frm, context=m.context))

    def _handle_snapshot(self, m: Message) -> None:
        if m.snapshot is None:
            return
        if self._restore(m.snapshot):
            self._send(Message(_MT.APP_RESP, to=m.frm, index=self.log.last_index()))
        else:
            self._send(Message(_MT.APP_RESP, to=m.frm, index=self.log.committed))

    def _restore(self, snap: Snapshot) -> bool:
        md = snap.metadata
        if md.index <= self.log.committed:
            return False
        if self.log.match_term(md.index, md.term):
            # We already have the entries: fast-forward the commit index only.
            self.log.commit_to(md.index)
            return False
        self.log.restore(snap)
        self._tracker.apply_conf(md.conf_state, self.log.last_index())
        # A snapshot from the leader is current state: a voter in it may campaign (rule 6).
        self._may_campaign = self._may_campaign or self.id in md.conf_state.voters
        return True

    # -- elections ---------------------------------------------------------------------------
    def _promotable(self) -> bool:
        return (self._may_campaign and self.id in self._tracker.voters
                and self.log.unstable.snapshot is None)

    def _has_unapplied_conf_change(self) -> bool:
        lo = max(self.log.applied + 1, self.log.first_index())
        if lo > self.log.committed:
            return False
        try:
            ents = self.log.slice(lo, self.log.committed + 1)
        except CompactedError:
            return False
        return any(e.type == EntryType.CONF_CHANGE for e in ents)

    def _hup(self, transfer: bool) -> None:
        if self.role == Role.LEADER or not self._promotable():
            return
        if self._has_unapplied_conf_change():
            # The configuration may change under us once applied; campaign after that.
            return
        self._campaign(pre=self._cfg.pre_vote and not transfer, transfer=transfer)

    def _campaign(self, pre: bool, transfer: bool) -> None:
        if pre:
            self._become_pre_candidate()
            vote_type, term = _MT.PRE_VOTE, self.term + 1
        else:
            self._become_candidate()
            vote_type, term = _MT.VOTE, self.term
        self._tracker.record_vote(self.id, True)
        _, _, result = self._tracker.tally_votes()
        if result == VoteResult.WON:
            # Single-voter configuration: we win immediately.
            if pre:
                self._campaign(pre=False, transfer=transfer)
            else:
                self._become_leader()
            return
        ctx = _TRANSFER_CONTEXT if transfer else b""
        last = self.log.last_index()
        for peer in sorted(self._tracker.voters):
            if peer == self.id:
                continue
            self._send(
                Message(vote_type, to=peer, term=term, index=last,
                        log_term=self.log.last_term(), context=ctx)
            )

    # -- role transitions --------------------------------------------------------------------
    def _reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_election_timeout = self._cfg.election_tick + self._rng.randrange(
            self._cfg.election_tick
        )
        self._lead_transferee = NONE
        self._tracker.reset_votes()
        last = self.log.last_index()
        stable_last = self.log.unstable.offset - 1
        for pid, pr in self._tracker.progress.items():
            pr.match = 0
            pr.next = last + 1
            pr.inflights.reset()
            pr.state = ProgressState.PROBE
            pr.probe_sent = False
            pr.pending_snapshot = 0
            pr.recent_active = pid == self.id
            pr.last_contact = -(1 << 62)
            if pid == self.id:
                pr.match = stable_last
        self._pending_conf_index = 0

    def _become_follower(self, term: int, lead: str) -> None:
        self._reset(term)
        self.lead = lead
        self.role = Role.FOLLOWER

    def _become_pre_candidate(self) -> None:
        if self.role == Role.LEADER:
            raise ConsensusError("invalid transition [leader -> pre-candidate]")
        # Term and vote stay: a pre-vote must not disturb anyone's persistent state.
        self._tracker.reset_votes()
        self.lead = NONE
        self.role = Role.PRE_CANDIDATE

    def _become_candidate(self) -> None:
        if self.role == Role.LEADER:
            raise ConsensusError("invalid transition [leader -> candidate]")
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    def _become_leader(self) -> None:
        if self.role == Role.FOLLOWER:
            raise ConsensusError("invalid transition [follower -> leader]")
        self._reset(self.term)
        self.lead = self.id
        self.role = Role.LEADER
        me = self._tracker.progress.get(self.id)
        if me is not None:
            me.become_replicate()
        # §5.4.2 / §8: a no-op of our term lets earlier-term entries commit; no membership
        # change is accepted until it is applied (see module rule 5).
        self._append_entries([Entry(0, 0, EntryType.NORMAL, b"")])
        self._pending_conf_index = self.log.last_index()

    # -- leader internals --------------------------------------------------------------------
    def _propose(self, *entries: Entry) -> None:
        if self.role != Role.LEADER:
            raise ProposalDroppedError(
                f"{self.id} is not the leader (leader: {self.lead or 'unknown'})"
            )
        self._leader_append(Message(_MT.PROP, frm=self.id, entries=entries))

    def _leader_append(self, m: Message) -> None:
        if self.id not in self._tracker.progress:
            raise ProposalDroppedError(f"{self.id} was removed from the configuration")
        if self._lead_transferee != NONE:
            raise ProposalDroppedError(
                f"{self.id}: leadership transfer to {self._lead_transferee} in progress"
            )
        ents = list(m.entries)
        if any(e.type == EntryType.CONF_CHANGE for e in ents):
            self._pending_conf_index = self.log.last_index() + len(ents)
        self._append_entries(ents)
        self._bcast_append()

    def _append_entries(self, ents: list[Entry]) -> None:
        li = self.log.last_index()
        stamped = [Entry(self.term, li + 1 + i, e.type, e.data) for i, e in enumerate(ents)]
        self.log.append(stamped)

    # -- configuration -----------------------------------------------------------------------
    def _apply_conf_change(self, cc: ConfChange) -> None:
        new = apply_conf_change(self.conf_state, cc)
        if not new.voters:
            return  # refused at proposal time; ignore if replayed from an old log
        if cc.type == ConfChangeType.ADD_VOTER and cc.node_id == self.id:
            self._may_campaign = True  # rule 6: the change that made us a voter is applied
        self._tracker.apply_conf(new, self.log.last_index())
        if self.role != Role.LEADER:
            return
        if self.id not in new.voters:
            # Removed or demoted: a leader outside the voter set steps down.
            self._become_follower(self.term, NONE)
            return
        if self._lead_transferee != NONE and self._lead_transferee not in new.voters:
            self._lead_transferee = NONE
        if self._maybe_commit():
            self._bcast_append()
        else:
            self._bcast_append_new_members()

    # -- clocks ------------------------------------------------------------------------------
    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._promotable() and self._election_elapsed >= self._randomized_election_timeout:
            self._election_elapsed = 0
            self._step(Message(_MT.HUP, frm=self.id))

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._cfg.election_tick:
            self._election_elapsed = 0
            if self._cfg.check_quorum:
                self._step(Message(_MT.CHECK_QUORUM, frm=self.id))
            if self.role == Role.LEADER and self._lead_transferee != NONE:
                self._lead_transferee = NONE  # transfer timed out (§3.10)
        if self.role != Role.LEADER:
            return
        if self._heartbeat_elapsed >= self._cfg.heartbeat_tick:
            self._heartbeat_elapsed = 0
            self._step(Message(_MT.BEAT, frm=self.id))

    # -- plumbing ----------------------------------------------------------------------------
    def _hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def _send(self, m: Message, keep_frm: bool = False) -> None:
        frm = m.frm if keep_frm else self.id
        term = m.term
        if m.type not in (_MT.VOTE, _MT.PRE_VOTE, _MT.VOTE_RESP, _MT.PRE_VOTE_RESP):
            # Vote traffic carries an explicit term; a forwarded TRANSFER_LEADER is local-ish.
            term = 0 if m.type == _MT.TRANSFER_LEADER else self.term
        self._msgs.append(
            Message(m.type, m.to, frm, term, m.log_term, m.index, m.entries, m.commit,
                    m.reject, m.reject_hint, m.snapshot, m.context)
        )


