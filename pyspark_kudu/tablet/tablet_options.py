"""Tablet tuning options and metrics counters.

Thread-safety: :class:`TabletOptions` is immutable. :class:`TabletMetrics` fields are updated
by the tablet under its metrics lock and may be read from any thread at any time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["TabletMetrics", "TabletOptions"]


@dataclass(frozen=True)
class TabletOptions:
    """Tuning knobs. ``flush_threshold_bytes=0`` disables flushing from :meth:`Tablet.apply`."""

    flush_threshold_bytes: int = 64 << 20
    #: How far an apply whose flush is deferred (``Tablet.apply(defer_flush=True)``: the
    #: leader's apply a write waits on for its per-row results) lets the MemRowSet grow
    #: before it flushes anyway (never less than ``flush_threshold_bytes``).
    deferred_flush_max_bytes: int = 128 << 20
    row_group_rows: int = 65_536
    compaction_target_rows: int = 4_000_000
    scan_batch_rows: int = 65_536
    #: Rows a compaction reads from each input at a time: its memory is about
    #: ``2 * inputs * compaction_batch_rows`` rows (:mod:`.merge`), whatever the rowsets' sizes.
    compaction_batch_rows: int = 65_536
    #: False-positive rate of the bloom filter written with each rowset (:mod:`.bloom`). A
    #: write batch loads a rowset's key index when the filter admits *any* of its keys, so
    #: with ``B`` fresh keys per batch about ``B * bloom_fp_rate`` of them pass each filter:
    #: keep the rate well below ``1 / B`` for the filters to spare the indexes (each halving
    #: costs a few bits per row). The default suits batches of up to 65,536 rows (the
    #: writer's largest): 39-78 bits per row in the blocked layout (:mod:`.bloom`), against
    #: 24-40 bytes per row for a key index.
    bloom_fp_rate: float = 1e-6
    #: When a write batch needs keys from a rowset whose key index is not in memory, it reads
    #: only the row groups that may hold them if those are at most this fraction of the
    #: rowset's row groups, and loads the whole index otherwise (:mod:`.apply`). ``0`` always
    #: loads the index, ``1`` never does.
    point_lookup_max_fraction: float = 0.25


@dataclass
class TabletMetrics:
    """Monotonic counters; read them, do not write them (updates happen under a lock)."""

    entries_applied: int = 0
    rows_applied: int = 0
    row_errors: int = 0
    flushes: int = 0
    compactions: int = 0
    compaction_conflicts: int = 0  # merges dropped: a write ended versions in an input meanwhile
    rowset_files_opened: int = 0  # rowset data files opened by scans
    key_index_loads: int = 0  # rowset key indexes built by reading a file (write path)
    point_lookups: int = 0  # ... rowsets a write batch probed reading only some row groups
    bloom_checks: int = 0  # rowsets whose bloom filter a write batch consulted
    bloom_skips: int = 0  # ... and whose key index it then did not need (no key may be there)
    rows_fetched_for_update: int = 0  # old rows read to complete partial UPDATE/UPSERT rows
    delta_files_read: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}
