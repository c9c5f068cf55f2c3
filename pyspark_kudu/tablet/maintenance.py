"""What a replica's background maintenance should do next: pure policy, no I/O.

In the spirit of Kudu's maintenance manager, a replica's host runs small, bounded operations
in the background (:mod:`pyspark_kudu.spark.host.maintenance_manager` runs them) so that a tablet
stays fast after updates without anyone asking:

- **Compaction by overlap**: rowsets whose key ranges overlap are merged. Every write and
  point lookup probes each rowset whose range holds the key, so the *height* of the stack
  over a key (how many rowsets overlap there) is what a lookup pays; merging a stack into
  sorted, non-overlapping outputs brings it to one. But a merge rewrites every byte of its
  inputs, and a stack is cheap to keep while it is low: a fresh key is ruled out by each
  rowset's bloom filter, and a scan reads each rowset on its own (no merge by key). So a
  low stack is merged *size-tiered*: only rowsets of similar size go together (sorted by
  size, each at most ``size_ratio`` times the sum of the smaller ones chosen), and a small
  rowset over a large one (the 1% of a table an upsert rewrote, or the last flush of an
  ingest) waits until rowsets of its size add up to the large one's. Each byte is then
  rewritten O(log n) times, not once per small flush over it. A stack of ``max_stack``
  or more is merged smallest first whatever the sizes (its lookups cost more than the
  rewrite). A stack lower than ``min_stack`` (4) is left alone: the two or three
  overlapping rowsets an ingest flushes into a tablet cost a lookup two or three bloom
  probes, and merging them costs as much CPU as flushing them did. Measured with
  ``min_stack`` 2 (10M rows of the composite-key benchmark table, 6 tablets, RF 3, on 6
  one-core hosts of a 2-core machine): after an upsert had returned in 12.4-12.8 s the
  tablet servers worked on for 39-42 s (58-62 CPU-s), most of it merging each replica's
  two 710k-row flushes; with 4, 20 s (33 CPU-s); after an insert 36-37 s (25-30 CPU-s)
  against 4-6 s (7-9 CPU-s). Measured before this rule (10M rows, 6 tablets on 6 one-core hosts of a
  2-core machine): merging a 1% upsert's new rowset into the 1.7M-row rowset under it cost
  bursts of 4-7 CPU-s in the tablet servers in the minute after the upsert, and every scan
  in that minute (Parquet's too) shared the cores with it.
- **Compaction by deltas**: a rowset many of whose rows were ended later by updates or
  deletes (``delta rows / rows >= delta_ratio``) is rewritten with the ends folded in and
  the versions older than the history mark dropped, so scans stop filtering dead rows
  through a per-rowset "not in" set.
- **Bounded work**: one operation reads at most ``budget_bytes`` of input files (smallest
  overlapping rowsets first), so one cycle's time is bounded whatever the tablet's size; the
  next cycle continues. Its memory is bounded by the streaming merge's batches
  (:mod:`~pyspark_kudu.tablet.merge`), not by this budget.
- **Flush**: a replica with applied but unflushed entries is flushed once it has been idle
  (no new entries) for ``flush_idle_s``: its MemRowSet leaves memory and a process that
  reopens it replays nothing.
- **Writes first**: a replica that applied entries within the last ``busy_s`` is being
  written. A compaction takes the CPU the writes need on a host with one core (and its merge
  is dropped if the writes end versions in its inputs meanwhile): while a replica is being
  written only a stack at least ``busy_min_stack`` high is merged (its lookups would
  otherwise slow the writes down more than the merge does), and delta compactions wait.
  Measured: during a 10M-row ingest into 6 tablets on 6 one-core hosts, compactions of the
  rowsets the ingest had just flushed took about half of the tablet servers' busy time, and
  the insert's per-row results round took 38-48 s instead of ~10 s.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark_kudu.tablet.rowset import RowSetMeta

__all__ = ["MaintenancePolicy", "choose_compaction", "delta_ratio", "overlap_stacks", "size_tier"]


@dataclass(frozen=True)
class MaintenancePolicy:
    """Thresholds of the background maintenance (module docstring)."""

    delta_ratio: float = 0.05
    min_stack: int = 4
    budget_bytes: int = 128 << 20
    flush_idle_s: float = 30.0
    history_max_age_s: float = 900.0  # Kudu's --tablet_history_max_age_sec
    busy_s: float = 10.0
    busy_min_stack: int = 8
    size_ratio: float = 2.0
    max_stack: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.delta_ratio <= 1:
            raise ValueError(f"delta_ratio must be in (0, 1], got {self.delta_ratio}")
        if self.min_stack < 2:
            raise ValueError(f"min_stack must be at least 2, got {self.min_stack}")
        if self.budget_bytes < 1:
            raise ValueError(f"budget_bytes must be positive, got {self.budget_bytes}")
        if self.flush_idle_s < 0 or self.history_max_age_s < 0 or self.busy_s < 0:
            raise ValueError("flush_idle_s, history_max_age_s and busy_s must not be negative")
        if self.busy_min_stack < self.min_stack:
            raise ValueError(f"busy_min_stack must be at least min_stack ({self.min_stack}), "
                             f"got {self.busy_min_stack}")
        if not self.size_ratio >= 1:
            raise ValueError(f"size_ratio must be at least 1, got {self.size_ratio}")
        if self.max_stack < self.min_stack:
            raise ValueError(f"max_stack must be at least min_stack ({self.min_stack}), "
                             f"got {self.max_stack}")


def delta_ratio(meta: RowSetMeta) -> float:
    """The share of a rowset's rows whose version a later delta ended."""
    return sum(d.rows for d in meta.deltas) / meta.num_rows if meta.num_rows else 0.0


