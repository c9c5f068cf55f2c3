"""The simulated cluster the sans-IO Raft core is tested on: hosts, a network, faults.

A :class:`Cluster` runs replicas over an in-memory network; after every step its
:class:`~pyspark_kudu.consensus.sim_checks.SafetyChecker` checks Raft's safety properties.
Seeded adversarial runs (and their command line) are in :mod:`pyspark_kudu.consensus.sim_run`,
which imports this module; this module never imports it.

- :class:`Host`: one replica's process: ``RaftNode`` + ``MemoryStorage`` + state machine
  (``sm``, every applied entry, ``sm[i - 1].index == i``, durable). A crash loses the node and
  whatever it had not yet handed out (and persisted) in a ``Ready``.
- :class:`Cluster`: hosts, in-flight messages and the checker, with etcd-style ``cut`` /
  ``isolate`` / ``ignore`` / ``recover`` and 6.824-style ``leader`` / ``run`` / ``one``. With
  no faults configured it is a lossless FIFO network; the scenario tests drive it by hand.
  ``rng`` draws every random choice (message drop, duplication, delay and reordering, split
  ``Ready`` handling), so a seed is a complete, replayable history.
- ``lazy_commit``: how the tablet leader's driver acknowledges a Ready that only announces a
  higher commit index (``TabletLeader.apply_ahead``): the leader's node advances at once
  (it applies the committed configuration changes and may propose the next one), while the
  host persists that commit index, applies the entries and sends the messages only ahead of
  its next Ready (``Host.carried``; a crash loses them).

No sockets, threads, clocks or files: time is the tick counter ``Cluster.now``.
Thread-safety: not thread-safe; a cluster belongs to one test.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kudu.consensus.messages import (
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
)
from pyspark_kudu.consensus.raft import Config, RaftNode, Ready, Role
from pyspark_kudu.consensus.raft_storage import MemoryStorage
from pyspark_kudu.consensus.sim_checks import InvariantViolation, SafetyChecker
from pyspark_kudu.errors import ProposalDroppedError

__all__ = ["Cluster", "Flight", "Host", "Network", "NodeOptions", "SimulationFailure"]

_MT = MessageType


class SimulationFailure(AssertionError):
    """A simulated cluster failed (it did not quiesce, or a seeded run of
    :mod:`~pyspark_kudu.consensus.sim_run` violated safety or liveness: then the message ends
    with the command that replays it)."""


@dataclass(eq=False)
class Host:
    """One replica's process; ``raft`` is None while it is down. ``incarnation`` counts
    crashes, ``generation`` tombstones (messages to or from an older one are dropped)."""

    id: str
    storage: MemoryStorage
    raft: RaftNode | None = None
    sm: list[Entry] = field(default_factory=list)
    pending: Ready | None = None  # persisted and sent, not yet applied and advanced
    incarnation: int = 0
    generation: int = 0
    starts: int = 0
    retired: bool = False  # shut down because the committed configuration dropped it
    # A commit-only Ready the node was advanced past (lazy_commit) and the configuration it
    # produced; persisted, applied and sent ahead of the next Ready.
    carried: tuple[Ready, ConfState] | None = None

    @property
    def alive(self) -> bool:
        return self.raft is not None

    @property
    def node(self) -> RaftNode:
        if self.raft is None:
            raise AssertionError(f"{self.id} is down")
        return self.raft

    def applied_data(self) -> list[bytes]:
        """Client payloads in apply order (no-ops and configuration changes left out)."""
        return [e.data for e in self.sm if e.type == EntryType.NORMAL and e.data]


@dataclass
class Flight:
    due: int
    msg: Message
    epoch: int  # the sender's incarnation, for snapshot status reports
    gen: tuple[int, int] = (0, 0)  # sender's and destination's generation when sent


@dataclass(frozen=True)
class NodeOptions:
    """The ``Config`` fields every replica of a cluster shares."""

    election_tick: int = 10
    heartbeat_tick: int = 1
    pre_vote: bool = False
    check_quorum: bool = False
    max_size_per_msg: int | None = 1 << 20
    max_inflight_msgs: int = 256
    max_committed_size_per_ready: int | None = None


@dataclass
class Network:
    """In-flight messages plus the faults applied to them."""

    flights: list[Flight] = field(default_factory=list)
    cut_links: set[tuple[str, str]] = field(default_factory=set)
    ignored: set[MessageType] = field(default_factory=set)
    drop_rate: float = 0.0
    dup_rate: float = 0.0
    max_delay: int = 0


class Cluster:
    """Hosts on a simulated network, checked by a ``SafetyChecker`` at every step.

    ``voters`` found the group (bootstrapped storage) unless ``storages`` supplies prepared
    storage per host (Figure 7 style tests); ``spares`` get empty storage and stay down until
    :meth:`start`. With the default ``auto_ready=1.0`` and no faults, the cluster is a
    deterministic, lossless FIFO network, like etcd's test ``network``.
    """

    def __init__(
        self,
        voters: Sequence[str],
        *,
        spares: Sequence[str] = (),
        storages: Mapping[str, MemoryStorage] | None = None,
        seed: int = 0,
        rng: random.Random | None = None,
        options: NodeOptions | None = None,
        **option_fields: Any,
    ) -> None:
        self.rng = rng or random.Random(seed)
        self.net = Network()
        self.checker = SafetyChecker()
        self.now = 0
        self.auto_ready = 1.0
        self.split_ready = 0.0
        self.lazy_commit = 0.0  # probability a leader's commit-only Ready is carried
        self.report_unreachable = False
        self.filters: list[Callable[[Message], bool]] = []  # return False to drop a message
        self.record: list[Message] | None = None  # set to a list to record every sent message
        self.snapshots: dict[bytes, tuple[Entry, ...]] = {}
        self.stats: Counter[str] = Counter()
        self.trace: deque[str] = deque(maxlen=60)
        self._changed: set[str] = set()  # hosts whose storage changed since the last check
        self._checked_commit = -1
        self.options = options or NodeOptions(**option_fields)
        self.hosts: dict[str, Host] = {}
        prepared = dict(storages or {})
        for nid in [*voters, *(s for s in prepared if s not in voters)]:
            st = prepared.get(nid) or MemoryStorage.bootstrapped(list(voters))
            self.hosts[nid] = Host(nid, st)
            self.checker.adopt(nid, st)
        for nid in spares:
            self.hosts[nid] = Host(nid, MemoryStorage())
        for nid in list(self.hosts):
            if nid not in spares:
                self.start(nid)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, nid: str, *, volatile: bool = False) -> None:
        """(Re)start ``nid`` from its storage. ``volatile``: the state machine was lost and is
        rebuilt from the storage's snapshot (``applied`` = its index), else it survived."""
        h = self.hosts[nid]
        if h.alive:
            raise AssertionError(f"{nid} is already running")
        snap = h.storage.snapshot()
        if volatile or len(h.sm) < snap.metadata.index:
            # The state machine is rebuilt from the local snapshot (tablet copy) it persisted.
            h.sm = list(self.snapshots[snap.data]) if not snap.is_empty() else []
        o = self.options
        h.raft = RaftNode(Config(
            id=nid, storage=h.storage, applied=len(h.sm), election_tick=o.election_tick,
            heartbeat_tick=o.heartbeat_tick, pre_vote=o.pre_vote, check_quorum=o.check_quorum,
            max_size_per_msg=o.max_size_per_msg, max_inflight_msgs=o.max_inflight_msgs,
            max_committed_size_per_ready=o.max_committed_size_per_ready,
            rng=random.Random(self.rng.getrandbits(32)),
        ))
        h.retired = False
        h.starts += 1
        self.checker.restart(nid, len(h.sm))
        self._note(f"start {nid} applied={len(h.sm)}{' (volatile)' if volatile else ''}")
        self._after_input(nid)

    restart = start

    def crash(self, nid: str) -> None:
        """Lose the process: the RaftNode and anything not yet handed out in a Ready."""
        h = self.hosts[nid]
        h.raft = None
        h.pending = None
        h.carried = None
        h.incarnation += 1
        self.stats["crashes"] += 1
        self._note(f"crash {nid}")

    def forgotten(self, nid: str) -> bool:
        """No replica's configuration (running or persisted) has ``nid`` any more."""
        return all(
            nid not in (h.raft.conf_state if h.raft else h.storage.initial_state()[1]).members()
            for h in self.hosts.values()
        ) and nid not in self.checker.conf.members()

    def tombstone(self, nid: str) -> None:
        """Replace a stopped replica nobody counts any more by an empty one (term/vote kept).

        Only safe once :meth:`forgotten`: a wiped log must never vote for a configuration
        that still counts it (an early sweep wiped too eagerly: a stale-configuration candidate
        won with a wiped voter's vote and lacked a committed entry). Messages addressed
        to or from the old replica are dropped, as Kudu's RPCs name the replica instance.
        """
        h = self.hosts[nid]
        if h.alive or not self.forgotten(nid):
            raise AssertionError(f"{nid} must be down and in no replica's configuration")
        hs = h.storage.hard_state
        h.storage = MemoryStorage()
        h.storage.set_hard_state(HardState(hs.term, hs.vote, 0))
        h.sm = []
        h.generation += 1
        self.checker.adopt(nid, h.storage)
        self._changed.add(nid)
        self._note(f"tombstone {nid}")

    # -- network controls (etcd raft_test.go style) ------------------------------------------
    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        self.net.cut_links.add((a, b))
        if not one_way:
            self.net.cut_links.add((b, a))

    def isolate(self, nid: str) -> None:
        for other in self.hosts:
            if other != nid:
                self.cut(nid, other)

    def partition(self, *groups: Sequence[str]) -> None:
        """Cut every link between different groups (hosts in no group are isolated)."""
        where = {n: str(i) for i, g in enumerate(groups) for n in g}
        for a in self.hosts:
            for b in self.hosts:
                if a != b and where.get(a, "solo-" + a) != where.get(b, "solo-" + b):
                    self.net.cut_links.add((a, b))

    def ignore(self, t: MessageType) -> None:
        self.net.ignored.add(t)

    def recover(self) -> None:
        self.net.cut_links.clear()
        self.net.ignored.clear()
        self._note("heal")

    def connect(self, nid: str) -> None:
        self.net.cut_links = {lk for lk in self.net.cut_links if nid not in lk}

    disconnect = isolate

    # -- driving -----------------------------------------------------------------------------
    def live(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.raft is not None]

    def node(self, nid: str) -> RaftNode:
        return self.hosts[nid].node

    def tick(self, nids: Sequence[str] | None = None) -> None:
        """One tick of logical time on ``nids`` (default: every live host; advances ``now``)."""
        if nids is None:
            self.now += 1
        for nid in nids if nids is not None else [h.id for h in self.live()]:
            self.node(nid).tick()
            self._after_input(nid)

    def step(self, m: Message) -> None:
        """Deliver ``m`` now (tests craft messages with this)."""
        self.deliver(Flight(self.now, m, -1, self._gen(m)))

    def deliver(self, f: Flight) -> bool:
        m = f.msg
        dest = self.hosts.get(m.to)
        if (dest is None or dest.raft is None or f.gen != self._gen(m)
                or (m.frm, m.to) in self.net.cut_links or m.type in self.net.ignored
                or not all(keep(m) for keep in self.filters)):
            self._lost(f)
            return False
        self._note(f"deliver {m.type.value} {m.frm}->{m.to} t{m.term} i{m.index} "
                   f"lt{m.log_term} c{m.commit} n{len(m.entries)}{' rej' if m.reject else ''}")
        dest.raft.step(m)
        self.stats["delivered"] += 1
        self._after_input(m.to)
        if m.type == _MT.SNAP:
            self.stats["snapshots_delivered"] += 1
            self._report_snapshot(f, ok=True)
        return True

    def drain(self, limit: int = 100_000) -> int:
        """FIFO-deliver every due message and handle every Ready until nothing moves."""
        for n in range(limit):
            moved = False
            for h in self.live():
                moved = self.handle_ready(h.id) or moved
            f = self._pop_due(fifo=True)
            if f is not None:
                self.deliver(f)
                moved = True
            if not moved:
                return n
        raise SimulationFailure(f"the cluster did not quiesce within {limit} rounds")

    def run(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.tick()
            self.drain()

    def handle_ready(self, nid: str) -> bool:
        """Play the application's part of one Ready; False if there is none.

        Phase 1 persists the snapshot, entries and hard state, then sends the messages.
        Phase 2 applies the committed entries, calls ``advance`` and persists the
        configuration. With probability ``split_ready`` phase 2 is left for a later call
        (inputs may reach the node in between, as with etcd's ``Node``); a crash in between
        loses only the unapplied part.
        """
        h = self.hosts[nid]
        node = h.raft
        if node is None:
            return False
        if h.pending is not None:
            self._apply_ready(h, node, h.pending)
            return True
        if not node.has_ready():
            return False
        if h.carried is not None:
            self.flush_carried(nid)  # the driver's next round leads with them
            return True
        was_leader, term = node.role == Role.LEADER, node.term
        rd = node.ready()
        st, ck = h.storage, self.checker
        if (was_leader and self.lazy_commit and rd.committed_entries and not rd.entries
                and rd.snapshot is None and all(m.type != _MT.SNAP for m in rd.messages)
                and self.rng.random() < self.lazy_commit):
            node.advance(rd)
            h.carried = (rd, node.conf_state)
            self.stats["carried_commits"] += 1
            self._note(f"{nid} applies ahead to {rd.committed_entries[-1].index}")
            self.check()
            return True
        if rd.snapshot is not None:
            ck.before_restore(nid, rd.snapshot, list(self._snapshot_data(nid, rd.snapshot)))
            st.apply_snapshot(rd.snapshot)
            self.stats["snapshots_installed"] += 1
        if rd.entries:
            ck.before_append(nid, st, rd.entries)
            st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        ck.persisted(nid, st, rd.hard_state)
        self._changed.add(nid)
        if was_leader:
            ck.leader_persisted(nid, st, term)
        self._send(h, rd.messages)
        if self.split_ready and self.rng.random() < self.split_ready:
            h.pending = rd
            self.stats["split_readies"] += 1
        else:
            self._apply_ready(h, node, rd)
        self.check()
        return True

    def flush_carried(self, nid: str) -> None:
        """Persist, apply and send what a lazily acknowledged Ready left (see module docs)."""
        h = self.hosts[nid]
        if h.carried is None:
            return
        (rd, conf), h.carried = h.carried, None
        if rd.hard_state is not None:
            h.storage.set_hard_state(rd.hard_state)
        self.checker.persisted(nid, h.storage, rd.hard_state)
        self._changed.add(nid)
        for e in rd.committed_entries:
            self.checker.applied(nid, e)
            h.sm.append(e)
        if conf != h.storage.initial_state()[1]:
            h.storage.set_conf_state(conf)
        self.check()
        self._send(h, rd.messages)  # last: a lost message may re-enter handle_ready

    def _apply_ready(self, h: Host, node: RaftNode, rd: Ready) -> None:
        h.pending = None
        if rd.snapshot is not None:
            h.sm = list(self._snapshot_data(h.id, rd.snapshot))
            self.checker.restored(h.id, len(h.sm))
        for e in rd.committed_entries:
            self.checker.applied(h.id, e)
            h.sm.append(e)
        node.advance(rd)
        if node.conf_state != h.storage.initial_state()[1]:
            h.storage.set_conf_state(node.conf_state)

    def check(self) -> None:
        """The global invariants: one leader per term, committed entries durable."""
        for h in self.hosts.values():
            if h.raft is not None and h.raft.role == Role.LEADER:
                self.checker.leader(h.raft.term, h.id, "role")
        if self._changed or self.checker.commit_index != self._checked_commit:
            self.checker.durable({n: h.storage for n, h in self.hosts.items()}, self._changed)
            self._changed.clear()
            self._checked_commit = self.checker.commit_index

    # -- client and operator actions ---------------------------------------------------------
    def propose(self, nid: str, data: bytes) -> bool:
        """False if the node refused (ProposalDroppedError)."""
        return self._input(nid, f"propose {data!r}", lambda n: n.propose(data))

    def propose_batch(self, nid: str, datas: Sequence[bytes]) -> bool:
        return self._input(nid, f"propose {list(datas)!r}", lambda n: n.propose_batch(datas))

    def propose_conf_change(self, nid: str, cc: ConfChange) -> bool:
        return self._input(nid, f"conf change {cc.type.value} {cc.node_id}",
                           lambda n: n.propose_conf_change(cc))

    def transfer_leader(self, nid: str, to: str) -> None:
        self._input(nid, f"transfer to {to}", lambda n: n.transfer_leader(to))

    def campaign(self, nid: str) -> None:
        self._input(nid, "campaign", RaftNode.campaign)

    def compact(self, nid: str, keep: int = 0) -> bool:
        """Snapshot ``nid``'s state machine at its applied index, then drop the log before
        ``applied - keep`` (log GC). The snapshot's data names the state machine copy."""
        h = self.hosts[nid]
        st, applied = h.storage, len(h.sm)
        if applied <= st.snapshot().metadata.index:
            return False
        key = f"{nid}@{applied}/{self.now}".encode()
        self.snapshots[key] = tuple(h.sm)
        cs = h.raft.conf_state if h.raft is not None else st.initial_state()[1]
        st.create_snapshot(applied, cs, key)
        if applied - keep > st.first_index() - 1:
            st.compact(applied - keep)
        self._changed.add(nid)
        self.stats["compactions"] += 1
        self._note(f"compact {nid} at {applied} keep {keep}")
        return True

    # -- observation -------------------------------------------------------------------------
    def leader(self) -> str | None:
        """The live leader of the highest term, if any."""
        best: tuple[int, str] | None = None
        for h in self.live():
            if h.node.role == Role.LEADER and (best is None or h.node.term > best[0]):
                best = (h.node.term, h.id)
        return best[1] if best else None

    def n_applied(self, data: bytes) -> int:
        """How many hosts applied ``data`` (6.824 ``nCommitted``; agreement is the checker's)."""
        return sum(1 for h in self.hosts.values() if data in h.applied_data())

    def one(self, data: bytes, expected: int, max_ticks: int = 200) -> int:
        """6.824 ``cfg.one``: propose at whoever leads until ``expected`` hosts applied it."""
        proposed_at = -10**9
        for _ in range(max_ticks):
            if self.n_applied(data) >= expected:
                return next(e.index for h in self.hosts.values() for e in h.sm if e.data == data)
            lead = self.leader()
            if lead is not None and self.now - proposed_at >= 2 * self.options.election_tick:
                if self.propose(lead, data):
                    proposed_at = self.now
                self.drain()
            self.run(1)
        raise AssertionError(f"{data!r} was not applied by {expected} hosts in {max_ticks} ticks")

    def describe(self) -> str:
        """Every host's state and the last events, for failure messages."""
        hosts = "\n    ".join(
            f"{h.id}: {h.raft!r} applied={len(h.sm)} log=[{h.storage.first_index()}.."
            f"{h.storage.last_index()}] {h.storage.hard_state}" for h in self.hosts.values()
        )
        return (f"  now={self.now} commit={self.checker.commit_index} conf={self.checker.conf}\n"
                f"  hosts:\n    {hosts}\n  last events:\n    " + "\n    ".join(self.trace))

    # -- internals ---------------------------------------------------------------------------
    def _note(self, what: str) -> None:
        self.trace.append(f"[{self.now}] {what}")

    def _input(self, nid: str, what: str, call: Callable[[RaftNode], None]) -> bool:
        try:
            call(self.node(nid))
        except ProposalDroppedError:
            return False
        self._note(f"{what} at {nid}")
        self._after_input(nid)
        return True

    def _after_input(self, nid: str) -> None:
        if self.auto_ready >= 1.0 or self.rng.random() < self.auto_ready:
            while self.handle_ready(nid) and self.hosts[nid].pending is None:
                pass
        self.check()

    def _send(self, h: Host, msgs: Sequence[Message]) -> None:
        self.checker.sent(msgs)
        if self.record is not None:
            self.record.extend(msgs)
        net, rng = self.net, self.rng
        for m in sorted(msgs, key=lambda m: m.to):  # stable: per-destination order is kept
            if net.drop_rate and rng.random() < net.drop_rate:
                self._lost(Flight(self.now, m, h.incarnation))
                continue
            gen = self._gen(m)
            for _ in range(2 if net.dup_rate and rng.random() < net.dup_rate else 1):
                delay = rng.randint(0, net.max_delay) if net.max_delay else 0
                net.flights.append(Flight(self.now + delay, m, h.incarnation, gen))

    def _gen(self, m: Message) -> tuple[int, int]:
        src, dest = self.hosts.get(m.frm), self.hosts.get(m.to)
        return (src.generation if src else 0, dest.generation if dest else 0)

    def _pop_due(self, fifo: bool) -> Flight | None:
        due = [i for i, f in enumerate(self.net.flights) if f.due <= self.now]
        if not due:
            return None
        return self.net.flights.pop(due[0] if fifo else self.rng.choice(due))

    def _lost(self, f: Flight) -> None:
        self.stats["lost"] += 1
        sender = self.hosts.get(f.msg.frm)
        if sender is None or sender.raft is None or sender.incarnation != f.epoch:
            return
        if f.msg.type == _MT.SNAP:
            self._report_snapshot(f, ok=False)
        elif self.report_unreachable and f.msg.type == _MT.APP and self.rng.random() < 0.3:
            sender.raft.report_unreachable(f.msg.to)
            self._after_input(sender.id)

    def _report_snapshot(self, f: Flight, ok: bool) -> None:
        sender = self.hosts.get(f.msg.frm)
        if sender is not None and sender.raft is not None and sender.incarnation == f.epoch:
            sender.raft.report_snapshot(f.msg.to, ok=ok)
            self._after_input(sender.id)

    def _snapshot_data(self, nid: str, snap: Snapshot) -> tuple[Entry, ...]:
        sm = self.snapshots.get(snap.data)
        if sm is None:
            raise InvariantViolation(f"{nid} was handed a snapshot no replica made: {snap}")
        return sm
