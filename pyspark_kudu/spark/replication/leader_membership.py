"""Membership changes and catch-up of one tablet's client-side leader: the part of
:class:`~pyspark_kudu.spark.replication.tablet_leader.TabletLeader` that adds, promotes and
evicts replicas (Raft config changes, one at a time; a new replica joins as a NON_VOTER and is
promoted when caught up -- seed "Raft config change"), and brings lagging followers up to
date from the leader replica's log or by a tablet copy (:mod:`~pyspark_kudu.spark.host.tabletcopy`:
fetched from L's resident tablet server by the new replica's host, or shuffled where that
is not possible or failed once).

A mixin over the leader's ``RaftNode``, its round primitives (``_run_one``, ``_run_many``,
``_round_with``, ``_defer``, ``flush``) and its bookkeeping; see the ``tablet_leader``
module docstring for the rules.

Thread-safety: not thread-safe, like the leader it is part of.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from pyspark_kudu.consensus.messages import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    Message,
    MessageType,
    SnapshotMetadata,
)
from pyspark_kudu.consensus.raft import RaftNode
from pyspark_kudu.errors import IllegalStateError, ProposalDroppedError, RoundFailedError
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse, RequestKind
from pyspark_kudu.spark.host.tabletcopy import served_copy
from pyspark_kudu.spark.replication.peer_transport import MAX_ROUNDS, PeerTransport

__all__ = ["LeaderMembership"]

_MAX_CATCH_UP_STEPS = 16
_COPY_PARTS_PER_ROUND = 4  # tablet copy parts (<= 64 MiB each) one install round delivers
_CATCH_UP_ROUNDS = 24  # rounds a new replica gets to match the commit index before promotion


class _Tablet(Protocol):
    @property
    def tablet_id(self) -> str: ...

    @property
    def voters(self) -> tuple[str, ...]: ...


class LeaderMembership:
    """Membership changes, catch-up and tablet copy of a ``TabletLeader`` (see above)."""

    tablet: _Tablet
    leader_id: str
    node: RaftNode | None
    copies: int
    config_index: int
    _transport: PeerTransport
    last_catch_up_error: str
    #: Set once a served copy (fetched from L's resident tablet server) failed to install:
    #: this leader's later copies travel by shuffle (COPY_OUT ``as_refs``).
    copy_by_shuffle: bool = False

    if TYPE_CHECKING:  # provided by TabletLeader
        def _leader(self) -> RaftNode: ...

        def _run_one(self, ts: str, req: PeerRequest, allow_error: str = "") -> PeerResponse:
            ...

        def _run_many(self, ts: str, reqs: Sequence[PeerRequest]) -> list[PeerResponse]: ...

        def _round_with(self, extra: Mapping[str, Sequence[PeerRequest]], front: bool = False
                        ) -> dict[str, list[PeerResponse] | None]: ...

        def _defer(self, req: PeerRequest) -> None: ...

        def flush(self) -> None: ...

        def release(self, upto: int) -> None: ...

        def apply_ahead(self) -> bool: ...

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
            # copy (a consensus-only replica): then its whole log. "Nothing" is a follower
            # whose log this leader has neither matched nor heard the end of (``nxt`` 1); a
            # new leader's ``match`` is 0 for every follower, and one that answered with its
            # last index (a reject hint) gets what it lacks from L's WAL while it holds it.
            outcome = "compacted" if match == 0 and lo <= 1 else self._copy_entries(
                follower, lo, hi)
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
        out = self._run_one(self.leader_id, self._copy_out_request(copy_id),
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
        except RoundFailedError:
            self._copy_failed(parts)
            raise
        finally:
            self._defer(PeerRequest(RequestKind.DROP_COPY, self.tablet.tablet_id,
                                    self.leader_id, copy_id=copy_id))
        self.copies += 1
        return snap.index if installed else 0

    def conf_state(self) -> ConfState:
        return self._leader().conf_state

    def change_config(self, cc: ConfChange) -> int:
        """Propose one membership change and run rounds until it is committed, then apply
        it in the driver (the next change may be proposed from then on; replicas learn the
        commit with the next round). Returns the change's log index."""
        index = self._propose_change(cc)
        self._wait_applied(index, cc)
        return index

    def add_replica(self, ts: str, promote: bool = True) -> None:
        """Add ``ts`` as a NON_VOTER, copy the tablet to it, and (``promote``) make it a
        voter once its log matches the commit index. Idempotent: resumes a half-done add.

        A fresh add takes three rounds when nothing fails, each one stage for every tablet
        sharing it (:func:`run_round`): (1) the ADD_LEARNER entry, with WIPE + CREATE of the
        new replica and ``COPY_OUT`` on L's host after L's PERSIST, i.e. a copy at L's
        applied index, just before the entry (a committed prefix: a valid Raft snapshot);
        the entry's commit is then applied in the driver without a round of its own
        (:meth:`apply_ahead`); (2) ``INSTALL_COPY`` on the new replica's host, followed in
        the same task by a *bridge* AppendEntries carrying the ADD_LEARNER entry and by the
        leader's first AppendEntries to it, which then match -- a served copy is fetched
        there from L's resident tablet server (no shuffle, one round whatever its size),
        shuffled parts arrive by the round's shuffle (several rounds of
        ``_COPY_PARTS_PER_ROUND`` parts for a large copy); (3) the ADD_VOTER entry, with
        ``DROP_COPY``, its commit applied in the driver at once. A replacement's
        ``remove_replica`` then takes one round (4 in all, was 7); the last commit notice
        leads the next round. Anything out of the ordinary (a failed task, a
        consensus-only replica, a lagging replica, a copy older than the entry) falls back
        to the general catch-up (``_catch_up``); a served copy that failed to install makes
        this leader's later copies go by shuffle (:attr:`copy_by_shuffle`)."""
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
            # The copy is taken in the same round, after L persisted the ADD_LEARNER entry
            # and the commit index the driver knows, i.e. at that commit index (L applies
            # any background backlog up to it first), before the entry: a committed
            # prefix, so a valid Raft snapshot (Raft §7; the simulator installs such
            # snapshots). The new replica then gets the entry itself by AppendEntries (the
            # bridge below).
            copy_id = uuid.uuid4().hex
            out = self._round_with({ts: fresh,
                                    self.leader_id: [self._copy_out_request(copy_id)]})
            self._prefetch(ts, _first(out.get(self.leader_id)))
            if not _all_ok(out.get(ts)):
                # The change may commit without the new replica (it is no voter); it then
                # catches up like any follower once it exists.
                self._run_many(ts, fresh)
            self._wait_applied(index, ConfChange(ConfChangeType.ADD_LEARNER, ts))
            added = node.log.slice(index, index + 1)
            # The mirror may still hold the last writes' entries as staged-batch refs whose
            # files are being removed: release them (they are applied), so the new replica
            # gets everything from L (the copy, or L's log), never a dead ref.
            self.release(node.commit_index)
            copied = _first(out.get(self.leader_id))
            if copied is not None and copied.ok:
                self._install_fresh(ts, copy_id, copied, added)
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

    def _install_fresh(self, ts: str, copy_id: str, copied: PeerResponse,
                       added: Sequence[Entry]) -> None:
        """Install L's copy ``copy_id`` on the new replica ``ts``: the last parts in the same
        task as the leader's next messages to it (its first AppendEntries), preceded by a
        *bridge*: an AppendEntries from the copy's index carrying ``added`` (the ADD_LEARNER
        entry, right after the copy), so the leader's first AppendEntries, which starts
        after that entry, matches. The bridge is only sent when the copy ends right before
        the entry: entries in between may be write batches the driver only holds as refs
        (then the new replica gets them the general way). The staged parts are dropped with
        the next round on L's host."""
        assert copied.state is not None
        node = self._leader()
        snap = SnapshotMetadata(copied.last_index, copied.prev_term, copied.state.conf_state)
        parts = copied.entries
        last = max(0, (len(parts) - 1) // _COPY_PARTS_PER_ROUND * _COPY_PARTS_PER_ROUND)
        reqs = [self._install_request(ts, copy_id, parts, last, snap)]
        if added and added[0].index == snap.index + 1:
            reqs.append(PeerRequest(RequestKind.STEP, self.tablet.tablet_id, ts, messages=(
                Message(MessageType.APP, to=ts, frm=self.leader_id, term=node.term,
                        index=snap.index, log_term=snap.term, entries=tuple(added),
                        commit=node.commit_index),)))
        try:
            for k in range(0, last, _COPY_PARTS_PER_ROUND):  # bounded memory per round
                self._run_one(ts, self._install_request(ts, copy_id, parts, k, snap))
            out = self._round_with({ts: reqs}, front=True)
            resp = _first(out.get(ts))
            if resp is None or not resp.installed:
                self.last_catch_up_error = (
                    f"{ts}: copy {copy_id} not installed "
                    f"({resp.error if resp is not None else 'its task failed'})")
                self._copy_failed(parts)
            else:
                self.copies += 1
        except RoundFailedError as e:
            self.last_catch_up_error = f"{ts}: {e}"
            self._copy_failed(parts)
        finally:
            self._defer(PeerRequest(RequestKind.DROP_COPY, self.tablet.tablet_id,
                                    self.leader_id, copy_id=copy_id))

    def _prefetch(self, ts: str, copied: PeerResponse | None) -> None:
        """A served copy in ``copied`` (COPY_OUT's answer) starts moving to ``ts`` now, if
        the transport can ask its host's resident server (``PeerTransport``): the bytes move
        while this driver applies the change and Spark launches the install round, which
        then finds them fetched."""
        prefetch = getattr(self._transport, "prefetch_copy", None)
        if prefetch is None or copied is None or not copied.ok or not copied.entries:
            return
        if served_copy(copied.entries) is not None:
            prefetch(ts, self.tablet.tablet_id, copied.entries[0].data, copied.last_index)

    def _copy_out_request(self, copy_id: str) -> PeerRequest:
        """COPY_OUT on L's host: a served copy unless one failed before (module docs)."""
        return PeerRequest(RequestKind.COPY_OUT, self.tablet.tablet_id, self.leader_id,
                           copy_id=copy_id, as_refs=self.copy_by_shuffle)

    def _copy_failed(self, parts: Sequence[Entry]) -> None:
        if served_copy(parts) is not None:
            self.copy_by_shuffle = True  # the next copy goes by shuffle

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
        """Run rounds, one at a time, until the change at ``index`` is committed, then apply
        it in the driver at once (``apply_ahead``): the round that would only announce the
        commit to the replicas is not waited for; it leads the next round."""
        node = self._leader()
        for attempt in range(MAX_ROUNDS + 1):
            if node.log.applied < index <= node.commit_index:
                self.apply_ahead()
            if node.log.applied >= index:
                self.config_index = index
                return
            if attempt == MAX_ROUNDS:
                break
            if not node.has_ready():
                node.broadcast_heartbeat()  # nothing in flight: make followers answer
            self._round_with({})
        raise RoundFailedError(
            f"tablet {self.tablet.tablet_id}: configuration change {cc.type.value} "
            f"{cc.node_id} (index {index}) did not commit (commit index {node.commit_index})")

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


def _first(resps: list[PeerResponse] | None) -> PeerResponse | None:
    return resps[0] if resps else None


def _all_ok(resps: list[PeerResponse] | None) -> bool:
    return resps is not None and all(r.ok for r in resps)
