"""The lock that makes one resident tablet server per executor (DESIGN §1.2).

An executor runs one Python daemon per distinct worker environment (PySpark's SQL runners
add ``SPARK_SIMPLIFIED_TRACEBACK``, so ``mapInArrow`` tasks and RDD stages come from two
daemons), and each daemon's :func:`~pyspark_kudu.spark.host.tablet_server.start_resident`
would fork a server. The first daemon's server holds an exclusive ``flock`` on
:func:`lock_path` (keyed by the executor, host, data root and credential) and
:func:`publish`-es its address beside it; another daemon's :func:`take` then returns that
address instead of the lock. The kernel drops the lock with the process that holds it; a
server told to stop :func:`release`-s it first.

Thread-safety: functions only; the lock is between processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time

from pyspark_kudu.errors import KuduError
from pyspark_kudu.spark.host.identity import local_data_root

__all__ = ["lock_path", "publish", "release", "take"]


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
    return os.path.join(tempfile.gettempdir(), f"pyspark-kudu-tserver-{digest[:24]}.lock")


def take(path: str, timeout_s: float) -> int | str | None:
    """The lock's descriptor, held (this daemon starts the server), or the address line
    another daemon's running server published (``"address streams"``), or None if that
    server published none within ``timeout_s``. The holder removes an older server's
    address before it starts its own, so the line read belongs to the live holder."""
    end = time.monotonic() + timeout_s
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + ".address")
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
    """(In the server, told to stop.) Withdraw the address, then release the lock: a daemon
    starting now starts the next server at once instead of waiting out this one's
    shutdown (its maintenance may finish a compaction step first: a brief overlap, which
    the replicas' locks make safe) or taking the address of a server going away."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock_path + ".address")
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    os.close(lock_fd)


def publish(lock_path: str, address: str) -> None:
    """(In the server, lock held.) Write the address line for later daemons, atomically."""
    tmp = f"{lock_path}.address.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(address + "\n")
    os.replace(tmp, lock_path + ".address")
