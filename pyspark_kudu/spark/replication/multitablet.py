"""Rounds shared by many tablets' leaders: one Spark stage per step for all of them.

A :class:`~pyspark_kudu.spark.replication.tablet_leader.TabletLeader` splits each round in two
halves (``start_round`` / ``finish_round``) so that the functions here can merge the requests of
many leaders into ONE round (DESIGN §4: a stage costs ~0.3 s whatever it carries):
:func:`elect_all` (four shared rounds for any number of elections), :func:`run_round`,
:func:`replicate` (rounds until every leader's batches committed) and
:func:`collect_results` (commit-only rounds until every per-row result arrived). A single
leader's ``elect`` / ``propose`` / ``flush`` / ``take_results`` are these with one leader.

Thread-safety: not thread-safe; the caller owns the leaders for the call (the client runs
them on its replication thread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from pyspark_kudu.consensus.messages import Message
from pyspark_kudu.consensus.raft import RaftNode, Ready
from pyspark_kudu.errors import FencedError, KuduError, RoundFailedError
from pyspark_kudu.spark.host.handlers import (
    PeerRequest,
    PeerResponse,
    ReplicaState,
    RequestKind,
)
from pyspark_kudu.spark.replication.peer_transport import (
    MAX_ROUNDS,
    PeerTransport,
    run_with_retries,
)
from pyspark_kudu.tablet import WriteResult

__all__ = ["RoundLeader", "UncommittedError", "collect_results", "elect_all", "replicate",
           "run_round", "spread_leaders"]


class UncommittedError(RoundFailedError):
    """A leader's round failed with its batches not (known to be) committed.

    ``positions``: each batch's (index, term) in the leader's log, or None if nothing was
    proposed (the leader had already failed). A proposed batch commits later only if the
    leader of a newer term holds it at that index *and* term (Log Matching); once that
    leader committed an entry of its own term, a batch it does not hold never commits
    (:meth:`~pyspark_kudu.spark.api.writes.WritePath` resolves it that way)."""

    def __init__(self, message: str, positions: Sequence[tuple[int, int]] | None) -> None:
        super().__init__(message)
        self.positions = None if positions is None else list(positions)

    def part(self, offset: int, n: int) -> UncommittedError:
        """The same failure for ``n`` of the batches, from ``offset``."""
        return UncommittedError(str(self), None if self.positions is None
                                else self.positions[offset:offset + n])


class _Tablet(Protocol):
    @property
    def tablet_id(self) -> str: ...

    @property
    def voters(self) -> tuple[str, ...]: ...


class _RoundRequests(Protocol):
    @property
    def requests(self) -> Mapping[str, list[PeerRequest]]: ...


class RoundLeader(Protocol):
    """What shared rounds need of one tablet's leader
    (:class:`~pyspark_kudu.spark.replication.tablet_leader.TabletLeader` is one): its
    ``RaftNode``, the election phases, and a round split in :meth:`start_round` (requests
    per tablet server) and :meth:`finish_round` (their responses stepped in)."""

    @property
    def tablet(self) -> _Tablet: ...

    @property
    def leader_id(self) -> str: ...

    @property
    def node(self) -> RaftNode | None: ...

    @property
    def failed_replicas(self) -> dict[str, str]: ...

    def begin_election(self, state: ReplicaState) -> tuple[Ready, PeerRequest]: ...

    def self_voted(self, rd: Ready, resp: PeerResponse | None) -> list[Message]: ...

    def won(self) -> int: ...

    def start_round(self, collecting: bool = False) -> _RoundRequests | None: ...

    def finish_round(self, rnd: Any,
                     out: Mapping[str, Sequence[PeerResponse] | None]) -> None: ...

    def stage_proposals(self, batches: Sequence[bytes]) -> list[tuple[int, int]]: ...

    def committed(self, index: int) -> bool: ...

    def pop_results(self, indexes: Sequence[int]) -> dict[int, WriteResult] | None: ...

    def results_count(self, indexes: Sequence[int]) -> int: ...


L = TypeVar("L", bound=RoundLeader)


def spread_leaders(candidates: Mapping[str, Sequence[str]], leading: Sequence[str] = ()
                   ) -> dict[str, list[str]]:
    """Each tablet's candidate replicas (tablet server uuids), reordered so that the first
    candidates spread the leaderships over the servers: tablets in order, each puts first
    the candidate whose server leads the fewest tablets so far (``leading``: the servers of
    the leaderships already held, one item per tablet), ties kept in the given order.

    A leader's replica applies committed entries a round before its followers and answers
    per-row results (:func:`collect_results`), and serves linearizable reads: leaders piled
    on one host make that host's task the slowest of every results round and its server the
    busiest. The later candidates keep their order: tried only if the first cannot win."""
    load: dict[str, int] = {}
    for ts in leading:
        load[ts] = load.get(ts, 0) + 1
    out: dict[str, list[str]] = {}
    for tid, cands in candidates.items():
        order = list(cands)
        if order:
            first = min(range(len(order)), key=lambda i: (load.get(order[i], 0), i))
            order.insert(0, order.pop(first))
            load[order[0]] = load.get(order[0], 0) + 1
        out[tid] = order
    return out


def elect_all(transport: PeerTransport, leaders: Sequence[L]
              ) -> dict[L, int | KuduError]:
    """Elect many tablets' leaders together: four shared rounds, not four per tablet.

    1. READ_STATE on every candidate replica; 2. each candidate's own vote, made durable
    before anyone else is asked (module rules); 3. RequestVote to the other voters;
    4. the winners' no-op entries. Returns each leader's term, or why it failed.
    """
    out: dict[L, int | KuduError] = {}

    def merged(reqs: Mapping[L, PeerRequest]
               ) -> dict[L, PeerResponse | None]:
        by_ts: dict[str, list[PeerRequest]] = {}
        owners: dict[str, list[L]] = {}
        for lead, req in reqs.items():
            by_ts.setdefault(req.replica_id, []).append(req)
            owners.setdefault(req.replica_id, []).append(lead)
        res = run_with_retries(transport, by_ts) if by_ts else {}
        got: dict[L, PeerResponse | None] = dict.fromkeys(reqs)
        for ts, resps in res.items():
            if resps is not None:
                for lead, resp in zip(owners[ts], resps, strict=True):
                    got[lead] = resp
                    if resp.replica_failed:
                        lead.failed_replicas[resp.replica_id] = resp.error
        return got

    states = merged({lead: PeerRequest(RequestKind.READ_STATE, lead.tablet.tablet_id,
                                       lead.leader_id) for lead in leaders})
    readies: dict[L, tuple[Ready, PeerRequest]] = {}
    for lead, resp in states.items():
        if resp is None or not resp.ok or resp.state is None:
            out[lead] = RoundFailedError(
                f"tablet {lead.tablet.tablet_id}: could not read replica {lead.leader_id}'s "
                f"state ({resp.error if resp is not None else 'tablet server did not answer'})")
            continue
        try:
            readies[lead] = lead.begin_election(resp.state)
        except KuduError as e:  # L may not campaign (its configuration): the next voter
            out[lead] = e
    own = merged({lead: req for lead, (_, req) in readies.items()})
    votes: dict[str, list[PeerRequest]] = {}
    asking: list[L] = []
    for lead, (rd, _) in readies.items():
        try:
            msgs = lead.self_voted(rd, own[lead])
        except KuduError as e:
            out[lead] = e
            continue
        asking.append(lead)
        for m in msgs:
            votes.setdefault(m.to, []).append(PeerRequest(
                RequestKind.STEP, lead.tablet.tablet_id, m.to, messages=(m,)))
    answers = run_with_retries(transport, votes) if votes else {}
    by_tablet = {lead.tablet.tablet_id: lead for lead in asking}
    for resps in answers.values():
        for resp in resps or ():
            if resp.replica_failed:
                by_tablet[resp.tablet_id].failed_replicas[resp.replica_id] = resp.error
            node = by_tablet[resp.tablet_id].node
            if node is not None:
                for m in resp.messages:
                    node.step(m)
    winners: list[L] = []
    for lead in asking:
        try:
            out[lead] = lead.won()
            winners.append(lead)
        except KuduError as e:
            out[lead] = e
    for _ in range(MAX_ROUNDS):  # the no-op of each new term, and its commit
        busy = [lead for lead in winners if lead.node is not None and lead.node.has_ready()]
        if not busy:
            break
        for lead, err in run_round(transport, busy).items():
            out[lead] = err
            winners.remove(lead)
    return out


def run_round(transport: PeerTransport, leaders: Sequence[L], *,
              collecting: bool = False) -> dict[L, KuduError]:
    """One round for many tablets: ONE stage carries every tablet's requests.

    ``collecting``: the round collects per-row results (see ``PeerRequest.collecting``):
    followers persist what they are sent but apply committed writes later.
    Returns the leaders whose round failed, with the error (the others advanced).
    """
    rounds = {lead: r for lead in leaders
              if (r := lead.start_round(collecting)) is not None}
    merged: dict[str, list[PeerRequest]] = {}
    owners: dict[str, list[L]] = {}
    for lead, rnd in rounds.items():
        for ts, reqs in rnd.requests.items():
            merged.setdefault(ts, []).extend(reqs)
            owners.setdefault(ts, []).extend([lead] * len(reqs))
    out = run_with_retries(transport, merged) if merged else {}
    per_leader: dict[L, dict[str, list[PeerResponse] | None]] = {
        lead: {} for lead in rounds}
    for ts, resps in out.items():
        if resps is None:
            for lead in set(owners[ts]):
                per_leader[lead][ts] = None
            continue
        for owner, resp in zip(owners[ts], resps, strict=True):
            per_leader[owner].setdefault(ts, []).append(resp)  # type: ignore[union-attr]
    errors: dict[L, KuduError] = {}
    for lead, rnd in rounds.items():
        try:
            lead.finish_round(rnd, per_leader[lead])
        except KuduError as e:
            errors[lead] = e
    return errors


def replicate(transport: PeerTransport, proposals: Mapping[L, Sequence[bytes]]
              ) -> dict[L, list[tuple[int, int]] | KuduError]:
    """Replicate each leader's batches; all tablets share rounds. Per leader: the batches'
    (index, term) once committed on a majority, or the error that stopped it."""
    results: dict[L, list[tuple[int, int]] | KuduError] = {}
    want: dict[L, int] = {}
    positions: dict[L, list[tuple[int, int]]] = {}
    for lead, batches in proposals.items():
        try:
            positions[lead] = lead.stage_proposals(batches)
        except (RoundFailedError, FencedError) as e:
            # No leader any more (an earlier round of this leader failed, e.g. the settle
            # round after its host died): nothing was proposed.
            results[lead] = UncommittedError(str(e), None)
            continue
        except KuduError as e:
            results[lead] = e
            continue
        want[lead] = positions[lead][-1][0] if positions[lead] else 0
    pending = [lead for lead in want if not lead.committed(want[lead])]
    for _ in range(MAX_ROUNDS):
        if not pending:
            break
        for lead in pending:
            node = lead.node
            if node is not None and not node.has_ready():
                # Nothing in flight but not committed: a heartbeat makes followers answer.
                node.broadcast_heartbeat()
        errors = run_round(transport, pending)
        results.update({lead: UncommittedError(str(e), positions[lead])
                        if isinstance(e, RoundFailedError) else e
                        for lead, e in errors.items()})
        pending = [lead for lead in pending
                   if lead not in errors and not lead.committed(want[lead])]
    for lead in want:
        if lead in results:
            continue
        if lead.committed(want[lead]):
            results[lead] = positions[lead]
        else:
            results[lead] = UncommittedError(
                f"tablet {lead.tablet.tablet_id}: entries up to {want[lead]} did not reach a "
                f"majority of voters {lead.tablet.voters} "
                f"(commit index {lead.node.commit_index if lead.node else 'unknown'})",
                positions[lead])
    return results


def collect_results(transport: PeerTransport, wanted: Mapping[L, Sequence[int]]
                    ) -> dict[L, dict[int, WriteResult] | KuduError]:
    """Per-row results of committed entries, for many tablets at once.

    Replicas apply an entry when they learn it is committed, i.e. in the round *after* it
    committed; so this runs commit-only rounds (one stage for all tablets) until every
    result arrived. The leader replica applies on the first such round; followers only
    record the commit index there and apply in a later round (the service's settle round,
    or the next write's), so a write does not wait for their applies.

    A resident tablet server applies for a bounded time per request and the rest in the
    background (:mod:`~pyspark_kudu.spark.host.background_apply`), so a large write's
    results arrive over several rounds: this goes on while they keep arriving, and gives
    up after ``MAX_ROUNDS`` rounds in a row that brought none.
    """
    out: dict[L, dict[int, WriteResult] | KuduError] = {}
    pending = dict(wanted)
    seen: dict[L, int] = {}
    idle = 0
    while idle < MAX_ROUNDS:
        progressed = False
        for lead in list(pending):
            got = lead.pop_results(pending[lead])
            if got is not None:
                out[lead] = got
                del pending[lead]
                progressed = True
            elif (n := lead.results_count(pending[lead])) > seen.get(lead, 0):
                seen[lead] = n
                progressed = True
        if not pending:
            return out
        idle = 0 if progressed else idle + 1
        for lead in pending:
            if lead.node is not None:
                lead.node.broadcast_heartbeat()
        for lead, err in run_round(transport, list(pending), collecting=True).items():
            out[lead] = err
            del pending[lead]
    for lead, idx in pending.items():
        out[lead] = RoundFailedError(
            f"tablet {lead.tablet.tablet_id}: no replica reported applying entries "
            f"{sorted(idx)[:5]}")
    return out
