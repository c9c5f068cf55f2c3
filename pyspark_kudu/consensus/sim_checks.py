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
- **One change at a time** (thesis §4.1, with configurations taking effect when applied):
  a replica's persisted log holds at most one configuration change above its persisted
  commit index, so its configuration is at most one change behind its log's. A leader
  that proposed a change before recording the previous one as committed (e.g. the tablet
  driver persisting a carried commit index after the next entries) breaks it.
- Persisted hard state is sane: terms never decrease, one vote per term, commit monotonic and
  within the persisted log; a replica never overwrites its own committed entries.

Violations raise :class:`InvariantViolation` (an ``AssertionError``).

The checkers know nothing of the simulated cluster: :mod:`pyspark_kudu.consensus.sim` feeds
them, and :mod:`pyspark_kudu.consensus.sim_run` drives the seeded histories (the adversary and
the liveness check). Neither is imported here.

Thread-safety: not thread-safe; one checker belongs to one simulated cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyspark_kudu.consensus.confchange import apply_conf_change
from pyspark_kudu.consensus.messages import (
    NONE,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    decode_conf_change,
)
from pyspark_kudu.consensus.raft_storage import MemoryStorage

__all__ = ["InvariantViolation", "SafetyChecker", "conf_after"]

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
        if hs is not None:
            self._persisted_hard_state(node, storage, hs)
        commit = max(self._hard.get(node, HardState()).commit, storage.first_index() - 1)
        if storage.last_index() > commit:
            tail = storage.entries(commit + 1, storage.last_index() + 1)
            changes = [e.index for e in tail if e.type == EntryType.CONF_CHANGE]
            if len(changes) > 1:
                raise InvariantViolation(
                    f"one change at a time (§4.1): {node} persisted configuration changes "
                    f"{changes} above its commit index {commit}")

    def _persisted_hard_state(self, node: str, storage: MemoryStorage, hs: HardState) -> None:
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
