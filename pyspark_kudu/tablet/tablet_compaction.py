"""Compaction of a tablet's rowsets: the :class:`~pyspark_kudu.tablet.Tablet` methods that
merge rowsets without holding the tablet's lock (Kudu's compactions never stop writes or
scans).

Three steps: :meth:`~TabletCompactions.prepare_compaction` under the lock (flush, take the
inputs with their deltas and change counters, reserve output rowset ids in the superblock,
pin the inputs), :meth:`~TabletCompactions.run_compaction` without it (merge and write the
outputs, :mod:`.merge`), and :meth:`~TabletCompactions.commit_compaction` under it again
(publish with one atomic superblock replace, or drop the outputs if a write ended versions
in an input meanwhile). :meth:`~TabletCompactions.compact` runs all three under the lock.

Crash safety: outputs carry reserved ids no superblock lists until the commit; a tablet
opened after a crash deletes them as leftovers (``Tablet._remove_orphans``), and inputs are
deleted only after the superblock no longer lists them (the crash points ``compact.*``).

Thread-safety: as :class:`~pyspark_kudu.tablet.Tablet` (this is part of it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.faults import crash_point
from pyspark_kudu.tablet.memory import release_unused_memory
from pyspark_kudu.tablet.merge import merge_rowsets, write_merged
from pyspark_kudu.tablet.rowset import DiskRowSet, RowSetMeta, rowset_file
from pyspark_kudu.tablet.state import TabletState
from pyspark_kudu.tablet.superblock import Superblock
from pyspark_kudu.tablet.tablet_options import TabletOptions

__all__ = ["CompactionJob", "TabletCompactions"]


@dataclass
class CompactionJob:
    """A compaction between :meth:`Tablet.prepare_compaction` and its commit: the inputs
    (pinned), what each looked like when it was taken (change counter and deltas), the
    history mark it applies, and the rowset ids reserved for its outputs."""

    schema: Schema
    inputs: tuple[DiskRowSet, ...]
    changes: tuple[int, ...]
    deltas: tuple[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]], ...]
    mark: int
    first_id: int
    reserved: int
    outputs: tuple[DiskRowSet, ...] | None = None


def _paced(chunks: Iterator[pa.Table], between: Callable[[], object]) -> Iterator[pa.Table]:
    """``chunks``, with ``between()`` called before each one is handed on."""
    for chunk in chunks:
        between()
        yield chunk


def _stem(name: str) -> str:
    """``00000012`` for ``rowsets/00000012.parquet``, ``00000012.bloom``, ... ."""
    return name.rsplit("/", 1)[-1].split(".", 1)[0]


class TabletCompactions:
    """The compaction half of :class:`~pyspark_kudu.tablet.Tablet` (a mixin: it uses the
    tablet's lock, superblock and rowsets, declared here for type checking only)."""

    if TYPE_CHECKING:
        _dir: FileIO
        _tablet_id: str
        _options: TabletOptions
        _lock: threading.RLock
        _state: TabletState
        _sb: Superblock | None
        _rowsets: list[DiskRowSet]
        _applied: int
        _compacting: bool

        def _require_running(self) -> None: ...

        def _flush_locked(self) -> bool: ...

        def _failing(self, what: str) -> contextlib.AbstractContextManager[None]: ...

        def _count(self, name: str, n: int = 1) -> None: ...

    def compact(self, history_retention_index: int | None = None,
                rowset_ids: Sequence[int] | None = None) -> bool:
        """Merge rowsets (all, or ``rowset_ids``) into new PK-sorted, non-overlapping ones,
        holding the tablet lock throughout (:meth:`prepare_compaction` says more).

        Versions ended at or before ``history_retention_index`` (clamped to the applied
        index; default: keep the current mark) are dropped, and the ancient history mark
        rises to it: scans below it are refused afterwards. Returns False if there was
        nothing to compact.
        """
        with self._lock:
            job = self.prepare_compaction(history_retention_index, rowset_ids)
            if job is None:
                return False
            self.run_compaction(job)
            return self.commit_compaction(job)

    def prepare_compaction(self, history_retention_index: int | None = None,
                           rowset_ids: Sequence[int] | None = None) -> CompactionJob | None:
        """First step of a compaction that merges *without* the tablet lock (Kudu's
        compactions never stop writes or scans): under the lock, flush, take the inputs,
        their deltas as of now and each one's change counter, reserve rowset ids for the
        outputs in the superblock (so that no flush, and no other process opening the
        tablet, takes them), and pin the inputs' files.

        Then :meth:`run_compaction` (no lock: the merge), then :meth:`commit_compaction`
        (the lock again), or :meth:`abandon_compaction`. One compaction at a time per
        tablet. Returns None if there is nothing to compact (the history mark may still
        rise, as with :meth:`compact`).
        """
        with self._lock:
            self._require_running()
            if self._compacting:
                raise IllegalStateError(f"tablet {self._tablet_id} is already compacting")
            self._flush_locked()
            sb = self._sb
            assert sb is not None
            mark = sb.ancient_history_mark
            if history_retention_index is not None:
                mark = max(mark, min(history_retention_index, self._applied))
            wanted = None if rowset_ids is None else set(rowset_ids)
            inputs = [rs for rs in self._rowsets if wanted is None or rs.meta.id in wanted]
            if not inputs:
                if mark > sb.ancient_history_mark:
                    self._sb = replace(sb, ancient_history_mark=mark)
                    self._sb.store(self._dir)
                return None
            # write_merged starts a new output only once the current one holds target rows:
            # at most rows // target + 1 outputs.
            reserved = sum(rs.meta.num_rows for rs in inputs) // max(
                1, self._options.compaction_target_rows) + 2
            job = CompactionJob(
                schema=sb.schema, inputs=tuple(inputs), changes=tuple(rs.changes for rs in inputs),
                deltas=tuple(tuple(a.copy() for a in rs.deltas()) for rs in inputs),
                mark=mark, first_id=sb.next_rowset_id, reserved=reserved)
            with self._failing("compaction"):
                self._sb = replace(sb, next_rowset_id=sb.next_rowset_id + reserved)
                self._sb.store(self._dir)
            for rs in inputs:
                rs.pin()
            self._compacting = True
            return job

    def run_compaction(self, job: CompactionJob,
                       between: Callable[[], object] | None = None) -> None:
        """Second step: merge the inputs into output files (no tablet lock needed; the
        inputs are pinned, their deltas were taken by :meth:`prepare_compaction`). A
        failure here (a damaged input, a full disk) fails the tablet, as it would under
        the lock, and abandons the job. ``between`` is called before each merged chunk is
        written (the maintenance manager pauses the merge there while more urgent work,
        a tablet copy, runs on the host)."""
        o = self._options
        try:
            crash_point("compact.start")
            chunks = merge_rowsets(job.schema, job.inputs, job.mark, o.compaction_batch_rows,
                                   deltas=job.deltas)
            if between is not None:
                chunks = _paced(chunks, between)
            job.outputs = tuple(write_merged(
                self._dir, job.first_id, chunks, job.schema, o.row_group_rows,
                o.compaction_target_rows, bloom_fp_rate=o.bloom_fp_rate,
                id_limit=job.first_id + job.reserved))
            crash_point("compact.after_outputs")
            self._dir.fsync_dir("rowsets")
        except BaseException:
            with self._lock:
                self._end_job(job, discard=True)
                with self._failing("compaction"):
                    raise

    def commit_compaction(self, job: CompactionJob) -> bool:
        """Last step, under the lock: publish the outputs in place of the inputs with one
        atomic superblock replace -- unless a write ended versions in an input meanwhile
        (its change counter moved), the tablet stopped running, or an output file is gone
        (another process opened the tablet and removed it as a leftover): then the outputs
        are deleted, ``compaction_conflicts`` counts it, and False says to try again."""
        with self._lock:
            try:
                outputs = job.outputs
                if (outputs is None or self._state is not TabletState.RUNNING
                        or any(rs not in self._rowsets or rs.changes != c
                               for rs, c in zip(job.inputs, job.changes, strict=True))
                        or not all(self._dir.exists(f) for rs in outputs
                                   for f in rs.meta.files())):
                    self._discard_outputs(job)
                    self._count("compaction_conflicts")
                    return False
                sb = self._sb
                assert sb is not None
                keep = [rs for rs in self._rowsets if rs not in job.inputs]
                with self._failing("compaction"):
                    new_sb = replace(sb, ancient_history_mark=max(sb.ancient_history_mark,
                                                                  job.mark),
                                     rowsets=tuple(rs.meta for rs in [*keep, *outputs]))
                    new_sb.store(self._dir)
                    crash_point("compact.after_superblock")
                self._sb = new_sb
                self._rowsets = [*keep, *outputs]
                for i, rs in enumerate(job.inputs):
                    rs.drop_index()  # scans may keep the rowset a while; they need no index
                    rs.retire(self._deleter(rs.meta, first=(i == 0)))
                self._count("compactions")
                return True
            finally:
                self._end_job(job)
                release_unused_memory()

    def abandon_compaction(self, job: CompactionJob) -> None:
        """Give a prepared (or run) compaction up: its outputs are deleted."""
        with self._lock:
            self._end_job(job, discard=True)

    def _end_job(self, job: CompactionJob, discard: bool = False) -> None:
        if discard:
            self._discard_outputs(job)
        if self._compacting:
            self._compacting = False
            for rs in job.inputs:
                rs.unpin()

    def _discard_outputs(self, job: CompactionJob) -> None:
        """Delete whatever the job wrote: every file of its reserved rowset ids."""
        mine = {_stem(rowset_file(i)) for i in range(job.first_id, job.first_id + job.reserved)}
        for name in self._dir.listdir("rowsets"):
            if _stem(name) in mine:
                with contextlib.suppress(FileNotFoundError):
                    self._dir.delete("rowsets", name)

    def _deleter(self, meta: RowSetMeta, first: bool) -> Any:
        d = self._dir

        def delete() -> None:
            for j, name in enumerate(meta.files()):
                d.delete(name)
                if first and j == 0:
                    crash_point("compact.during_delete")

        return delete
