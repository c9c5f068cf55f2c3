"""Reading Linux's process table (``/proc``) for the benchmarks' samplers and the fault
harness: which processes live, a process's ``stat`` fields and its command line.

A process may exit between being listed and being read: every reader returns ``None`` for
it then, and callers skip it. Elsewhere than Linux there is no ``/proc``: :func:`pids` is
empty.

Thread-safety: stateless.
"""

from __future__ import annotations

import os

__all__ = ["PGRP", "PPID", "STATE", "STIME", "UTIME", "cmdline", "pids", "stat_fields"]

# ``stat``'s fields as numbered in proc(5) are 1-based and the 2nd, the command name in
# parentheses, may hold spaces and parentheses itself: :func:`stat_fields` returns the fields
# after it, so proc(5)'s field ``n`` (n >= 3) is ``stat_fields(pid)[n - 3]``.
STATE, PPID, PGRP, UTIME, STIME = 0, 1, 2, 11, 12


def pids() -> list[int]:
    """The ids of the processes alive now (all users'), in no particular order."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (see :data:`PPID` ...),
    or ``None`` if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            _, sep, rest = f.read().rpartition(b")")
    except OSError:
        return None
    return rest.split() if sep else None


def cmdline(pid: int) -> bytes | None:
    """``/proc/<pid>/cmdline``: the arguments, each ended by a NUL byte; ``None`` if the
    process is gone (a zombie's or a kernel thread's is empty)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None
