"""The client-side leader of one tablet: a ``RaftNode`` in the driver, replicas on executors.

DESIGN §3. The driver runs the leader's Raft state machine *on behalf of* one replica L
(its node id is L's tablet-server UUID); L's durable state lives on L's host. Every exchange
with replicas is a *round*: one request list per tablet server, executed by a
:class:`~pyspark_kudu.spark.replication.peer_transport.PeerTransport` (a barrier stage of pinned
tasks on a cluster, direct calls in tests), one response list back. Responses are stepped into
the
``RaftNode``. A round is taken in two halves (``start_round`` / ``finish_round``) so that many
tablets' leaders share one (:mod:`pyspark_kudu.spark.replication.multitablet`); this module's
``elect`` / ``propose`` / ``flush`` are those shared rounds with one leader.

Rules:

- **Election** (two rounds, never one): first L persists its own vote for the new term (a
  RequestVote from L to itself, through the same code path as every vote), and only then do
  the other voters get RequestVote. Sending both at once would let a crash of L forget its
  self-vote while others counted on it (two leaders in one term).
- **Write round**: the leader's entries are persisted on L (``PERSIST``, fenced by term)
  *in parallel* with AppendEntries to followers (thesis §10.2.1); the ``RaftNode`` counts L
  only after L's PERSIST succeeded (its rule 3), so "committed" = durable on a majority.
- **Retry**: when a round fails as a whole (a barrier stage aborts if any task dies), it is
  re-sent without the tablet servers the transport reports unreachable; re-sent entries with
  the same index and term are acknowledged without being written twice.
- **Catch-up**: the driver only holds L's log tail, so a follower needing older entries makes
  the ``RaftNode`` emit a snapshot request (its compaction hook). The driver intercepts it and
  copies the missing entries from L (``READ_ENTRIES`` on L's host answers with refs to its
  log entries; the AppendEntries to the follower carries the refs and the round's shuffle
  moves the bytes from L's host to the follower's), then reports the "snapshot" done.
- **Tablet copy**: a follower that has nothing yet (a replica just added) or whose missing
  entries the leader replica's WAL no longer holds gets a tablet copy of the leader replica
  instead (:mod:`pyspark_kudu.spark.host.tabletcopy`: ``COPY_OUT`` on L's host, the parts shuffled
  to the follower's host, ``INSTALL_COPY`` there), then the entries after the copy.
- **Attached requests**: requests that are not Raft traffic (creating a replica, staging or
  installing a tablet copy, dropping its parts) ride in the same task as a round's Raft
  traffic (``_round_with``, ``_defer``), so they cost no Spark job of their own.
- **Membership** (Raft config change seed): one change at a time, each committed and applied
  before the next. :meth:`TabletLeader.add_replica` creates an empty replica, adds it as a
  NON_VOTER (it cannot affect commit while it catches up), copies the tablet to it and
  promotes it once its log matches the commit index; :meth:`TabletLeader.remove_replica`
  evicts one. Replacing a replica is add-then-remove (3-4-3). A replica id is its tablet
  server's UUID: a server evicted from a tablet may only come back as a NON_VOTER after its
  old replica was deleted, so a voter never forgets a log it acknowledged (raft.py rule 6).
- **Fencing**: a newer leader (another client) has a higher term; replicas refuse the old
  one and the old ``RaftNode`` steps down on the first response carrying the newer term.
  Every call then fails with :class:`FencedError`; nothing it did not see committed is
  reported committed.

Thread-safety: not thread-safe; one owner drives a ``TabletLeader`` (the client groups
concurrent writes into shared rounds above this layer).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from pyspark_kudu.consensus.messages import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)
from pyspark_kudu.consensus.raft import Config, RaftNode, Ready, Role
from pyspark_kudu.consensus.storage import MemoryStorage
from pyspark_kudu.errors import (
    FencedError,
    IllegalStateError,
    ProposalDroppedError,
    RoundFailedError,
)
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse, ReplicaState, RequestKind
from pyspark_kudu.spark.replication.multitablet import (
    collect_results,
    elect_all,
    replicate,
    run_round,
)
from pyspark_kudu.spark.replication.peer_transport import (
    MAX_ROUND_ATTEMPTS,
    MAX_ROUNDS,
    PeerTransport,
)
from pyspark_kudu.tablet import WriteResult

__all__ = [
    "FencedError",
    "PeerTransport",
    "RoundFailedError",
    "TabletLeader",
    "TabletReplicas",
    "collect_results",
    "elect_all",
    "replicate",
    "run_round",
]

_MAX_CATCH_UP_STEPS = 16
_TRIM_BATCH = 64  # compact the driver's log mirror in steps of at least this many entries
_COPY_PARTS_PER_ROUND = 4  # tablet copy parts (<= 64 MiB each) one install round delivers
_CATCH_UP_ROUNDS = 24  # rounds a new replica gets to match the commit index before promotion


@dataclass(frozen=True)
class TabletReplicas:
    """A tablet and its replicas (tablet-server UUIDs); ``voters`` founded the group."""

    tablet_id: str
    voters: tuple[str, ...]


class TabletLeader:
    """Leader state of one tablet in the client, acting for replica ``leader_id``."""

    def __init__(self, tablet: TabletReplicas, leader_id: str, transport: PeerTransport,
                 seed: int = 0) -> None:
        if leader_id not in tablet.voters:
            raise IllegalStateError(
                f"tablet {tablet.tablet_id}: {leader_id} is not one of its voters {tablet.voters}"
            )
        self.tablet = tablet
        self.leader_id = leader_id
        self._transport = transport
        self._rng = random.Random(seed)
        self.node: RaftNode | None = None
        # The driver's mirror of the leader replica's log (what L has durably): the Storage
        # its RaftNode reads. It starts at L's commit index (see _leader_view).
        self._view = MemoryStorage()
        self.fenced_reason = ""
        # Per-row outcomes reported by replicas as they apply committed entries (identical on
        # every replica: application is deterministic), until a writer takes them.
        self._results: dict[int, WriteResult] = {}
        self.copies = 0  # tablet copies this leader made
        self.last_catch_up_error = ""
        # Replicas that answered "failed" (corrupt files, full disk), with why: the client
        # reports them to the master, which has them replaced (peer.py, failed replicas).
        self.failed_replicas: dict[str, str] = {}
        self.config_index = 0  # log index of the last configuration change it applied
        # Requests that ride along with the next round (see _round_with, _defer): the round's
        # stage carries them in the same task as the Raft traffic, so they cost no job.
        self._attached: dict[str, list[PeerRequest]] = {}
        self._attached_front = False
        self._attached_out: dict[str, list[PeerResponse] | None] = {}
        self._deferred: list[PeerRequest] = []  # best effort, on L's host (e.g. DROP_COPY)

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self, schema_json: str = "") -> None:
        """Create every replica of a new tablet, bootstrapping the founding configuration.

        With ``schema_json`` each replica also gets its tablet (storage engine); without, the
        replicas are consensus-only (used by tests of the replication layer alone).
        """
        reqs = {v: [PeerRequest(RequestKind.CREATE, self.tablet.tablet_id, v,
                                voters=self.tablet.voters, schema_json=schema_json)]
                for v in self.tablet.voters}
        out = self._transport.run(reqs)
        failed = [v for v in self.tablet.voters if not _all_ok(out.get(v))]
        if len(failed) > len(self.tablet.voters) // 2:
            raise RoundFailedError(
                f"tablet {self.tablet.tablet_id}: could not create a majority of replicas "
                f"(failed on {failed}: {_errors(out, failed)})"
            )

    def elect(self) -> int:
        """Win an election for ``leader_id``; returns the term. Raises if it loses."""
        result = elect_all(self._transport, [self])[self]
        if isinstance(result, Exception):
            raise result
        return result

    # -- election phases (see elect_all) -----------------------------------------------------
    def begin_election(self, state: ReplicaState) -> tuple[Ready, PeerRequest]:
        """Become candidate over L's durable state; returns the Ready and L's self-vote."""
        self._view = _leader_view(state)
        self.node = node = RaftNode(Config(
            id=self.leader_id, storage=self._view, applied=state.hard_state.commit,
            rng=self._rng, max_size_per_msg=None, pre_vote=False, check_quorum=False,
        ))
        node.campaign()
        rd = node.ready()
        self_vote = Message(MessageType.VOTE, to=self.leader_id, frm=self.leader_id,
                            term=node.term, index=state.last_index, log_term=state.last_term)
        return rd, PeerRequest(RequestKind.STEP, self.tablet.tablet_id, self.leader_id,
                               messages=(self_vote,))

    def self_voted(self, rd: Ready, resp: PeerResponse | None) -> list[Message]:
        """L's own vote came back: acknowledge the candidacy; the votes to ask for."""
        node = self.node
        assert node is not None
        term = node.term
        granted = resp is not None and resp.ok and any(
            m.type == MessageType.VOTE_RESP and not m.reject and m.term == term
            for m in resp.messages)
        if not granted:
            self.node = None
            why = (resp.error if resp is not None and not resp.ok else
                   "it has moved on to a newer term or vote" if resp is not None else
                   "its tablet server did not answer")
            raise FencedError(f"tablet {self.tablet.tablet_id}: replica {self.leader_id} did "
                              f"not vote for itself in term {term} ({why})")
        assert rd.hard_state is not None
        if rd.entries:
            # A single-voter group: the self-vote already won, and the Ready carries the new
            # term's no-op. It is "persisted" by advance(), so L must really hold it first.
            self._run_one(self.leader_id, PeerRequest(
                RequestKind.PERSIST, self.tablet.tablet_id, self.leader_id, term=node.term,
                entries=rd.entries, hard_state=rd.hard_state))
            self._view.append(rd.entries)
        self._view.set_hard_state(rd.hard_state)
        node.advance(rd)
        return [m for m in rd.messages if m.type == MessageType.VOTE]

    def won(self) -> int:
        node = self.node
        if node is None or node.role != Role.LEADER:
            term = node.term if node is not None else 0
            self.node = None
            raise FencedError(f"tablet {self.tablet.tablet_id}: replica {self.leader_id} lost "
                              f"the election for term {term}")
        return node.term

    # -- writes ------------------------------------------------------------------------------
    def propose(self, batches: Sequence[bytes]) -> list[tuple[int, int]]:
        """Replicate ``batches``; returns each one's (index, term) once committed."""
        result = replicate(self._transport, {self: batches})[self]
        if isinstance(result, Exception):
            raise result
        return result

    def heartbeat(self) -> None:
        """A commit-only round: tells followers the commit index and collects their progress."""
        self._leader().broadcast_heartbeat()
        self.flush()

    def flush(self) -> None:
        """Run rounds until the ``RaftNode`` has nothing more to persist or send."""
        for _ in range(MAX_ROUNDS):
            errors = run_round(self._transport, [self])
            if self in errors:
                raise errors[self]
            if not self._leader().has_ready():
                return
        raise IllegalStateError(f"tablet {self.tablet.tablet_id}: rounds did not quiesce")

    # -- one round, in two halves (so that many tablets can share one stage) -----------------
    def stage_proposals(self, batches: Sequence[bytes]) -> list[tuple[int, int]]:
        """Append ``batches`` to the leader's log (not yet replicated); their positions."""
        node = self._leader()
        first = node.log.last_index() + 1
        node.propose_batch(batches)
        return [(first + k, node.term) for k in range(len(batches))]

    def take_results(self, indexes: Sequence[int]) -> dict[int, WriteResult]:
        """Per-row results of committed write entries ``indexes`` (see :func:`collect_results`)."""
        out = collect_results(self._transport, {self: indexes})[self]
        if isinstance(out, Exception):
            raise out
        return out

    def pop_results(self, indexes: Sequence[int]) -> dict[int, WriteResult] | None:
        if not set(indexes) <= self._results.keys():
            return None
        return {i: self._results.pop(i) for i in sorted(set(indexes))}

    def committed(self, index: int) -> bool:
        return self.node is not None and self.node.commit_index >= index

    def start_round(self) -> _Round | None:
        """Take the ``RaftNode``'s Ready and turn it into requests per tablet server, plus
        any attached or deferred requests (a round of those alone when nothing is ready)."""
        node = self._leader()
        extra = bool(self._attached or self._deferred)
        if not node.has_ready() and not extra:
            return None
        rd = node.ready() if node.has_ready() else None
        reqs: dict[str, list[PeerRequest]] = {}
        snaps: list[str] = []
        for m in rd.messages if rd is not None else ():
            if m.type == MessageType.SNAP:
                snaps.append(m.to)
                continue
            lst = reqs.setdefault(m.to, [])
            if lst and lst[-1].kind == RequestKind.STEP:
                lst[-1] = replace(lst[-1], messages=(*lst[-1].messages, m))
            else:
                lst.append(PeerRequest(RequestKind.STEP, self.tablet.tablet_id, m.to,
                                       messages=(m,)))
        if rd is not None and (rd.entries or rd.hard_state is not None):
            reqs.setdefault(self.leader_id, []).insert(0, PeerRequest(
                RequestKind.PERSIST, self.tablet.tablet_id, self.leader_id, term=node.term,
                entries=rd.entries, hard_state=rd.hard_state))
        attached: dict[str, tuple[int, int]] = {}  # ts -> (position, count) in its list
        for ts, extra_reqs in self._attached.items():
            lst = reqs.setdefault(ts, [])
            pos = 0 if self._attached_front else len(lst)
            lst[pos:pos] = extra_reqs
            attached[ts] = (pos, len(extra_reqs))
        if self._deferred:
            reqs.setdefault(self.leader_id, []).extend(self._deferred)
            self._deferred = []
        return _Round(rd, reqs, snaps, attached)

    def finish_round(self, rnd: _Round,
                     out: Mapping[str, Sequence[PeerResponse] | None]) -> None:
        """Step the responses to ``rnd`` into the ``RaftNode`` and acknowledge its Ready."""
        node = self._leader()
        persist_sent = any(r.kind == RequestKind.PERSIST
                           for r in rnd.requests.get(self.leader_id, []))
        leader_persisted = not persist_sent
        self._attached_out = {}
        for ts, (pos, count) in rnd.attached.items():
            resps = out.get(ts)
            self._attached_out[ts] = None if resps is None else list(resps[pos:pos + count])
        for ts, resps in out.items():
            if resps is None:
                continue
            for req, resp in zip(rnd.requests[ts], resps, strict=True):
                if resp.replica_failed:
                    self.failed_replicas[resp.replica_id] = resp.error
                if req.kind == RequestKind.PERSIST:
                    if resp.fenced:
                        self.fenced_reason = resp.error
                        self.node = None
                        raise FencedError(resp.error)
                    leader_persisted = resp.ok
                for m in resp.messages:
                    node.step(m)
                for res in resp.results:
                    self._results.setdefault(res.index, res)
        if not leader_persisted:
            # Without L's own write the Ready cannot be acknowledged (advance = "L persisted
            # it"), so this leadership is over: the client must elect again.
            self.node = None
            raise RoundFailedError(
                f"tablet {self.tablet.tablet_id}: the leader replica {self.leader_id} could not "
                f"persist its log; elect a leader again (possibly on another replica)")
        if rnd.ready is None:  # a round of attached requests only
            return
        # L persisted the Ready: mirror it, then let the RaftNode count L (its rule 3).
        self._view.append(rnd.ready.entries)
        if rnd.ready.hard_state is not None:
            self._view.set_hard_state(rnd.ready.hard_state)
        node.advance(rnd.ready)
        self._trim_view()
        for follower in rnd.snaps:
            self._catch_up(follower)
        if node.role != Role.LEADER:
            self.node = None
            raise FencedError(self.fenced_reason or (
                f"tablet {self.tablet.tablet_id}: {self.leader_id} is no longer the leader "
                f"(a newer term {node.term} exists)"))

    # -- internals ---------------------------------------------------------------------------
    def _leader(self) -> RaftNode:
        if self.node is None or self.node.role != Role.LEADER:
            raise FencedError(self.fenced_reason or (
                f"tablet {self.tablet.tablet_id}: this client is not the leader; call elect()"))
        return self.node

    def _run_many(self, ts: str, reqs: Sequence[PeerRequest]) -> list[PeerResponse]:
        """Several requests on one tablet server in one task, in order; all must succeed."""
        for _ in range(MAX_ROUND_ATTEMPTS):
            out = self._transport.run({ts: list(reqs)}).get(ts)
            if out is not None:
                bad = [r for r in out if not r.ok]
                if bad:
                    raise RoundFailedError(
                        f"tablet {self.tablet.tablet_id}: on replica {ts}: {bad[0].error}")
                return out
        raise RoundFailedError(
            f"tablet {self.tablet.tablet_id}: tablet server {ts} did not answer "
            f"after {MAX_ROUND_ATTEMPTS} attempts")

    def _run_one(self, ts: str, req: PeerRequest, allow_error: str = "") -> PeerResponse:
        """One request on one tablet server (retried if its task fails). A refused request
        raises, unless its error starts with ``allow_error``: then it is returned."""
        for _ in range(MAX_ROUND_ATTEMPTS):
            out = self._transport.run({ts: [req]}).get(ts)
            if out is not None:
                if out[0].replica_failed:
                    self.failed_replicas[ts] = out[0].error
                if allow_error and not out[0].ok and out[0].error.startswith(allow_error):
                    return out[0]
                if not out[0].ok:
                    raise RoundFailedError(
                        f"tablet {req.tablet_id}: {req.kind.value} on replica {ts} failed: "
                        f"{out[0].error}")
                return out[0]
        raise RoundFailedError(
            f"tablet {req.tablet_id}: tablet server {ts} did not answer {req.kind.value} "
            f"after {MAX_ROUND_ATTEMPTS} attempts")

    def _catch_up(self, follower: str) -> None:
        """Bring a lagging follower up to the driver's log mirror: entries copied from the
        leader replica's log, or a tablet copy when it has nothing yet or L's WAL no longer
        holds what it misses (module rules)."""
        node = self._leader()
        match, nxt = node.status().progress.get(follower, (0, 1))
        lo = max(match + 1, nxt, 1)
        hi = node.log.first_index()  # the driver's view holds everything from here on
        ok = False
        try:
            # A follower with nothing gets a copy (as in Kudu) unless L has no tablet to
            # copy (a consensus-only replica): then its whole log.
            outcome = "compacted" if match == 0 else self._copy_entries(follower, lo, hi)
            if outcome == "compacted":
                copied = self._copy_tablet(follower)
                if copied < 0:
                    outcome = self._copy_entries(follower, lo, hi)
                    ok = outcome == "ok"
                else:
                    ok = copied >= hi - 1 or (
                        copied > 0 and self._copy_entries(follower, copied + 1, hi) == "ok")
            else:
                ok = outcome == "ok"
        except RoundFailedError as e:
            ok = False  # the follower stays behind; the next round tries again
            self.last_catch_up_error = f"{follower}: {e}"
        node.report_snapshot(follower, ok)

    def _copy_tablet(self, follower: str) -> int:
        """Tablet copy from L to ``follower``; returns the index the copy stands for (0 if
        the install did not complete, -1 if L has no tablet: a consensus-only replica)."""
        copy_id = uuid.uuid4().hex
        out = self._run_one(self.leader_id, PeerRequest(
            RequestKind.COPY_OUT, self.tablet.tablet_id, self.leader_id, copy_id=copy_id),
            allow_error="IllegalStateError")
        if not out.ok:
            self.last_catch_up_error = f"{follower}: no tablet copy ({out.error})"
            return -1
        assert out.state is not None
        snap = SnapshotMetadata(out.last_index, out.prev_term, out.state.conf_state)
        parts = out.entries
        try:
            installed = False
            for k in range(0, len(parts), _COPY_PARTS_PER_ROUND):
                resp = self._run_one(follower, self._install_request(
                    follower, copy_id, parts, k, snap))
                installed = resp.installed
            if not installed:
                self.last_catch_up_error = f"{follower}: copy {copy_id} incomplete"
        finally:
            self._defer(PeerRequest(RequestKind.DROP_COPY, self.tablet.tablet_id,
                                    self.leader_id, copy_id=copy_id))
        self.copies += 1
        return snap.index if installed else 0

    # -- membership --------------------------------------------------------------------------
    def conf_state(self) -> ConfState:
        return self._leader().conf_state

    def change_config(self, cc: ConfChange) -> int:
        """Propose one membership change and run rounds until it is committed and applied
        (the next change may only be proposed then). Returns the change's log index."""
        index = self._propose_change(cc)
        self._wait_applied(index, cc)
        return index

    def add_replica(self, ts: str, promote: bool = True) -> None:
        """Add ``ts`` as a NON_VOTER, copy the tablet to it, and (``promote``) make it a
        voter once its log matches the commit index. Idempotent: resumes a half-done add.

        A fresh add takes five rounds when nothing fails, each one stage for every tablet
        sharing it (:func:`run_round`): (1) the ADD_LEARNER entry, with WIPE + CREATE of the
        new replica in the same task; (2) its commit, with ``COPY_OUT`` on L's host after L
        applied it; (3) the parts shuffled to the new replica and ``INSTALL_COPY``, ahead of
        the leader's first AppendEntries to it in the same task, which the installed copy
        then matches; (4, 5) the ADD_VOTER entry and its commit, with ``DROP_COPY``. Anything
        out of the ordinary (a failed task, a consensus-only replica, a lagging replica)
        falls back to the general catch-up (``_catch_up``)."""
        node = self._leader()
        cs = node.conf_state
        if ts in cs.voters:
            return
        if ts not in cs.learners:
            # Not a member: any replica files it still has are from an earlier membership
            # (evicted, failed, or a lost majority's survivor) and must go first.
            index = self._propose_change(ConfChange(ConfChangeType.ADD_LEARNER, ts))
            fresh = [PeerRequest(RequestKind.WIPE, self.tablet.tablet_id, ts),
                     PeerRequest(RequestKind.CREATE, self.tablet.tablet_id, ts)]
            if not _all_ok(self._round_with({ts: fresh}, front=True).get(ts)):
                # The change may commit without the new replica (it is no voter); it then
                # catches up like any follower once it exists.
                self._run_many(ts, fresh)
            copy_id = uuid.uuid4().hex
            out = self._round_with({self.leader_id: [PeerRequest(
                RequestKind.COPY_OUT, self.tablet.tablet_id, self.leader_id,
                copy_id=copy_id)]})
            self._wait_applied(index, ConfChange(ConfChangeType.ADD_LEARNER, ts))
            # The mirror may still hold the last writes' entries as staged-batch refs whose
            # files are being removed: release them (they are applied), so the new replica
            # gets everything from L (the copy, or L's log), never a dead ref.
            self.release(node.commit_index)
            copied = _first(out.get(self.leader_id))
            if copied is not None and copied.ok:
                self._install_fresh(ts, copy_id, copied)
            elif copied is not None:
                self.last_catch_up_error = f"{ts}: no tablet copy ({copied.error})"
        else:
            # Resuming an add cut short: the learner's replica may never have been created
            # (CREATE is idempotent; its files are kept if it exists).
            self._run_many(ts, [PeerRequest(RequestKind.CREATE, self.tablet.tablet_id, ts)])
        for _ in range(_CATCH_UP_ROUNDS):
            match = node.status().progress.get(ts, (0, 0))[0]
            if match >= node.commit_index:
                break
            node.broadcast_heartbeat()
            self.flush()
        else:
            raise RoundFailedError(
                f"tablet {self.tablet.tablet_id}: new replica {ts} did not catch up "
                f"(match {node.status().progress.get(ts, (0, 0))[0]}, commit "
                f"{node.commit_index}; last catch-up error: "
                f"{self.last_catch_up_error or 'none'})")
        if promote:
            self.change_config(ConfChange(ConfChangeType.ADD_VOTER, ts))

    def _install_fresh(self, ts: str, copy_id: str, copied: PeerResponse) -> None:
        """Install L's copy ``copy_id`` on the new replica ``ts``: the last parts in the same
        task as the leader's next messages to it (its first AppendEntries, which the copy
        then matches). The staged parts are dropped with the next round on L's host."""
        assert copied.state is not None
        snap = SnapshotMetadata(copied.last_index, copied.prev_term, copied.state.conf_state)
        parts = copied.entries
        last = max(0, (len(parts) - 1) // _COPY_PARTS_PER_ROUND * _COPY_PARTS_PER_ROUND)
        try:
            for k in range(0, last, _COPY_PARTS_PER_ROUND):  # bounded memory per round
                self._run_one(ts, self._install_request(ts, copy_id, parts, k, snap))
            out = self._round_with(
                {ts: [self._install_request(ts, copy_id, parts, last, snap)]}, front=True)
            resp = _first(out.get(ts))
            if resp is None or not resp.installed:
                self.last_catch_up_error = (
                    f"{ts}: copy {copy_id} not installed "
                    f"({resp.error if resp is not None else 'its task failed'})")
            else:
                self.copies += 1
        except RoundFailedError as e:
            self.last_catch_up_error = f"{ts}: {e}"
        finally:
            self._defer(PeerRequest(RequestKind.DROP_COPY, self.tablet.tablet_id,
                                    self.leader_id, copy_id=copy_id))

    def _install_request(self, ts: str, copy_id: str, parts: Sequence[Entry], k: int,
                         snap: SnapshotMetadata) -> PeerRequest:
        """INSTALL_COPY of the parts from ``k`` on (at most one round's share) to ``ts``."""
        return PeerRequest(RequestKind.INSTALL_COPY, self.tablet.tablet_id, ts,
                           entries=tuple(parts[k:k + _COPY_PARTS_PER_ROUND]), lo=k,
                           hi=len(parts), copy_id=copy_id, snapshot=snap)

    def _propose_change(self, cc: ConfChange) -> int:
        """Append one membership change to the leader's log (after a pending one applied);
        returns its index. It is replicated by the next rounds."""
        node = self._leader()
        try:
            node.propose_conf_change(cc)
        except ProposalDroppedError:
            self.flush()  # the previous change is not applied yet
            node.propose_conf_change(cc)
        return node.log.last_index()

    def _wait_applied(self, index: int, cc: ConfChange) -> None:
        node = self._leader()
        for attempt in range(MAX_ROUNDS + 1):
            if node.log.applied >= index:
                self.config_index = index
                return
            if attempt == MAX_ROUNDS:
                break
            if attempt:
                node.broadcast_heartbeat()  # nothing in flight: make followers answer
            self.flush()
        raise RoundFailedError(
            f"tablet {self.tablet.tablet_id}: configuration change {cc.type.value} "
            f"{cc.node_id} (index {index}) did not commit (commit index {node.commit_index})")

    def _round_with(self, extra: Mapping[str, Sequence[PeerRequest]], front: bool = False
                    ) -> dict[str, list[PeerResponse] | None]:
        """One round carrying the ``RaftNode``'s Ready (if any) and ``extra`` requests, put
        before (``front``) or after the Raft traffic in each tablet server's task. Returns
        the extra requests' responses per tablet server (None: its task failed)."""
        self._attached = {ts: list(reqs) for ts, reqs in extra.items()}
        self._attached_front = front
        self._attached_out = {}
        try:
            errors = run_round(self._transport, [self])
        finally:
            self._attached = {}
        if self in errors:
            raise errors[self]
        return self._attached_out

    def _defer(self, req: PeerRequest) -> None:
        """A best-effort request for L's host, sent with the next round (its answer is not
        checked; e.g. dropping a tablet copy's staged parts). Known limit: if this
        leadership ends before another round, the parts stay under ``staging/copy-<id>`` on
        that host until its data root is cleaned."""
        self._deferred.append(req)

    def remove_replica(self, ts: str) -> None:
        """Evict ``ts`` from the configuration (its files are deleted when its server next
        reports it, see :mod:`pyspark_kudu.master.redrive`)."""
        node = self._leader()
        if ts == self.leader_id:
            raise IllegalStateError(
                f"tablet {self.tablet.tablet_id}: {ts} is the leader replica; elect another "
                f"voter before evicting it")
        cs = node.conf_state
        if ts in cs.voters or ts in cs.learners:
            self.change_config(ConfChange(ConfChangeType.REMOVE, ts))

    def release(self, upto: int) -> None:
        """Entries up to ``upto`` must no longer be sent from the driver: their data may be
        staged-batch refs whose files are about to be removed. Drop them from the mirror
        (as far as they are committed and applied); a follower still missing them is then
        caught up from the leader replica's log (``_catch_up``), which holds the batches."""
        node = self.node
        if node is None or node.role != Role.LEADER:
            return
        floor = min(upto, node.log.applied, node.commit_index)
        if floor < self._view.first_index():
            return
        self._view.create_snapshot(floor, node.conf_state)
        self._view.compact(floor)

    @contextmanager
    def rounds_via(self, transport: PeerTransport) -> Iterator[None]:
        """Run this leader's rounds through ``transport`` meanwhile (e.g. a
        :class:`~pyspark_kudu.spark.replication.sharedrounds.SharedRounds` party)."""
        old, self._transport = self._transport, transport
        try:
            yield
        finally:
            self._transport = old

    def drop_results(self) -> None:
        """Forget per-row results nobody is waiting for (writes that did not ask)."""
        self._results.clear()

    def abandon(self, reason: str) -> None:
        """Give up this leadership (after a failed write): the next write elects again and
        rebuilds the log mirror from the replicas, which hold real batches, not refs."""
        self.node = None
        self.fenced_reason = reason

    def _trim_view(self) -> None:
        """Drop mirrored entries every member has and that are applied: the driver keeps
        only the log tail, not every batch ever written. A follower that still needs older
        entries gets them from the leader replica's WAL (``_catch_up``)."""
        node = self.node
        if node is None or node.role != Role.LEADER:
            return
        matches = [m for pid, (m, _) in node.status().progress.items() if pid != self.leader_id]
        floor = min([node.log.applied, node.commit_index, *matches])
        if floor - self._view.first_index() + 1 < _TRIM_BATCH or floor > node.log.applied:
            return
        self._view.create_snapshot(floor, node.conf_state)
        self._view.compact(floor)

    def _copy_entries(self, follower: str, lo: int, hi: int) -> str:
        """Copy L's log entries ``[lo, hi)`` to ``follower``: "ok", "failed", or
        "compacted" (L's WAL no longer holds ``lo``: a tablet copy is needed)."""
        node = self._leader()
        for _ in range(_MAX_CATCH_UP_STEPS):
            if lo >= hi:
                return "ok"
            src = self._run_one(self.leader_id, PeerRequest(
                RequestKind.READ_ENTRIES, self.tablet.tablet_id, self.leader_id, lo=lo, hi=hi,
                as_refs=True), allow_error="CompactedError")
            if not src.ok:
                return "compacted"
            app = Message(MessageType.APP, to=follower, frm=self.leader_id, term=node.term,
                          index=lo - 1, log_term=src.prev_term, entries=src.entries,
                          commit=node.commit_index)
            resp = self._run_one(follower, PeerRequest(
                RequestKind.STEP, self.tablet.tablet_id, follower, messages=(app,)))
            acks = [m for m in resp.messages if m.type == MessageType.APP_RESP]
            if acks and not acks[-1].reject:
                for m in resp.messages:
                    node.step(m)
                return "ok"
            if not acks:
                return "failed"
            lo = max(min(acks[-1].reject_hint + 1, lo - 1), 1)
        return "failed"


@dataclass(frozen=True)
class _Round:
    ready: Ready | None  # None: a round of attached or deferred requests only
    requests: dict[str, list[PeerRequest]]
    snaps: list[str]
    attached: dict[str, tuple[int, int]]  # tablet server -> (position, count) of attached


def _leader_view(state: ReplicaState) -> MemoryStorage:
    """The driver's copy of L's log: a 'snapshot' at L's commit index plus L's tail."""
    hs = state.hard_state
    st = MemoryStorage(state.conf_state)
    if hs.commit > 0:
        st.apply_snapshot(Snapshot(SnapshotMetadata(hs.commit, state.commit_term,
                                                    state.conf_state)))
    st.append(list(state.tail))
    st.set_hard_state(hs)
    return st


def _first(resps: list[PeerResponse] | None) -> PeerResponse | None:
    return resps[0] if resps else None


def _all_ok(resps: list[PeerResponse] | None) -> bool:
    return resps is not None and all(r.ok for r in resps)


def _errors(out: Mapping[str, list[PeerResponse] | None], which: Sequence[str]) -> str:
    parts = []
    for ts in which:
        resps = out.get(ts)
        parts.append(f"{ts}: " + ("task failed" if resps is None else
                                  "; ".join(r.error for r in resps if not r.ok)))
    return ", ".join(parts)

