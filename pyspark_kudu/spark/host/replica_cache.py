"""Open replicas kept across tasks in one executor Python worker (a per-process cache).

Opening a replica costs a WAL recovery scan (every segment is read and CRC-checked) and a
tablet bootstrap (replay since the last flush): both grow with the replica. A pinned task
therefore reuses the ``WalStorage`` and ``Tablet`` a previous task of the same worker process
left open, **if no other process touched the replica since**.

Several processes may serve one replica: Python workers of one executor, and executors of
other Spark applications on the same host. Each request holds the replica's ``flock``
(``<tablet>/lock``); a request that may change the replica first writes a new random token to
``<tablet>/generation`` (before any change, so a crash mid-request still invalidates other
caches). A cached handle is used only when the generation on disk is the one it left;
otherwise it is closed and the replica reopened. Tokens are random, not a counter: a replica
deleted and created again (WIPE, a lost disk) must never match a handle another process
kept of its previous incarnation, and a counter would restart from the same values. The
file is not fsynced: it only has to agree between processes of one host, which share the
page cache, and a host crash ends every cache anyway.

**Memory budget**: the open replicas of a process hold their MemRowSets and key indexes.
``PYSPARK_KUDU_REPLICA_CACHE_MB`` (512 MiB by default; with rounds served by the host's
resident tablet server this is the host's budget) bounds them in three ways: key indexes
may take half of it (:data:`~pyspark_kudu.tablet.memory.KEY_INDEXES`: the least recently
used tablets' indexes are dropped after each applied entry, and rebuilt from their files
when a write needs them again); the host's maintenance flushes the largest MemRowSets once
they pass half of it (:mod:`~pyspark_kudu.spark.host.maintenance_manager`); and when the
estimated total still exceeds it, the least recently used replicas not in use are closed
until it fits (a replica closed for memory rarely has much to replay when reopened).

On release the lazily kept commit index is persisted (``WalStorage.sync_commit``), so a
process that reopens the replica sees it. A request that fails drops its handle (the storage
may be failed; recovery on reopen decides what survived). At most ``CACHE_LIMIT`` replicas
stay open per process; the least recently used are closed. Closing a cached handle never
writes (``WalStorage.detach``: no segment truncation, which would cut entries another
process appended since; ``Tablet.close`` does not flush).

**Two locks per replica** (Kudu's split of the log from the tablet). Between processes a
replica is exclusive: the ``flock`` is held by one process at a time, for as long as any of
its threads uses the replica (a *holding*: the first thread takes it, the last releases it).
Inside the holding process a request takes what it touches, in this order:

- ``"tablet"``: the tablet only (the background applier's chunks, MemRowSet flushes,
  maintenance); it reads the log under the log lock for moments (``ReplicaHandle.wal_lock``,
  also taken by the tablet's :class:`WalCommittedLog`);
- ``"wal"``: the log only (a round's appends and hard states when it applies nothing, log
  reads): such a request never waits for an apply or a flush. One that finds it must apply
  after all (a configuration entry commits) raises :class:`NeedsTablet` and is run again in
  full;
- ``"full"``: both, tablet lock first (scans catching up, copies, a leader's apply that a
  write waits for; every request of a process without a background applier).

Measured before the split (probe with lock-wait logging, 10M-row table): the 1-row writes
right after a 10M-row upsert waited 0.5-1.5 s on replicas whose background applier flushed
that upsert's MemRowSet (1.3-3.1 s per flush, six servers on 2 cores).

Thread-safety: the cache and the holdings are guarded by a process-wide lock; per-replica
exclusion between processes is the ``flock`` (separate descriptors conflict even in one
process), between the threads of one process the handle's two locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

from pyspark_kudu.errors import NotFoundError
from pyspark_kudu.fileio import FILE_MODE, FileIO, open_private
from pyspark_kudu.spark.host.wal_committed_log import WalCommittedLog
from pyspark_kudu.tablet import Tablet
from pyspark_kudu.tablet.memory import KEY_INDEXES, release_unused_memory
from pyspark_kudu.wal import WalOptions, WalStorage

__all__ = [
    "CACHE_BUDGET_ENV",
    "CACHE_LIMIT",
    "Mode",
    "NeedsTablet",
    "ReplicaHandle",
    "cache_budget_bytes",
    "cache_stats",
    "cached_memory",
    "clear_cache",
    "close_cached",
    "close_stale",
    "delete_replica",
    "memory_report",
    "open_replica",
]

CACHE_LIMIT = 64
#: Environment variable: the process's budget for open replicas, in MiB.
CACHE_BUDGET_ENV = "PYSPARK_KUDU_REPLICA_CACHE_MB"
_DEFAULT_BUDGET_MB = 512
_LOCK_FILE = "lock"
_GEN_FILE = "generation"


def cache_budget_bytes() -> int:
    """The memory budget of this process's open replicas (module docstring; at least
    1 MiB)."""
    try:
        mb = float(os.environ.get(CACHE_BUDGET_ENV, "") or _DEFAULT_BUDGET_MB)
    except ValueError:
        mb = _DEFAULT_BUDGET_MB
    return int(max(mb, 1) * 2**20)


KEY_INDEXES.set_budget(lambda: cache_budget_bytes() // 2)


#: What a request locks of a replica (module docstring, "Two locks per replica").
Mode = Literal["full", "wal", "tablet"]


class NeedsTablet(Exception):
    """A request holding only a replica's log lock (``mode="wal"``) must apply after all (a
    configuration entry committed, a snapshot arrived): it is run again holding both locks.
    Raised before the tablet is touched; what it wrote to the log (appends, hard states)
    stays, and writing it again is a no-op."""


@dataclass(eq=False)
class ReplicaHandle:
    """An open replica: its WAL storage and, once a task needed it, its tablet (opened with
    a log bounded by what the replica had applied, see ``WalCommittedLog.upto``), and the
    two locks of the threads of this process (module docstring)."""

    io: FileIO
    storage: WalStorage
    options: WalOptions | None
    generation: str
    tablet: Tablet | None = None
    tablet_log: WalCommittedLog | None = None
    #: Held around every use of ``storage`` (reentrant: a full request holds it throughout
    #: and its tablet's log takes it again).
    wal_lock: threading.RLock = field(default_factory=threading.RLock)
    #: Held around every use of ``tablet`` by requests (taken before ``wal_lock``).
    tablet_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Whether this holding already wrote a new generation (:meth:`will_mutate`).
    changed: bool = False
    _gen_lock: threading.Lock = field(default_factory=threading.Lock)

    def memory_bytes(self) -> tuple[int, int]:
        """(MemRowSet, indexes) bytes of this handle's open tablet (0, 0 when none)."""
        tablet = self.tablet
        if tablet is None:
            return 0, 0
        with contextlib.suppress(Exception):
            return tablet.memory_bytes()
        return 0, 0

    def open_tablet(self, root: str, tablet_id: str, applied: int) -> Tablet:
        """(Tablet lock held.) The replica's tablet, opened now if this handle has none, with
        a log bounded by ``applied`` (what the replica had applied: bootstrap replays only
        that, see ``WalCommittedLog.upto``). A bootstrap may flush: a reader marks the handle
        changed first (:meth:`will_mutate`)."""
        if self.tablet is None:
            self.tablet_log = WalCommittedLog(self.storage, upto=applied, lock=self.wal_lock)
            self.tablet = Tablet.open(root, tablet_id, log=self.tablet_log)
        return self.tablet

    def will_mutate(self) -> None:
        """(A lock held.) This request is about to change the replica although it was opened
        as a read: invalidate other processes' cached handles first (see the module docs).
        Once per holding: no other process sees the replica until it ends."""
        with self._gen_lock:
            if not self.changed:
                self.generation = _write_generation(self.io)
                self.changed = True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.tablet is not None:
                self.tablet.close()
        with contextlib.suppress(Exception):
            self.storage.detach()


