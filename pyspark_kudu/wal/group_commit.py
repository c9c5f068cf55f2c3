"""The WAL's sync thread: group commit (seed ``kudu-consensus-wal``).

Appenders hand :class:`Pending` batches of frames, whose segment and offset the log has
already reserved, to :meth:`GroupCommitter.enqueue`. One thread repeatedly takes *everything*
queued (a group), writes it with one ``write`` per segment touched, makes it durable with
one ``fsync``/``fdatasync`` (``SyncPolicy``), reports it written, and completes the
futures. Since only this thread drains the queue, groups reach the disk in enqueue order
and a group is synced only after every earlier one.

Coalescing. With ``N`` appenders that each wait for their entry, a plain loop settles into
two alternating groups of about ``N/2``: the appenders released by one sync come back while
the next sync already runs. So, before taking a group, the thread may wait for the
appenders the previous group released to enqueue again, at most
``WalOptions.group_commit_wait`` times the recent average sync time (an adaptive, bounded
form of PostgreSQL's ``commit_delay``). A lone appender never waits (it is already back
when the thread looks), and when syncs are nearly free so is the wait. The price: up to
that much idle time per group when the appenders do not come back in time, which happens
when Python's per-append overhead rather than the sync dominates.

Thread-safety: :meth:`GroupCommitter.enqueue` and :meth:`GroupCommitter.close` may be called
from any thread; the segment writer is touched by the sync thread only (and by ``close``
after joining it). Callbacks run on the sync thread without this class's lock held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from pyspark_kudu.errors import IllegalStateError, IOError_, KuduError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal.format import PreparedFrame, frame_chunks
from pyspark_kudu.wal.segment import SegmentWriter
from pyspark_kudu.wal.wal_options import WalOptions

__all__ = ["GroupCommitter", "Pending"]

_log = logging.getLogger(__name__)

_EWMA_WEIGHT = 0.2


@dataclass(slots=True)
class Pending:
    """One enqueued append (or, without frames, a barrier) and the future to complete.

    Not thread-safe: built by one appender, then owned by the sync thread.

    ``frames`` holds ``(frame, segment seq, offset)`` as reserved by the log;
    ``finish_segment`` closes the open segment once everything before it is written.
    """

    frames: list[tuple[PreparedFrame, int, int]]
    future: Future[int]
    result: int
    finish_segment: bool = False


class GroupCommitter:
    """Owns the sync thread and the open segment of one log. Thread-safe (module doc)."""

    def __init__(self, io: FileIO, options: WalOptions, *,
                 on_written: Callable[[list[Pending]], None],
                 on_segment_closed: Callable[[int], None]) -> None:
        self._io = io
        self._opts = options
        self._on_written = on_written
        self._on_segment_closed = on_segment_closed
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[Pending] = []
        self._closing = False
        self._failure: KuduError | None = None
        self._writer: SegmentWriter | None = None
        # Coalescing state: appends queued when the last group completed plus the appends it
        # released, i.e. how many the next group would hold if every appender came back.
        self._expected_next = 0
        self._sync_seconds = 0.0
        # Written by the sync thread only; read without a lock for statistics.
        self.groups = self.syncs = self.segments_created = self.largest_group = 0
        self._thread = threading.Thread(target=self._run, name=f"wal-sync {io.root}",
                                        daemon=True)
        self._thread.start()

    @property
    def failure(self) -> KuduError | None:
        """The error that stopped the sync thread, if any; the log is unusable after it."""
        return self._failure

    def enqueue(self, pending: Pending) -> None:
        """Queue ``pending`` behind everything enqueued before it.

        Raises:
            IllegalStateError: the committer is closing.
            IOError_: the sync thread failed earlier.
        """
        with self._cond:
            if self._failure is not None:
                raise IOError_(f"WAL {self._io.root} failed earlier ({self._failure})") \
                    from self._failure
            if self._closing:
                raise IllegalStateError(f"WAL {self._io.root} is closed")
            self._queue.append(pending)
            self._cond.notify_all()

    def close(self) -> None:
        """Write and sync everything queued, close the open segment, stop the thread."""
        self._stop(finish=True)

    def detach(self) -> None:
        """Stop the thread and close the open segment *without* truncating or syncing it:
        for a writer that may no longer be the segment's only one (another process may
        have appended since); the next opener's recovery treats the tail as usual."""
        self._stop(finish=False)

    def _stop(self, finish: bool) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            if finish:
                writer.finish()
            else:
                writer.abandon()

    # -- the sync thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            group = self._next_group()
            if not group:
                return
            try:
                self._write_group(group)
                self._on_written(group)
            except Exception as e:
                err = e if isinstance(e, KuduError) else IOError_(
                    f"WAL {self._io.root}: unexpected failure in the sync thread: {e!r}")
                self._fail(err, group)
                return
            self._complete(group)
            # Not held while waiting for the next group: an idle log would keep its last
            # group's entries (a whole round's batches) alive until its next append.
            del group

    def _next_group(self) -> list[Pending]:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            budget = self._opts.group_commit_wait * self._sync_seconds
            if budget > 0 and len(self._queue) < self._expected_next and not self._closing:
                deadline = time.monotonic() + budget
                while len(self._queue) < self._expected_next and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            group, self._queue = self._queue, []
            return group

    def _write_group(self, group: list[Pending]) -> None:
        chunks: list[bytes] = []
        w = self._writer
        expected = w.offset if w is not None else 0
        group_start = -1
        for p in group:
            for fr, seq, off in p.frames:
                if w is None or seq != w.seq:
                    if w is not None:
                        self._flush(w, chunks)
                        self._finish(w)
                    w = self._new_segment(seq)
                    expected, group_start = w.offset, -1
                if off != expected:
                    raise IllegalStateError(
                        f"WAL {self._io.root}: frame reserved at {seq}:{off} but the segment "
                        f"is at {expected}"
                    )
                if group_start < 0:
                    group_start = off
                chunks.extend(frame_chunks(fr, group_start))
                expected += fr.size
            if p.finish_segment and w is not None:
                self._flush(w, chunks)
                self._finish(w)
                w, group_start = None, -1
        if w is not None:
            self._flush(w, chunks)

    def _flush(self, w: SegmentWriter, chunks: list[bytes]) -> None:
        if not chunks:
            return
        w.write(b"".join(chunks))
        chunks.clear()
        t0 = time.monotonic()
        w.sync()
        elapsed = time.monotonic() - t0
        self._sync_seconds += _EWMA_WEIGHT * (elapsed - self._sync_seconds)

    def _new_segment(self, seq: int) -> SegmentWriter:
        w = SegmentWriter.create(self._io, seq, self._opts, self._count_sync)
        self._writer = w
        self.segments_created += 1
        return w

    def _finish(self, w: SegmentWriter) -> None:
        self._writer = None
        w.finish()
        self._on_segment_closed(w.seq)

    def _count_sync(self) -> None:
        self.syncs += 1

    def _complete(self, group: list[Pending]) -> None:
        n = sum(len(p.frames) for p in group)
        if n:
            self.groups += 1
            self.largest_group = max(self.largest_group, n)
        with self._cond:
            # Taken before the futures complete: none of this group's appenders can have
            # enqueued again yet, so the two counts do not overlap.
            self._expected_next = len(self._queue) + sum(1 for p in group if p.frames)
        for p in group:
            p.future.set_result(p.result)

    def _fail(self, err: KuduError, group: list[Pending]) -> None:
        _log.error("WAL %s failed: %s", self._io.root, err)
        with self._cond:
            self._failure = err
            rest, self._queue = self._queue, []
        if self._writer is not None:
            self._writer.abandon()
            self._writer = None
        for p in group + rest:
            p.future.set_exception(err)
