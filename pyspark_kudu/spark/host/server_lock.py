"""The lock that makes one resident tablet server per executor (DESIGN §1.2).

An executor runs one Python daemon per distinct worker environment (PySpark's SQL runners
add ``SPARK_SIMPLIFIED_TRACEBACK``, so ``mapInArrow`` tasks and RDD stages come from two
daemons), and each daemon's :func:`~pyspark_kudu.spark.host.tablet_server.start_resident`
would fork a server. The first daemon's server holds an exclusive ``flock`` on
:func:`lock_path` (keyed by the executor, host, data root and credential) and
:func:`publish`-es its address beside it; another daemon's :func:`take` then returns that
address instead of the lock. The kernel drops the lock with the process that holds it; a
server told to stop :func:`release`-s it first.

**No files left behind**: each executor has its own lock file, so they would pile up in the
temporary directory, one per executor that ever ran on the machine. A server told to stop
removes its file while it still holds the lock; and whoever takes a lock sweeps the files
nobody holds (their server was killed): it locks each, removes it and its address while
holding it, and lets go. Removing a lock file is safe because a lock counts only if the
file locked is still the one at the path: :func:`take` compares the descriptor's inode with
the path's after locking and, if they differ (the file was removed, or replaced, between
its open and its lock), opens the path again.

Thread-safety: functions only; the lock is between processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import tempfile
import time

from pyspark_kudu.errors import KuduError
from pyspark_kudu.spark.host.identity import local_data_root

__all__ = ["lock_path", "publish", "release", "sweep", "take"]

_PREFIX = "pyspark-kudu-tserver-"


def lock_path(host: str, secret: bytes) -> str:
    """The lock file of the server of this daemon's executor (its parent process: both of
    an executor's daemons are its children) on ``host``, for this data root and
    credential. Another application's executor on the host has its own server, as before,
    even with the same credential: a server lives as long as its executor. Under the
    system's temporary directory: the data root may not exist yet."""
    try:
        root = local_data_root()
    except KuduError:
        root = ""
    parts = [str(os.getppid()).encode(), host.encode(), root.encode(), secret]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()
    return os.path.join(tempfile.gettempdir(), f"{_PREFIX}{digest[:24]}.lock")


def take(path: str, timeout_s: float) -> int | str | None:
    """The lock's descriptor, held (this daemon starts the server), or the address line
    another daemon's running server published (``"address streams"``), or None if that
    server published none within ``timeout_s``. The holder removes an older server's
    address before it starts its own, so the line read belongs to the live holder. Having
    the lock, it also :func:`sweep`-s the lock files of servers that are gone."""
    end = time.monotonic() + timeout_s
    while True:
        fd = _lock_existing(path, create=True)
        if fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + ".address")
            sweep(os.path.dirname(path), keep=path)
            return fd
        with contextlib.suppress(FileNotFoundError):
            with open(path + ".address", encoding="utf-8") as f:
                line = f.read().strip()
            if line:
                return line
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)


def release(lock_path: str, lock_fd: int) -> None:
    """(In the server, told to stop.) Withdraw the address and the lock file, then release
    the lock: a daemon starting now starts the next server at once instead of waiting out
    this one's shutdown (its maintenance may finish a compaction step first: a brief
    overlap, which the replicas' locks make safe) or taking the address of a server going
    away."""
    _remove(lock_path)
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    os.close(lock_fd)


def sweep(directory: str, keep: str = "") -> int:
    """Remove the server lock files under ``directory`` (and their addresses) that no live
    server holds, except ``keep``; returns how many. A file a server holds is left alone."""
    removed = 0
    for path in glob.glob(os.path.join(directory, f"{_PREFIX}*.lock")):
        if path == keep:
            continue
        fd = _lock_existing(path, create=False)
        if fd is None:
            continue
        try:
            _remove(path)
            removed += 1
        finally:
            os.close(fd)  # lets go of the lock on the removed file
    return removed


def _lock_existing(path: str, *, create: bool) -> int | None:
    """A descriptor holding the exclusive lock of the file at ``path`` now (the file locked
    is the one at the path after locking: module docstring), or None if another process
    holds it (or, without ``create``, there is no file)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # removed or replaced since the open: the lock is not the path's
        if not create:
            return None


def _remove(lock_path: str) -> None:
    """Remove a lock file and its address (lock held)."""
    for p in (lock_path + ".address", lock_path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def publish(lock_path: str, address: str) -> None:
    """(In the server, lock held.) Write the address line for later daemons, atomically."""
    tmp = f"{lock_path}.address.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(address + "\n")
    os.replace(tmp, lock_path + ".address")
