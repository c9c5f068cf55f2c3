"""The WAL's in-memory cache of recent entries, under a process-wide budget.

A replica reads its entries back soon after appending them: the leader's replica applies
them within the round that commits them, the resident server's background applier applies
the rest (a chunk at a time, each chunk handed up to 16 MiB of committed entries by a fresh
``RaftNode``), and every request that learns of a commit without applying it is handed the
first of them too. Reading an entry from its segment costs a ``pread``, a CRC check and
copies of the whole frame. With the former 4 MiB per-log cache, which could not hold even one
65,536-row batch of a 7-column composite-key table (4-5 MiB), re-reading entries was 22% of
the tablet servers' CPU in a 10M-row composite insert (py-spy, 6 servers).

Kudu keeps the same kind of cache (``LogCache``: 128 MiB per tablet under a server-wide
1 GiB). Here each log's cache (:class:`EntryCache`, ``WalOptions.cache_bytes``) is bounded,
and :data:`ENTRY_CACHES` bounds all of a process's caches together; the resident tablet
server sets that budget to a quarter of its replica budget
(:mod:`~pyspark_kudu.spark.host.replica_cache`).

**What is kept.** A replica reads its entries in index order, from the first one it has not
applied, so a log's cache keeps a window of the entries next in line: the apply path tells the
log what it applied (:meth:`EntryCache.release`, through ``WalStorage.release_applied``),
which leaves the cache, and a full cache takes no newer entry (it is read from its segment
once the replica gets to it, and kept then if there is room) rather than evicting older ones
the replica needs first. Evicting the oldest instead (measured with that policy first), the
background applier of a replica that lagged behind by more than the cache read its next
entries back from disk again and again (each chunk is handed 16 MiB and applies what fits
in half a second): re-reads still took 11% of the servers' CPU.

**Across logs.** When the caches together exceed the budget, the cache that added an entry
least recently sheds entries first (an idle replica's; its newest ones, which it needs last),
the one adding now last; a cache busy on another thread is skipped, never waited for.

Thread-safety: every method may be called from any thread. Each cache has its own lock, never
held while taking another cache's lock or the budget's; the budget takes a cache's lock only
with ``blocking=False`` (or the caller's own cache, whose lock it does not hold then).
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

from pyspark_kudu.consensus.messages import Entry

__all__ = ["DEFAULT_ENTRY_CACHE_BUDGET", "ENTRY_CACHES", "EntryCache", "EntryCacheBudget"]

#: Default budget of all WAL entry caches of one process (the tablet server sets its own).
DEFAULT_ENTRY_CACHE_BUDGET = 128 << 20


class EntryCache:
    """One log's cache of entries, at most ``limit_bytes`` (``Entry.size()``; module
    docstring). ``budget``: the process-wide bound it counts against (``None``: only its
    own limit)."""

    def __init__(self, limit_bytes: int, budget: EntryCacheBudget | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, Entry] = {}
        self._order: list[int] = []  # the indexes of ``_entries``, ascending
        self._bytes = 0
        self._limit = limit_bytes
        self._released = -1  # entries up to this index were applied
        self._budget = budget
        if budget is not None:
            budget.register(self)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, index: int) -> Entry | None:
        with self._lock:
            return self._entries.get(index)

    def indexes(self) -> list[int]:
        """The indexes of the entries kept, ascending."""
        with self._lock:
            return list(self._order)

    def put(self, e: Entry) -> None:
        """Keep ``e`` (appended, or read back from disk) if it is not applied yet and there
        is room; an entry of the same index is replaced."""
        size = e.size()
        if size > self._limit:
            return
        with self._lock:
            old = self._entries.get(e.index)
            if old is not None:
                self._entries[e.index] = e
                self._bytes += size - old.size()
            elif e.index <= self._released or self._bytes + size > self._limit:
                return  # applied already, or the entries before it are needed first
            else:
                self._entries[e.index] = e
                self._bytes += size
                if not self._order or e.index > self._order[-1]:
                    self._order.append(e.index)
                else:
                    bisect.insort(self._order, e.index)
        if self._budget is not None:
            self._budget.enforce(self)

    def release(self, through: int) -> None:
        """Entries up to ``through`` were applied: evict them."""
        with self._lock:
            self._released = max(self._released, through)
            k = bisect.bisect_right(self._order, through)
            for i in self._order[:k]:
                self._bytes -= self._entries.pop(i).size()
            del self._order[:k]

    def forget(self, doomed: Callable[[int], bool]) -> None:
        """Drop the entries whose index ``doomed`` says (truncated or garbage-collected)."""
        with self._lock:
            gone = [i for i in self._order if doomed(i)]
            if not gone:
                return
            for i in gone:
                self._bytes -= self._entries.pop(i).size()
            self._order = [i for i in self._order if i in self._entries]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._order.clear()
            self._bytes = 0

    def shed(self, want: int, *, blocking: bool) -> int:
        """Free about ``want`` bytes for the budget, newest entries first (the replica
        gets to them last). Returns the bytes freed (0 without waiting if the cache is busy
        and not ``blocking``)."""
        if not self._lock.acquire(blocking=blocking):
            return 0
        try:
            freed = 0
            while self._order and freed < want:
                freed += self._entries.pop(self._order.pop()).size()
            self._bytes -= freed
            return freed
        finally:
            self._lock.release()


class EntryCacheBudget:
    """A byte budget over every :class:`EntryCache` registered with it (module docstring)."""

    def __init__(self, budget_bytes: int = DEFAULT_ENTRY_CACHE_BUDGET) -> None:
        self._lock = threading.Lock()
        self._budget: Callable[[], int] = lambda: budget_bytes
        # id(cache) -> cache, least recently added to first
        self._caches: OrderedDict[int, weakref.ref[EntryCache]] = OrderedDict()
        self.shed_bytes = 0  # bytes evicted for the budget since the process started

    @property
    def budget_bytes(self) -> int:
        return max(0, int(self._budget()))

    def set_budget(self, budget: int | Callable[[], int]) -> None:
        """A fixed budget in bytes, or a function returning it (e.g. reading a setting)."""
        with self._lock:
            self._budget = budget if callable(budget) else (lambda: int(budget))

    def register(self, cache: EntryCache) -> None:
        key = id(cache)

        def gone(_: object) -> None:
            with self._lock:
                if (ref := self._caches.get(key)) is not None and ref() is None:
                    del self._caches[key]

        with self._lock:
            self._caches[key] = weakref.ref(cache, gone)

    def _live(self) -> list[EntryCache]:
        """(Lock held.) The live caches, least recently added to first."""
        out = []
        for ref in self._caches.values():
            c = ref()
            if c is not None:
                out.append(c)
        return out

    def total_bytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._live())

    def enforce(self, current: EntryCache) -> None:
        """(``current`` just added an entry; its lock is not held.) Make it the most
        recently added to, then shed entries until the caches fit the budget."""
        budget = self.budget_bytes
        with self._lock:
            key = id(current)
            if key in self._caches:
                self._caches.move_to_end(key)
            caches = self._live()
        over = sum(c.nbytes for c in caches) - budget
        for victim in caches:  # ends with ``current``
            if over <= 0:
                return
            if victim.nbytes == 0:
                continue
            freed = victim.shed(over, blocking=victim is current)
            over -= freed
            with self._lock:
                self.shed_bytes += freed


#: The budget every log of this process counts against (``wal.log.Log``).
ENTRY_CACHES = EntryCacheBudget()
