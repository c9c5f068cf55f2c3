"""Group commit for the writers' commit reports to the master.

A write returns once the master knows its tablets' new commit index (DESIGN §3: scans and
tools read what is committed from the catalog), and each report is a heartbeat the master
turns into a catalog entry of its own Raft log. Writers that share a replication round
(:mod:`~pyspark_kudu.spark.replication.write_service`) come back together, and reporting
one by one made the master write one entry per write (16 per round for 16 concurrent
1-row writers), each waited for by its writer.

:class:`GroupReport` coalesces them the way a WAL's group commit does: a caller's items
join the pending ones; if no send is running, the caller sends everything pending;
otherwise it waits for the running send to end and then either finds its items sent by
the caller that took them next or sends them itself. Every caller returns only once a send
that *began after its call* carried its items, and gets that send's error, if any: the
guarantee of reporting alone, with one send per burst instead of one per write.

Thread-safety: the point of the class; ``report`` may be called from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["GroupReport"]

_T = TypeVar("_T")


class GroupReport(Generic[_T]):
    """Coalesces concurrent :meth:`report` calls into sends of all their items."""

    def __init__(self, send: Callable[[list[_T]], None]) -> None:
        self._send = send
        self._cv = threading.Condition()
        self._pending: list[_T] = []
        self._next = 0  # the number of the send that will carry the pending items
        self._sending = False
        self._errors: dict[int, BaseException | None] = {}  # ended sends still awaited
        self._awaiting: dict[int, int] = {}  # send number -> callers waiting for it
        self.sends = 0  # sends made
        self.reports = 0  # calls of report

    def report(self, items: Iterable[_T]) -> None:
        """Send ``items`` (with whatever else is pending) and return once sent; raises the
        send's error if it failed (the items are not retried)."""
        with self._cv:
            self.reports += 1
            self._pending.extend(items)
            mine = self._next
            self._awaiting[mine] = self._awaiting.get(mine, 0) + 1
            while mine not in self._errors and self._sending:
                self._cv.wait()
            sender = mine not in self._errors
            if sender:  # nobody took them: this caller sends send ``mine``
                batch, self._pending = self._pending, []
                self._next += 1
                self._sending = True
                self.sends += 1
        if sender:
            error: BaseException | None = None
            try:
                self._send(batch)
            except BaseException as e:  # every caller of this send gets it
                error = e
            with self._cv:
                self._errors[mine] = error
                self._sending = False
                self._cv.notify_all()
        with self._cv:
            error = self._errors[mine]
            self._awaiting[mine] -= 1
            if not self._awaiting[mine]:
                del self._awaiting[mine], self._errors[mine]
        if error is not None:
            raise error
