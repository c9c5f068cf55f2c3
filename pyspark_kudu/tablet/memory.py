"""Process-wide bounds on what open tablets keep in memory besides their MemRowSets.

**Key indexes** (:class:`~pyspark_kudu.tablet.keys.KeyIndex`, and the key columns a flush
keeps to build one) are what the write path probes to find a key's newest version; one holds
the key, ``ts`` and ``end`` of every row of its rowset, so together they grow with the
tablets. :data:`KEY_INDEXES` keeps their total under a budget: after each applied entry the
tablet reports its rowsets, and the least recently used tablets' indexes are dropped until
the total fits. A dropped index is rebuilt from its rowset file (and the deltas, which stay in
memory) by the next write that needs it: memory is bounded, at the price of re-reading key
columns when the tablets a host writes to hold more keys than the budget.

An index is dropped only under its tablet's lock -- taken without waiting, so an index a
write on another thread is using right now is skipped this time -- or by the tablet that is
reporting, after its entry was applied (nothing uses an index between entries).

:func:`release_unused_memory` hands memory freed by large operations (a flush, a compaction,
closed replicas: the tablet and the replica cache call it then) back to the operating system:
Arrow's allocator and glibc's ``malloc`` keep freed pages for reuse otherwise, which keeps a
process's RSS at its high-water mark.

:func:`return_large_frees_to_os` (the resident tablet server calls it at start) fixes glibc's
mmap threshold at :data:`MMAP_THRESHOLD_BYTES` (32 MiB): every allocation from that size up
gets its own mapping, handed back to the OS when freed. By default glibc starts the threshold
at 128 KiB and raises it to the size of each large block freed (up to 32 MiB), raising its
heap trim threshold to twice that with it; then freed blocks stay in its per-thread arenas,
whose 64 MiB heaps stay resident once filled. Fixing the threshold keeps the trim threshold at
its 128 KiB, so arenas give freed space at their top back at once, and ``malloc_trim``
(:func:`release_unused_memory`) the rest after a flush or a compaction.

Why 32 MiB and not lower: until 2026-11-30 the threshold was 1 MiB, so that every large block
(decoded entries, numpy arrays of keys and hashes, flush buffers) was its own mapping. Each
such block is then mapped, its pages faulted in and zeroed by the kernel, and unmapped again,
on every use: in a 10M-row composite-key upsert or insert (6 servers, RF=3) the servers
took 5.2M page faults per write, and the kernel's share of their CPU (``stime``) was 20
of 46 CPU-s; a profile of the servers (``perf``) had 23% of their samples in page faults
(16% zeroing pages) even at 32 MiB. At 32 MiB: 1.8M faults and 12.7 CPU-s of kernel time per
write, the servers' CPU for each write until applied everywhere 46 -> 36 CPU-s (upsert) and
44 -> 37 (insert); their peak RSS 589-728 MiB against 570-685 (upsert) and 645-838 against
639-742 (insert), the same within noise. Leaving the trim threshold to grow as well (1 GiB)
saved 2 more CPU-s and raised the peak RSS by ~15%, so it stays at glibc's 128 KiB.
In one replica's apply of 10M composite-key rows in one process: 16.1 s and 0.25M faults
with glibc's defaults, 22.5 s and 2.95M faults with the 1 MiB threshold.

Before that (the 1 MiB threshold against glibc's defaults), measured after a 10M-row
composite-key insert: servers' RSS 629-880 and 570-973 MiB with the fixed threshold against
875-1,118 and 1,072-1,203 MiB without (two runs each; the second with
``MALLOC_ARENA_MAX=2``), peak 991-1,166 and 736-1,129 against 1,116-1,322 and 1,168-1,365
MiB; the several fully resident 62 MiB arena heaps per server seen in
``/proc/<pid>/smaps`` were gone.

Thread-safety: :class:`KeyIndexBudget` is thread-safe (one internal lock, never held while
taking a tablet's lock).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from pyspark_kudu.tablet.rowset import DiskRowSet

__all__ = [
    "DEFAULT_KEY_INDEX_BUDGET",
    "KEY_INDEXES",
    "MMAP_THRESHOLD_BYTES",
    "KeyIndexBudget",
    "release_unused_memory",
    "return_large_frees_to_os",
]

DEFAULT_KEY_INDEX_BUDGET = 256 << 20


class KeyIndexBudget:
    """LRU of the rowsets holding a key index, with a byte budget (module docstring)."""

    def __init__(self, budget_bytes: int = DEFAULT_KEY_INDEX_BUDGET) -> None:
        self._lock = threading.Lock()
        self._budget: Callable[[], int] = lambda: budget_bytes
        # id(rowset) -> (rowset ref, owner lock, bytes); least recently used first.
        self._entries: OrderedDict[int, tuple[weakref.ref[DiskRowSet], Any, int]] = (
            OrderedDict())
        self._owned: dict[int, set[int]] = {}  # id(owner lock) -> ids of its rowsets
        self.dropped = 0  # indexes dropped for the budget since the process started

    @property
    def budget_bytes(self) -> int:
        return max(1, int(self._budget()))

    @property
    def budget(self) -> Callable[[], int]:
        """What the budget is read from (each time it is enforced)."""
        return self._budget

    def set_budget(self, budget: int | Callable[[], int]) -> None:
        """A fixed budget in bytes, or a function returning it (e.g. reading a setting)."""
        with self._lock:
            self._budget = budget if callable(budget) else (lambda: int(budget))

    def total_bytes(self) -> int:
        with self._lock:
            return self._total_locked()

    def _total_locked(self) -> int:
        """Bytes of the live entries; entries of rowsets that were garbage-collected (their
        tablet closed) are forgotten here."""
        dead = [k for k, e in self._entries.items() if e[0]() is None]
        for k in dead:
            del self._entries[k]
        for mine in self._owned.values():
            mine.difference_update(dead)
        return sum(e[2] for e in self._entries.values())

    def note(self, owner: Any, rowsets: Sequence[DiskRowSet]) -> None:
        """(Under ``owner``, the tablet's lock.) The tablet's current rowsets were just used:
        record what their indexes hold, most recently used, and forget its retired ones."""
        with self._lock:
            mine = self._owned.setdefault(id(owner), set())
            current = set()
            for rs in rowsets:
                size = rs.memory_bytes()
                if not size:
                    continue
                current.add(id(rs))
                self._entries.pop(id(rs), None)
                self._entries[id(rs)] = (weakref.ref(rs), owner, size)
            for gone in mine - current:
                entry = self._entries.get(gone)
                if entry is not None and entry[1] is owner:  # ids of dead objects get reused
                    del self._entries[gone]
            self._owned[id(owner)] = current
            if not current:
                del self._owned[id(owner)]

    def enforce(self, owner: Any) -> int:
        """(Under ``owner``, the reporting tablet's lock, between entries.) Drop least
        recently used indexes until the total fits; returns the bytes dropped."""
        dropped = 0
        skipped: set[int] = set()
        budget = self.budget_bytes
        while True:
            with self._lock:
                if self._total_locked() <= budget:
                    return dropped
                victim = next((k for k in self._entries if k not in skipped), None)
                if victim is None:
                    return dropped
                ref, lock, _ = self._entries[victim]
            rs = ref()
            if rs is None:
                self._forget(victim, lock)
                continue
            if lock is owner:
                freed = rs.drop_index()
            elif lock.acquire(blocking=False):
                try:
                    freed = rs.drop_index()
                finally:
                    lock.release()
            else:
                skipped.add(victim)  # in use by a write on another thread
                continue
            self._forget(victim, lock)
            if freed:
                dropped += freed
                with self._lock:
                    self.dropped += 1

    def _forget(self, key: int, owner: Any) -> None:
        with self._lock:
            self._entries.pop(key, None)
            mine = self._owned.get(id(owner))
            if mine is not None:
                mine.discard(key)
                if not mine:
                    del self._owned[id(owner)]


KEY_INDEXES = KeyIndexBudget()
"""The process's key index budget (the host layer sets it from its memory budget)."""

#: Allocations from this size up get a mapping of their own (module docstring).
MMAP_THRESHOLD_BYTES = 32 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_libc: Any = None


def _glibc() -> Any:
    """glibc through ctypes, or False where the C library has no ``malloc_trim``."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
            if _libc and not hasattr(_libc, "malloc_trim"):
                _libc = False
        except OSError:
            _libc = False
    return _libc


def release_unused_memory() -> None:
    """Return freed memory to the OS: Arrow's pool and glibc's heap (module docstring)."""
    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc:
        libc.malloc_trim(0)


def return_large_frees_to_os(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process (module
    docstring). Returns whether it was set: not where the C library is not glibc, nor when
    ``MALLOC_MMAP_THRESHOLD_`` is in the environment (glibc applies that one itself)."""
    libc = _glibc()
    if not libc or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