class _Holding:
    """This process's use of one replica: the ``flock``'s descriptor and the handle, shared
    by the requests using the replica now (``users``). ``broken``: a request failed with
    the handle (its storage may be failed): nobody new uses it, and the last user closes it
    instead of caching it. A holding no longer in ``_holdings`` takes no new users."""

    def __init__(self) -> None:
        self.setup = threading.Lock()  # the first user takes the flock and the handle
        self.fd: int | None = None
        self.handle: ReplicaHandle | None = None
        self.users = 0
        self.broken = False


_cache: OrderedDict[tuple[str, str], ReplicaHandle] = OrderedDict()
_cache_lock = threading.Lock()
_in_use: dict[tuple[str, str], ReplicaHandle] = {}  # handles requests hold (_cache_lock)
_holdings: dict[tuple[str, str], _Holding] = {}  # (_cache_lock)
_stats = {"hits": 0, "opens": 0, "open_ms": 0, "evicted_for_memory": 0, "closed_stale": 0}


def cache_stats() -> dict[str, int]:
    """Hits and opens of this process's cache (and the milliseconds the opens took, WAL
    recovery included), replicas closed and key indexes dropped for memory, and the key
    indexes' bytes and budget (tests and benchmarks read it)."""
    with _cache_lock:
        out = dict(_stats)
    out.update(key_indexes_dropped=KEY_INDEXES.dropped, key_index_bytes=KEY_INDEXES.total_bytes(),
               key_index_budget=KEY_INDEXES.budget_bytes)
    return out