def overlap_stacks(rowsets: Sequence[RowSetMeta]) -> list[list[RowSetMeta]]:
    """Groups of rowsets whose key ranges overlap transitively (a sweep over min keys);
    groups of one are left out."""
    ordered = sorted(rowsets, key=lambda m: (m.min_key, m.max_key))
    out: list[list[RowSetMeta]] = []
    group: list[RowSetMeta] = []
    high: tuple[object, ...] | None = None
    for m in ordered:
        if group and high is not None and m.min_key <= high:
            group.append(m)
            high = max(high, m.max_key)
            continue
        if len(group) > 1:
            out.append(group)
        group, high = [m], m.max_key
    if len(group) > 1:
        out.append(group)
    return out


def choose_compaction(rowsets: Sequence[RowSetMeta], policy: MaintenancePolicy, *,
                      busy: bool = False) -> tuple[int, ...]:
    """The ids of the rowsets to merge next (empty: nothing worth it).

    The tallest overlapping stack that has something to merge first: a stack of
    ``max_stack`` or more merges as many of its rowsets as fit the budget, smallest first
    (merging k of them lowers the stack by k - 1); a lower one its largest size tier that
    fits the budget (:func:`size_tier`), at least two rowsets. Else the rowset with the
    largest delta ratio over the threshold that fits the budget. ``busy``: the replica is
    being written (module docstring): only a stack of ``busy_min_stack`` or more, no delta
    compaction.
    """
    least = policy.busy_min_stack if busy else policy.min_stack
    stacks = sorted((s for s in overlap_stacks(rowsets) if len(s) >= least),
                    key=len, reverse=True)
    for stack in stacks:
        if len(stack) >= policy.max_stack:
            chosen = _smallest_first(sorted(stack, key=_by_size), policy.budget_bytes,
                                     ratio=None)
        else:
            chosen = size_tier(stack, policy)
        if len(chosen) >= 2:
            return tuple(sorted(m.id for m in chosen))
    if busy:
        return ()
    dead = [m for m in rowsets if delta_ratio(m) >= policy.delta_ratio
            and m.size_bytes <= policy.budget_bytes]
    if dead:
        worst = max(dead, key=lambda m: (delta_ratio(m), m.id))
        return (worst.id,)
    return ()


def size_tier(stack: Sequence[RowSetMeta], policy: MaintenancePolicy) -> list[RowSetMeta]:
    """The longest run of ``stack``'s rowsets in size order (ties: the fewest bytes) in which
    each is at most ``size_ratio`` times the sum of the smaller ones and all fit the budget;
    fewer than two: none."""
    ordered = sorted(stack, key=_by_size)
    best: list[RowSetMeta] = []
    for i in range(len(ordered) - 1):
        run = _smallest_first(ordered[i:], policy.budget_bytes, ratio=policy.size_ratio)
        if len(run) > len(best) or (len(run) == len(best) and len(run) >= 2
                                    and _bytes(run) < _bytes(best)):
            best = run
    return best if len(best) >= 2 else []


def _smallest_first(ordered: Sequence[RowSetMeta], budget: int, *,
                    ratio: float | None) -> list[RowSetMeta]:
    chosen: list[RowSetMeta] = []
    spent = 0
    for m in ordered:
        if spent + m.size_bytes > budget:
            break
        if ratio is not None and chosen and m.size_bytes > ratio * spent:
            break
        chosen.append(m)
        spent += m.size_bytes
    return chosen


def _by_size(m: RowSetMeta) -> tuple[int, int]:
    return (m.size_bytes, m.id)


def _bytes(ms: Sequence[RowSetMeta]) -> int:
    return sum(m.size_bytes for m in ms)
