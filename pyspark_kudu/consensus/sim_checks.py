"""Safety invariants the simulator checks after every step (Raft paper Fig. 3, §5.2-§5.4).

The :class:`SafetyChecker` watches what a replica *persists*, *sends* and *applies*, never
the core's internals, so it holds for any correct implementation of the ``Ready`` contract:

- **Election safety** (§5.2): at most one leader per term, over the whole history. Leaders
  are seen through their role and through leader-only messages (APP, HEARTBEAT, SNAP,
  TIMEOUT_NOW) carrying a term.
- **Log matching** (§5.3): two persisted entries with the same index and term are identical
  and are preceded by identical entries. Checked per appended entry: ``(index, term)`` must
  always follow the same ``term(index - 1)`` and carry the same payload.
- **Leader completeness** (§5.4): an entry committed in term ``t`` is in the persisted log of
  every leader of a term ``> t`` (checked on the leader's first persisted ``Ready``).
- **State-machine safety** (§5.4.3): every replica applies, in order and without gaps, the
  one entry committed at each index; a snapshot never rolls a state machine back.
- **Committed entries are never lost**: a replica that durably held a committed entry keeps
  it (in its log or under its snapshot), and the highest committed entry (by log matching,
  all before it too) is durable on ``ceil(|V| / 2)`` voters of the committed configuration
  ``V``: then every majority of ``V``, or of a configuration one change away, includes a
  holder. (A strict majority of ``V`` is not an invariant: right after ``V`` grew from 3 to
  4 voters, an entry committed on 2 of the old 3 is on 2 of 4.)
- At the end of a run, every member's configuration is the one its applied log produces.
- Persisted hard state is sane: terms never decrease, one vote per term, commit monotonic and
  within the persisted log; a replica never overwrites its own committed entries.

Violations raise :class:`InvariantViolation` (an ``AssertionError``).

The histories those properties are checked on come from :class:`RandomSchedule`, the
adversary (one random action per step, from the seed's ``random.Random``), and end with
:func:`check_liveness`: after healing, a leader emerges and a fresh proposal is applied by
every member of the committed configuration.

Thread-safety: not thread-safe; one checker belongs to one simulated cluster.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark_kudu.consensus.confchange import apply_conf_change
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
)
from pyspark_kudu.consensus.storage import MemoryStorage

if TYPE_CHECKING:  # sim imports this module; the cluster only appears in annotations here
    from pyspark_kudu.consensus.sim import Cluster, Host

__all__ = ["InvariantViolation", "RandomSchedule", "SafetyChecker", "check_liveness", "conf_after"]

_LEADER_ONLY = frozenset(
    {MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP, MessageType.TIMEOUT_NOW}
)


class InvariantViolation(AssertionError):
    """A Raft safety property failed; the message names the property and the replicas."""


def conf_after(entries: Iterable[Entry], start: ConfState | None = None) -> ConfState:
    """The configuration after applying every ``CONF_CHANGE`` in ``entries`` to ``start``."""
    cs = start or ConfState()
    for e in entries:
        if e.type == EntryType.CONF_CHANGE:
            new = apply_conf_change(cs, decode_conf_change(e.data))
            if new.voters:  # the core ignores a change that would leave no voter
                cs = new
    return cs


def holds(storage: MemoryStorage, index: int, term: int) -> bool:
    """Whether ``storage`` durably holds the entry ``(index, term)`` (or a snapshot past it)."""
    if index < storage.first_index() - 1:
        return True
    if index > storage.last_index():
        return False
    return storage.term(index) == term


class SafetyChecker:
    """Accumulates what the cluster persisted and applied; raises on the first violation."""

    def __init__(self) -> None:
        self.leader_of_term: dict[int, str] = {}
        self.committed: list[Entry] = [Entry(0, 0)]  # committed[i] is the entry at index i
        self.conf = ConfState()  # the configuration after the committed prefix
        self.conf_at: list[ConfState] = [self.conf]  # ... after each committed index
        self._commit_term: list[int] = [0]  # upper bound of the term each index committed in
        self._links: dict[tuple[int, int], tuple[int, EntryType, bytes]] = {}
        self._hard: dict[str, HardState] = {}
        self._applied: dict[str, int] = {}
        self._completeness_done: set[tuple[int, str]] = set()
        self._held: dict[str, int] = {}  # highest committed index each replica durably holds

    @property
    def commit_index(self) -> int:
        return len(self.committed) - 1

    # -- replica lifecycle -----------------------------------------------------------------
    def adopt(self, node: str, storage: MemoryStorage) -> None:
        """A replica starts from ``storage`` (a founder's bootstrap or a tombstoned copy)."""
        hs = storage.hard_state
        self._hard[node] = hs
        self._held[node] = 0
        if storage.last_index() >= storage.first_index():
            ents = storage.entries(storage.first_index(), storage.last_index() + 1)
            self.before_append(node, storage, ents, check_commit=False)
        self._observe_commit(node, storage, 0, hs.commit, hs.term)

    def restart(self, node: str, applied: int) -> None:
        """A replica restarts with its state machine at ``applied``."""
        self._applied[node] = applied

    # -- leaders ---------------------------------------------------------------------------
    def leader(self, term: int, node: str, how: str) -> None:
        prev = self.leader_of_term.setdefault(term, node)
        if prev != node:
            raise InvariantViolation(
                f"election safety (§5.2): term {term} has two leaders, {prev} and {node} ({how})"
            )

    def sent(self, msgs: Iterable[Message]) -> None:
        for m in msgs:
            if m.type in _LEADER_ONLY:
                self.leader(m.term, m.frm, f"{m.frm} sent {m.type.value} at term {m.term}")

    # -- persistence -----------------------------------------------------------------------
    def before_append(
        self, node: str, storage: MemoryStorage, entries: Iterable[Entry], check_commit: bool = True
    ) -> None:
        """Log matching for entries about to be appended to ``storage``."""
        commit = self._hard.get(node, HardState()).commit if check_commit else 0
        floor = storage.first_index() - 1
        last: int | None = None
        prev_term: int | None = None
        for e in entries:
            if last is not None and e.index != last + 1:
                raise InvariantViolation(
                    f"{node}: Ready.entries are not contiguous ({last} then {e.index})"
                )
            last = e.index
            if e.index <= floor:
                continue  # already covered by this replica's snapshot
            if prev_term is None:
                if e.index - 1 > storage.last_index():
                    raise InvariantViolation(
                        f"{node}: Ready.entries start at {e.index} but the persisted log ends "
                        f"at {storage.last_index()} (a gap)"
                    )
                prev_term = storage.term(e.index - 1)
            if e.index <= min(commit, storage.last_index()) and storage.term(e.index) != e.term:
                raise InvariantViolation(
                    f"{node}: overwrites its committed entry {e.index} (term "
                    f"{storage.term(e.index)}, commit {commit}) with one of term {e.term}"
                )
            link = (prev_term, e.type, e.data)
            known = self._links.setdefault((e.index, e.term), link)
            if known != link:
                raise InvariantViolation(
                    f"log matching (§5.3): {node} persists entry (index {e.index}, term {e.term}) "
                    f"after term {prev_term} with payload {e.data[:40]!r}; another replica has "
                    f"it after term {known[0]} with payload {known[2][:40]!r}"
                )
            prev_term = e.term

    def before_restore(self, node: str, snap: Snapshot, applied_data: list[Entry]) -> None:
        md = snap.metadata
        applied = self._applied.get(node, 0)
        if md.index <= applied:
            raise InvariantViolation(
                f"{node}: handed a snapshot at index {md.index} while its state machine has "
                f"applied {applied} (a state machine must never roll back)"
            )
        if md.index > self.commit_index or self.committed[md.index].term != md.term:
            raise InvariantViolation(
                f"{node}: snapshot (index {md.index}, term {md.term}) does not match the "
                f"committed log (commit {self.commit_index})"
            )
        if len(applied_data) != md.index or (applied_data and applied_data[-1].term != md.term):
            raise InvariantViolation(f"{node}: snapshot data does not describe index {md.index}")

    def persisted(self, node: str, storage: MemoryStorage, hs: HardState | None) -> None:
        """``storage`` now holds a ``Ready``'s snapshot, entries and hard state."""
        if hs is None:
            return
        old = self._hard.get(node, HardState())
        problem = ""
        if hs.term < old.term:
            problem = f"term went back from {old.term} to {hs.term}"
        elif hs.term == old.term and old.vote not in (NONE, hs.vote):
            problem = f"voted for {old.vote} and then {hs.vote!r} in term {hs.term}"
        elif hs.commit < old.commit:
            problem = f"commit went back from {old.commit} to {hs.commit}"
        elif hs.commit > storage.last_index():
            problem = f"commit {hs.commit} is beyond its persisted log ({storage.last_index()})"
        elif hs.commit < (snap := storage.snapshot().metadata.index):
            problem = f"commit {hs.commit} is below its snapshot {snap}"
        if problem:
            raise InvariantViolation(f"{node}: persisted hard state is wrong: {problem}")
        self._hard[node] = hs
        self._observe_commit(node, storage, old.commit, hs.commit, hs.term)

    def _observe_commit(
        self, node: str, storage: MemoryStorage, lo: int, hi: int, term: int
    ) -> None:
        if hi <= lo:
            return
        first = max(lo + 1, storage.first_index())
        ents = storage.entries(first, hi + 1) if first <= hi else []
        for e in ents:
            if e.index <= self.commit_index:
                if e != self.committed[e.index]:
                    raise InvariantViolation(
                        f"state-machine safety: {node} committed {e} at index {e.index}, but "
                        f"{self.committed[e.index]} was committed there before"
                    )
                continue
            if e.index != self.commit_index + 1:
                raise InvariantViolation(
                    f"{node} committed index {e.index} but nobody committed {self.commit_index + 1}"
                )
            self.committed.append(e)
            self._commit_term.append(term)
            self.conf = conf_after((e,), self.conf)
            self.conf_at.append(self.conf)
        if hi > self.commit_index:
            raise InvariantViolation(
                f"{node} committed up to {hi} from a snapshot nobody else committed "
                f"(global commit {self.commit_index})"
            )

    def leader_persisted(self, node: str, storage: MemoryStorage, term: int) -> None:
        """Leader completeness (§5.4), once per (term, leader), after its first persisted Ready."""
        if (term, node) in self._completeness_done:
            return
        self._completeness_done.add((term, node))
        for i in range(self.commit_index, 0, -1):
            if self._commit_term[i] < term:
                e = self.committed[i]
                if not holds(storage, i, e.term):
                    raise InvariantViolation(
                        f"leader completeness (§5.4): {node}, leader of term {term}, lacks entry "
                        f"{i} (term {e.term}) committed by term {self._commit_term[i]}"
                    )
                return  # log matching covers everything before i

    # -- application -----------------------------------------------------------------------
    def applied(self, node: str, e: Entry) -> None:
        want = self._applied.get(node, 0) + 1
        if e.index != want:
            raise InvariantViolation(
                f"{node}: applied index {e.index} but its state machine expected {want}"
            )
        if e.index > self.commit_index or e != self.committed[e.index]:
            have = self.committed[e.index] if e.index <= self.commit_index else "nothing"
            raise InvariantViolation(
                f"state-machine safety (§5.4.3): {node} applied {e} at index {e.index}, but "
                f"the committed entry there is {have}"
            )
        self._applied[node] = e.index

    def restored(self, node: str, index: int) -> None:
        self._applied[node] = index

    def configuration(self, node: str, applied: int, conf: ConfState) -> None:
        """A replica that applied ``applied`` entries uses the configuration they produce."""
        if conf != self.conf_at[applied]:
            raise InvariantViolation(
                f"{node} applied {applied} entries but uses {conf}; the committed log gives "
                f"{self.conf_at[applied]}"
            )

    # -- global, after every step ----------------------------------------------------------
    def durable(
        self, storages: Mapping[str, MemoryStorage], changed: Iterable[str] | None = None
    ) -> None:
        """No replica loses a committed entry it held, and the committed prefix is held by
        enough voters of the committed configuration. ``changed``: the replicas whose
        storage changed since the last call (default: all)."""
        c = self.commit_index
        if c == 0:
            return
        for node in storages if changed is None else changed:
            st = storages[node]
            held = self._held.get(node, 0)
            if held and not holds(st, held, self.committed[held].term):
                raise InvariantViolation(
                    f"{node} lost committed entry {held} (term {self.committed[held].term}) "
                    f"from its persisted log [{st.first_index()}..{st.last_index()}]"
                )
            top = min(st.last_index(), c)
            if top > held and holds(st, top, self.committed[top].term):
                self._held[node] = top
        term = self.committed[c].term
        voters = sorted(self.conf.voters)
        holders = [v for v in voters if v in storages and holds(storages[v], c, term)]
        if len(holders) < (len(voters) + 1) // 2:
            raise InvariantViolation(
                f"committed entry {c} (term {term}) is durable only on {holders} of voters "
                f"{voters}: a majority could elect a leader without it"
            )


# == the random schedule and the liveness check ==============================================


class RandomSchedule:
    """The adversary: one random action per step (deliver a due message, tick, propose,
    crash or restart a replica, partition or heal, change membership, compact...), drawn from
    ``rng``, with the cluster's checks after every step."""

    def __init__(
        self, c: Cluster, rng: random.Random, nodes: int, membership: bool, compaction: bool
    ) -> None:
        self.c, self.rng, self.nodes = c, rng, nodes
        self.proposals = 0
        self.actions: list[tuple[Callable[[], object], float]] = [
            (c.tick, 4.0), (lambda: self._on(c.live(), lambda h: c.tick([h.id])), 0.5),
            (self.propose, 3.0), (self.transfer, 0.3),
            (lambda: self._on(c.live(), lambda h: c.campaign(h.id)), 0.15),
            (lambda: self._on(c.live(), lambda h: c.crash(h.id)), 0.3), (self.restart, 1.0),
            (self.partition, 0.3), (c.recover, 0.4),
        ]
        if membership:
            self.actions += [(self.membership, 1.0), (self.retire, 0.3)]
        if compaction:
            self.actions.append((lambda: self._on(
                [h for h in c.hosts.values() if h.sm],
                lambda h: c.compact(h.id, keep=rng.choice([0, 0, 2, 5]))), 0.5))

    def _on(self, hosts: Sequence[Host], act: Callable[[Host], object]) -> None:
        if hosts:
            act(self.rng.choice(hosts))

    # -- actions -----------------------------------------------------------------------------
    def step(self) -> None:
        c = self.c
        acts = list(self.actions)
        if any(f.due <= c.now for f in c.net.flights):
            acts.append((self.deliver, 30.0))
        if c.auto_ready < 1.0 or c.split_ready:
            acts.append((lambda: self._on(
                [h for h in c.live() if h.pending or h.node.has_ready()],
                lambda h: c.handle_ready(h.id)), 6.0))
        self.rng.choices([a for a, _ in acts], [w for _, w in acts])[0]()
        c.check()

    def deliver(self) -> None:
        f = self.c._pop_due(fifo=False)
        if f is not None:
            self.c.deliver(f)

    def propose(self) -> None:
        c = self.c
        lead = c.leader()
        target = lead if lead is not None and self.rng.random() < 0.9 else None
        if target is None and c.live():
            target = self.rng.choice(c.live()).id  # most likely refused: not the leader
        if target is None:
            return
        n = self.rng.choice([1, 1, 1, 3])  # sometimes a batch (one AppendEntries for all)
        datas = [f"p{self.proposals + i}".encode() for i in range(1, n + 1)]
        self.proposals += n
        if c.propose_batch(target, datas):
            c.stats["proposals"] += n

    def transfer(self) -> None:
        """To a voter, a learner, itself or a stranger: all must be handled."""
        lead = self.c.leader()
        if lead is not None:
            self.c.transfer_leader(lead, self.rng.choice(sorted(self.c.hosts)))
            self.c.stats["transfers"] += 1

    def restart(self) -> None:
        """A crashed replica comes back, unless it was retired and is not a member again."""
        members = self.c.checker.conf.members()
        down = [h.id for h in self.c.hosts.values()
                if not h.alive and h.starts > 0 and (h.id in members or not h.retired)]
        if down:
            self.c.start(self.rng.choice(down), volatile=self.rng.random() < 0.3)
            self.c.stats["restarts"] += 1

    def partition(self) -> None:
        c, rng = self.c, self.rng
        ids = sorted(c.hosts)
        kind = rng.choice(["isolate", "split", "one-way"])
        if kind == "isolate":
            c.isolate(rng.choice(ids))
        elif kind == "split":
            rng.shuffle(ids)
            k = rng.randint(1, len(ids) // 2)
            c.partition(ids[:k], ids[k:])
        else:
            for _ in range(rng.randint(1, len(ids))):
                a, b = rng.sample(ids, 2)
                c.cut(a, b, one_way=True)
        c.stats[f"partition_{kind}"] += 1
        c._note(f"partition {kind}: {sorted(c.net.cut_links)}")

    def retire(self) -> None:
        """Shut down a replica neither the committed nor the leader's configuration has."""
        c = self.c
        lead = c.leader()
        keep = c.checker.conf.members() | (c.node(lead).conf_state.members() if lead else set())
        out = sorted(h.id for h in c.live() if h.id not in keep)
        if out:
            nid = self.rng.choice(out)
            c.crash(nid)
            c.hosts[nid].retired = True
            c.stats["retired"] += 1

    def membership(self) -> None:
        """One-by-one change at the leader: add learner, promote, demote, remove, re-add."""
        c, rng = self.c, self.rng
        lead = c.leader()
        if lead is None:
            return
        node = c.node(lead)
        cs, committed = node.conf_state, c.checker.conf
        progress = node.status().progress
        options: list[ConfChange] = []
        for nid in sorted(c.hosts):
            if nid not in cs.members() and nid not in committed.members():
                options.append(ConfChange(ConfChangeType.ADD_LEARNER, nid))
        for nid in sorted(cs.learners):
            caught_up = progress.get(nid, (0, 0))[0] + 3 >= node.commit_index
            if len(cs.voters) <= self.nodes and caught_up:
                options.append(ConfChange(ConfChangeType.ADD_VOTER, nid))
        # Rarely the leader itself: it must step down once the change is applied.
        others = cs.members() - ({lead} if rng.random() < 0.9 else set())
        for nid in sorted(others):
            if nid in cs.learners or len(cs.voters) > max(2, self.nodes - 1):
                options.append(ConfChange(ConfChangeType.REMOVE, nid))
                if nid in cs.voters and rng.random() < 0.3:
                    options.append(ConfChange(ConfChangeType.ADD_LEARNER, nid))
        if not options:
            return
        cc = rng.choice(options)
        h = c.hosts[cc.node_id]
        if cc.type == ConfChangeType.ADD_LEARNER and cc.node_id not in cs.members() and not h.alive:
            if h.starts > 0 and rng.random() < 0.5 and c.forgotten(cc.node_id):
                c.tombstone(cc.node_id)
                c.stats["tombstones"] += 1
            c.stats["rejoins" if h.starts else "joins"] += 1
            c.start(cc.node_id)
        if c.propose_conf_change(lead, cc):
            c.stats[f"conf_{cc.type.value}"] += 1

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


def check_liveness(c: Cluster, token: bytes, election_timeouts: int = 60) -> None:
    """Heal the network, run the committed configuration's replicas (only them) and tick:
    a leader must emerge and ``token``, proposed to it, must be applied by every member,
    whose configuration must then be the one its applied log produces."""
    c.recover()
    c.net.drop_rate = c.net.dup_rate = 0.0
    c.net.max_delay = 0
    for f in c.net.flights:
        f.due = min(f.due, c.now)
    c.auto_ready, c.split_ready = 1.0, 0.0
    c._note("settle")
    election = c.options.election_tick
    proposed_at = -10**9
    for _ in range(election_timeouts * election):
        members = c.checker.conf.members()
        for h in list(c.hosts.values()):
            if h.alive and h.id not in members:
                c.crash(h.id)
                h.retired = True
            elif not h.alive and h.id in members:
                c.start(h.id)
        c.run(1)
        lead = c.leader()
        due = c.now - proposed_at > 3 * election
        if lead is not None and due and token not in c.hosts[lead].applied_data():
            if c.propose(lead, token):
                proposed_at = c.now
                c.drain()
        members = c.checker.conf.members()
        if all(token in c.hosts[m].applied_data() for m in members):
            for m in members:  # all past any snapshot's (newer) configuration by now
                h = c.hosts[m]
                c.checker.configuration(m, len(h.sm), h.node.conf_state)
            return
    lagging = {m: (len(c.hosts[m].sm), c.hosts[m].alive) for m in sorted(members)}
    raise InvariantViolation(
        f"liveness: after healing and {election_timeouts * election} quiet ticks, {token!r} "
        f"is not applied by every member of {c.checker.conf} (leader {c.leader()}, "
        f"applied {lagging})"
    )