def cached_memory() -> dict[tuple[str, str], tuple[int, int]]:
    """(MemRowSet, indexes) bytes of every replica this process keeps open, by (root,
    tablet id); replicas in use right now are not listed."""
    with _cache_lock:
        handles = dict(_cache)
    return {k: h.memory_bytes() for k, h in handles.items()}


def _proc_status_bytes(*fields: str) -> dict[str, int]:
    """Fields of ``/proc/self/status`` given in kB (``VmRSS``, ``VmHWM``), in bytes; empty
    where there is no procfs."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in fields:
                    out[name] = int(rest.split()[0]) * 1024
    return out


def memory_report() -> dict[str, int]:
    """What this process holds, as the tablet server reports it (``ping``): its RSS and the
    kernel's high-water mark of it, Arrow's pool (allocated now and at most), and the open
    replicas' MemRowSets and key indexes -- those a request holds right now included --
    against the budget (module docstring), with the counters of :func:`cache_stats`
    (replicas closed, key indexes dropped for memory)."""
    held = cached_memory()
    with _cache_lock:
        busy = dict(_in_use)
    held.update({k: h.memory_bytes() for k, h in busy.items()})  # read racily: a report
    status = _proc_status_bytes("VmRSS", "VmHWM")
    pool = pa.default_memory_pool()
    return {
        "rss_bytes": status.get("VmRSS", 0),
        "peak_rss_bytes": status.get("VmHWM", 0),
        "arrow_bytes": pool.bytes_allocated(),
        "arrow_peak_bytes": pool.max_memory() or 0,
        "open_replicas": len(held),
        "replicas_in_use": len(busy),
        "memrowset_bytes": sum(m for m, _ in held.values()),
        "index_bytes": sum(i for _, i in held.values()),
        "key_index_bytes": KEY_INDEXES.total_bytes(),
        "budget_bytes": cache_budget_bytes(),
        **cache_stats(),
    }


def clear_cache() -> None:
    """Close every cached replica of this process."""
    with _cache_lock:
        handles = list(_cache.values())
        _cache.clear()
    for h in handles:
        h.close()


def close_cached(root: str, tablet_id: str) -> bool:
    """Close this process's cached handle of the replica if it is idle in the cache, so that
    the next request reopens the replica from its files (after a failure outside any
    request, e.g. a compaction's merge). A handle in use is left to its request."""
    with _cache_lock:
        handle = _cache.pop((root, tablet_id), None)
    if handle is None:
        return False
    handle.close()
    return True


def close_stale() -> int:
    """Close the cached handles of replicas that another process deleted or changed since
    (a pinned task or another application, a replica wiped and copied anew): their memory
    goes now, not when the budget or :data:`CACHE_LIMIT` pushes them out, and a deleted
    replica is never opened again to notice. Reads each replica's generation file without
    its lock (it is replaced atomically); handles in use are not in the cache. Returns how
    many were closed (the host's maintenance calls it every cycle)."""
    with _cache_lock:
        items = list(_cache.items())
    stale: list[tuple[tuple[str, str], ReplicaHandle]] = []
    for key, handle in items:
        try:
            current = _stored_generation(handle.io)
        except OSError:  # the replica's directory is gone (deleted, or renamed to be)
            current = ""
        if current != handle.generation:
            stale.append((key, handle))
    closed: list[ReplicaHandle] = []
    with _cache_lock:
        for key, handle in stale:
            if _cache.get(key) is handle:  # not taken by a request meanwhile
                del _cache[key]
                closed.append(handle)
                _stats["closed_stale"] += 1
    for handle in closed:
        handle.close()
    if closed:
        release_unused_memory()
    return len(closed)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _stored_generation(io: FileIO) -> str:
    """The generation token on disk ("" if empty). The file is replaced atomically, so this
    needs no lock.

    Raises:
        OSError: it cannot be read (``FileNotFoundError``: the replica has none, or its
            directory is gone).
    """
    with open(io.local_path(_GEN_FILE), "rb") as f:
        return f.read().decode(errors="replace").strip()


def _read_generation(io: FileIO) -> str:
    """(Lock held.) The replica's generation token; a replica without one gets one now, so
    that no two incarnations of a replica directory ever share a token."""
    try:
        gen = _stored_generation(io)
    except FileNotFoundError:
        gen = ""
    return gen or _write_generation(io)


def _write_generation(io: FileIO) -> str:
    gen = uuid.uuid4().hex
    path = io.local_path(_GEN_FILE)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open_private(tmp, "wb") as f:
        f.write(gen.encode())
    os.replace(tmp, path)
    return gen


@contextlib.contextmanager
def open_replica(root: str, tablet_dir: FileIO, tablet_id: str, options: WalOptions | None,
                 mutate: bool, require: str | None = None, mode: Mode = "full"
                 ) -> Iterator[ReplicaHandle]:
    """The replica under ``tablet_dir``, locked for this request as ``mode`` says (module
    docstring, "Two locks per replica"); reused from the cache when no other process changed
    it. ``mutate``: the request may change the replica. ``require``: a file the replica
    must have once locked, or NotFoundError and nothing is opened (it was deleted meanwhile:
    :func:`delete_replica` moves it away under the lock). ``options``: the WAL options to
    open it with; a cached handle opened with others is reopened, except for ``None`` (a
    reader's "any"): scans and log reads pass None while rounds pass their client's options,
    and must not reopen -- recover the WAL of -- a replica the last round left open."""
    io = tablet_dir
    io.makedirs()
    key = (root, tablet_id)
    while True:
        holding = _join(key)
        ok = True
        try:
            handle = _take(holding, key, io, tablet_id, options)
            if handle is None:  # broken, or opened with other options: the next holding
                continue
            if require is not None and not io.exists(require):
                raise NotFoundError(f"tablet {tablet_id} has no replica under {root} any more")
            locks = _LOCKS[mode](handle)
            for lock in locks:
                lock.acquire()
            try:
                if holding.broken:  # failed while this waited for its locks
                    continue
                if mutate:
                    handle.will_mutate()
                try:
                    yield handle
                except NeedsTablet:
                    raise
                except BaseException:
                    ok = False
                    holding.broken = True  # before the locks go: a thread waiting sees it
                    raise
                return
            finally:
                for lock in reversed(locks):
                    lock.release()
        except NeedsTablet:
            raise
        except BaseException:
            ok = False
            raise
        finally:
            _leave(key, holding, ok)


_LOCKS: dict[str, Callable[[ReplicaHandle], tuple[threading.Lock | threading.RLock, ...]]] = {
    "full": lambda h: (h.tablet_lock, h.wal_lock),
    "wal": lambda h: (h.wal_lock,),
    "tablet": lambda h: (h.tablet_lock,),
}


def _join(key: tuple[str, str]) -> _Holding:
    """Become a user of this process's holding of the replica (a new one if none is open)."""
    with _cache_lock:
        holding = _holdings.get(key)
        if holding is None:
            holding = _holdings[key] = _Holding()
        holding.users += 1
        return holding


def _take(holding: _Holding, key: tuple[str, str], io: FileIO, tablet_id: str,
          options: WalOptions | None) -> ReplicaHandle | None:
    """The holding's handle: the first user takes the replica's ``flock`` and opens or
    reuses the cached handle. None: the holding is broken, or its handle was opened with
    other WAL options (it takes no new users; the caller joins the next holding, whose
    ``flock`` waits for this one to end)."""
    with holding.setup:
        handle = holding.handle
        if holding.broken or (handle is not None and options is not None
                              and handle.options != options):
            _retire(key, holding)
            return None
        if handle is not None:
            with _cache_lock:
                _stats["hits"] += 1
            return handle
        try:
            fd = os.open(io.local_path(_LOCK_FILE), os.O_CREAT | os.O_RDWR, FILE_MODE)
        except FileNotFoundError:  # its directory was moved away (delete_replica)
            raise NotFoundError(f"tablet {tablet_id} has no replica under {io.root} any "
                                f"more") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _same_file(fd, io.local_path(_LOCK_FILE)):
                # delete_replica moved the directory away while this waited for its lock:
                # the request is refused like one arriving after the deletion (not an
                # OSError from a directory that is gone, which would fail the whole round
                # it came in).
                raise NotFoundError(f"tablet {tablet_id}: its replica under {io.root} was "
                                    f"deleted while this request waited for it")
            gen = _read_generation(io)
            with _cache_lock:
                handle = _cache.pop(key, None)
            if handle is not None and (handle.generation != gen or (
                    options is not None and handle.options != options)):  # None: any
                handle.close()
                handle = None
            if handle is None:
                started = time.perf_counter()
                handle = ReplicaHandle(io, WalStorage.open(io, options), options, gen)
                with _cache_lock:
                    _stats["opens"] += 1
                    _stats["open_ms"] += int((time.perf_counter() - started) * 1000)
            else:
                with _cache_lock:
                    _stats["hits"] += 1
        except BaseException:
            os.close(fd)
            raise
        handle.changed = False
        holding.fd, holding.handle = fd, handle
        with _cache_lock:
            _in_use[key] = handle
        return handle


def _retire(key: tuple[str, str], holding: _Holding) -> None:
    with _cache_lock:
        if _holdings.get(key) is holding:
            del _holdings[key]


def _leave(key: tuple[str, str], holding: _Holding, ok: bool) -> None:
    """A user is done (``ok``: without a failure). The last one ends the holding: the
    lazily kept commit index is persisted, the handle goes back to the cache (or is closed
    if broken), and the ``flock`` is released."""
    with _cache_lock:
        holding.users -= 1
        if not ok:
            holding.broken = True
        last = holding.users == 0
        if last or holding.broken:
            if _holdings.get(key) is holding:
                del _holdings[key]
        if last and holding.handle is not None and _in_use.get(key) is holding.handle:
            del _in_use[key]
    if not last:
        return
    handle, fd = holding.handle, holding.fd
    holding.handle = holding.fd = None
    try:
        if handle is None:
            return
        if holding.broken:
            handle.close()
            return
        try:
            handle.storage.sync_commit()
        except BaseException:
            handle.close()
            raise
        _keep(key, handle)
    finally:
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


def _keep(key: tuple[str, str], handle: ReplicaHandle) -> None:
    """Put a handle no request uses back in the cache; close what the limits push out."""
    evicted: list[ReplicaHandle] = []
    with _cache_lock:
        other = _cache.pop(key, None)  # opened by another thread meanwhile
        if other is not None and other is not handle:
            evicted.append(other)
        _cache[key] = handle
        while len(_cache) > CACHE_LIMIT:
            evicted.append(_cache.popitem(last=False)[1])
        budget = cache_budget_bytes()
        sizes = {k: sum(h.memory_bytes()) for k, h in _cache.items()}
        total = sum(sizes.values())
        for k in list(_cache):
            if total <= budget:
                break
            if k == key:
                continue  # the replica just used stays
            total -= sizes[k]
            evicted.append(_cache.pop(k))
            _stats["evicted_for_memory"] += 1
    for h in evicted:
        h.close()
    if evicted:
        release_unused_memory()


def delete_replica(root: str, tablet_dir: FileIO, tablet_id: str) -> bool:
    """Delete a replica's files (its table was deleted); False if there was none.

    Under the replica's lock the directory is first renamed out of ``tablets/`` (one atomic
    step: no request sees half a replica), then removed. A request that arrives later for
    this tablet finds no replica and is refused, never recreating one (see ``peer``).
    """
    io = tablet_dir
    if not io.exists():
        return False
    fd = os.open(io.local_path(_LOCK_FILE), os.O_CREAT | os.O_RDWR, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with _cache_lock:
            handle = _cache.pop((root, tablet_id), None)
        if handle is not None:
            handle.close()
        path = io.local_path()
        grave = os.path.join(os.path.dirname(path), f".deleted-{tablet_id}-{uuid.uuid4().hex}")
        os.rename(path, grave)
    finally:
        os.close(fd)
    shutil.rmtree(grave, ignore_errors=True)
    return True
