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
    row_group_rows: int = 65_536
    compaction_target_rows: int = 4_000_000
    scan_batch_rows: int = 65_536
    #: Rows a compaction reads from each input at a time: its memory is about
    #: ``2 * inputs * compaction_batch_rows`` rows (:mod:`.merge`), whatever the rowsets' sizes.
    compaction_batch_rows: int = 65_536


@dataclass
class TabletMetrics:
    """Monotonic counters; read them, do not write them (updates happen under a lock)."""

    entries_applied: int = 0
    rows_applied: int = 0
    row_errors: int = 0
    flushes: int = 0
    compactions: int = 0
    rowset_files_opened: int = 0  # rowset data files opened by scans
    key_index_loads: int = 0  # rowset key indexes built by reading a file (write path)
    rows_fetched_for_update: int = 0  # old rows read to complete partial UPDATE/UPSERT rows
    delta_files_read: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}
