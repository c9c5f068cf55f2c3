"""Replica placement for tablet creation and re-replication, and the policy check.

Seed: kudu-location-awareness ("Placement policies", "Tablet Creation", "Re-replication"),
generalised with hierarchical locations and KIP-708 / Elasticsearch awareness keys.

The policy, for every tablet of replication factor *r*:

* A tablet server never hosts two replicas of one tablet, and a table's replicas only go
  to live servers its :class:`~.topology.TableConstraint` allows (seed use cases 3, 4).
* Location groups: with more than 2 groups no group holds a majority (at most
  ``max(1, r // 2)`` replicas); with 2 groups at most ``r // 2 + 1`` in one; with 1 group no
  limit. Hierarchical locations (``/dc/rack``) apply this at every level, top level first.
  Groups are counted among all known servers the table may use, live or not, so a lost
  rack does not relax the policy.
* Best effort: the policy is violated only to keep full replication, and then by as little
  as possible (Kudu's "overflow" locations). With ``PlacementConfig.forced`` (or a tag in
  ``forced_values``) a replica is left missing instead (Elasticsearch forced awareness).
* Spread: replicas differ in every awareness key where the topology allows (KIP-708
  "absolute preferred"), else in as many keys as possible in precedence order ("partially
  preferred"); remaining ties go to the least loaded choice ("least preferred"). Tag
  dimensions are independent: ``zone=a`` under two clusters is the same zone. The keys
  default to the location levels, top first, and the levels follow any explicit keys.
* Load: among equally good choices, power of two choices (seed, "Tablet Creation"): first
  between location classes by replicas per server, then between servers by Kudu's load
  (live replicas + recent creations); the table's own replicas break ties.

Re-replication is the same algorithm for one replica given the existing ones.

Thread-safety: :class:`Placer` is not thread-safe (it tracks the load of its own
placements); use one per call or thread. The module functions are pure apart from
consuming the injected ``random.Random``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError
from pyspark_kudu.master.topology import ClusterSnapshot, Table, Tablet

__all__ = [
    "NOT_ENOUGH_TSERVERS",
    "Placer",
    "Violation",
    "find_violations",
    "max_replicas_per_group",
    "place_extra_replica",
    "place_tablets",
    "validate_replication_factor",
]

#: Kudu's text when no placement at all is possible.
NOT_ENOUGH_TSERVERS = "not enough tablet servers to satisfy replica placement policy"

# Below this many classes the exact scan is as cheap as sampling.
_SAMPLING_MIN_CLASSES = 8
_SAMPLING_TRIES = 12


def max_replicas_per_group(rf: int, n_groups: int) -> int:
    """Most replicas of an ``rf`` tablet one location group may hold among ``n_groups``."""
    if n_groups <= 1:
        return rf
    if n_groups == 2:
        return rf // 2 + 1
    return max(1, rf // 2)


def validate_replication_factor(
    rf: int,
    num_live_tservers: int,
    *,
    allow_even: bool = False,
    min_replicas: int = 1,
    max_replicas: int = 7,
) -> None:
    """Kudu's checks on a requested replication factor, with Kudu's texts.

    Raises:
        InvalidArgumentError: out of range, even (unless ``allow_even``, Kudu's
            ``--allow_unsafe_replication_factor``), or more than the live servers.
    """
    if rf > max_replicas:
        raise InvalidArgumentError(
            f"illegal replication factor {rf}: maximum allowed replication factor is "
            f"{max_replicas} (controlled by --max_num_replicas)"
        )
    if rf < min_replicas:
        raise InvalidArgumentError(
            f"illegal replication factor {rf}: minimum allowed replication factor is "
            f"{min_replicas} (controlled by --min_num_replicas)"
        )
    if rf % 2 == 0 and not allow_even:
        raise InvalidArgumentError(
            f"illegal replication factor {rf}: replication factor must be odd"
        )
    if rf > num_live_tservers:
        raise InvalidArgumentError(
            "not enough live tablet servers to create a table with the requested "
            f"replication factor {rf}; {num_live_tservers} tablet servers are alive"
        )


@dataclass(frozen=True)
class Violation:
    """One way a tablet breaks the policy.

    ``kind`` is ``"placement"`` (``count`` replicas in location group ``location`` at
    ``level``, more than ``limit``) or ``"constraint"`` (a replica on ``ts_uuid`` outside
    the table's constraint). ``avoidable`` says whether a compliant placement exists with
    the live servers the table may use.
    """

    tablet_id: str
    table_id: str
    kind: str
    location: str
    level: int = 0
    count: int = 0
    limit: int = 0
    ts_uuid: str = ""
    avoidable: bool = True


class _Class:
    """Live eligible servers that share every policy and awareness value."""

    __slots__ = ("forced", "idx", "n", "pol", "servers", "spread", "vals")

    def __init__(
        self, idx: int, pol: tuple[int, ...], spread: tuple[int, ...], forced: tuple[int, ...]
    ) -> None:
        self.idx = idx
        self.servers: list[int] = []
        self.n = 0
        self.pol = pol
        self.spread = spread
        self.forced = forced
        self.vals = frozenset(pol + spread + forced)


class _Domain:
    """Index of the servers one table may use (shared by tables with equal settings)."""

    def __init__(self, placer: Placer, table: Table) -> None:
        snap = placer.snapshot
        cfg = snap.config
        level_keys = snap.level_keys()
        aware = snap.awareness_for(table)
        spread_keys = aware + tuple(k for k in level_keys if k not in aware)
        forced_keys = tuple(cfg.forced_values)
        self.forced_all = cfg.forced
        self.forced_sizes = tuple(len(cfg.forced_values[k]) for k in forced_keys)
        cons = table.constraint
        n = len(snap.tservers)
        self.allowed = [
            cons is None or cons.allows(ts.location, placer.tags[i])
            for i, ts in enumerate(snap.tservers)
        ]
        vid = placer.value_id
        self.pol = [tuple(vid(k, placer.tags[i].get(k, "")) for k in level_keys) for i in range(n)]
        spread = [tuple(vid(k, placer.tags[i].get(k, "")) for k in spread_keys) for i in range(n)]
        forced = [tuple(vid(k, placer.tags[i].get(k, "")) for k in forced_keys) for i in range(n)]
        # Every policy/awareness value of each server, in a fixed key order: the
        # rebalancer compares two servers key by key.
        self.keyvals = [self.pol[i] + spread[i] + forced[i] for i in range(n)]
        self.all_vals = [frozenset(kv) for kv in self.keyvals]
        known = [i for i in range(n) if self.allowed[i]]
        self.n_groups = tuple(len({self.pol[i][d] for i in known}) for d in range(len(level_keys)))
        self.classes: list[_Class] = []
        self.class_of: dict[int, _Class] = {}
        by_key: dict[tuple[tuple[int, ...], ...], _Class] = {}
        for i in known:
            if not snap.tservers[i].live:
                continue
            key = (self.pol[i], spread[i], forced[i])
            cls = by_key.get(key)
            if cls is None:
                cls = by_key[key] = _Class(len(self.classes), *key)
                self.classes.append(cls)
            cls.servers.append(i)
            cls.n += 1
            self.class_of[i] = cls
        self.class_total = [sum(placer.total[i] for i in c.servers) for c in self.classes]
        self._limits: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._feasible: dict[int, bool] = {}

    def limits(self, rf: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per-level group limits and per-forced-key value caps for ``rf``."""
        got = self._limits.get(rf)
        if got is None:
            got = self._limits[rf] = (
                tuple(max_replicas_per_group(rf, g) for g in self.n_groups),
                tuple(math.ceil(rf / s) if s else rf for s in self.forced_sizes),
            )
        return got

    def feasible(self, rf: int) -> bool:
        """Whether ``rf`` replicas fit on live eligible servers within every group limit.

        The groups nest (a laminar family), so filling each group up to its limit from
        the bottom level upwards gives the exact maximum.
        """
        got = self._feasible.get(rf)
        if got is None:
            limits, _ = self.limits(rf)
            caps: Counter[tuple[int, ...]] = Counter()
            for c in self.classes:
                caps[c.pol] += c.n
            for d in range(len(limits) - 1, -1, -1):
                up: Counter[tuple[int, ...]] = Counter()
                for pol, cap in caps.items():
                    up[pol[:d]] += min(cap, limits[d])
                caps = up
            got = self._feasible[rf] = sum(caps.values()) >= rf
        return got


class Placer:
    """Places replicas on one snapshot, remembering the load its own placements add.

    ``snapshot`` is read once: per-server load is Kudu's (reported or derived live
    replicas + recent creations), per-table load comes from the snapshot's tablets.
    """

    def __init__(self, snapshot: ClusterSnapshot, rng: random.Random) -> None:
        self.snapshot = snapshot
        self.rng = rng
        self.index = {ts.uuid: i for i, ts in enumerate(snapshot.tservers)}
        self.tags = [snapshot.tags_of(ts) for ts in snapshot.tservers]
        self.total = [snapshot.load_of(ts) for ts in snapshot.tservers]
        self.value_names: list[str] = []
        self._value_ids: dict[tuple[str, str], int] = {}
        self._domains: dict[tuple[object, ...], _Domain] = {}
        self._table_domain: dict[str, _Domain] = {}
        self._table_servers: dict[str, list[int]] = {}
        self._table_classes: dict[str, list[int]] = {}

    # --- indexes -----------------------------------------------------------------------

    def value_id(self, key: str, value: str) -> int:
        got = self._value_ids.get((key, value))
        if got is None:
            got = self._value_ids[(key, value)] = len(self.value_names)
            self.value_names.append(value)
        return got

    def table(self, table_id: str) -> Table:
        try:
            return self.snapshot.table_by_id[table_id]
        except KeyError:
            raise NotFoundError(f"table {table_id} not found in the cluster snapshot") from None

    def domain(self, table: Table) -> _Domain:
        dom = self._table_domain.get(table.table_id)
        if dom is None:
            cons = table.constraint.key() if table.constraint else None
            key = (cons, self.snapshot.awareness_for(table))
            dom = self._domains.get(key)
            if dom is None:
                dom = self._domains[key] = _Domain(self, table)
            self._table_domain[table.table_id] = dom
        return dom

    def _table_counts(self, table: Table) -> tuple[list[int], list[int]]:
        per_server = self._table_servers.get(table.table_id)
        if per_server is None:
            per_server = [0] * len(self.total)
            for tablet in self.snapshot.tablets_by_table.get(table.table_id, ()):
                for r in tablet.replicas:
                    i = self.index.get(r.ts_uuid)
                    if i is not None:
                        per_server[i] += 1
            dom = self.domain(table)
            per_class = [sum(per_server[i] for i in c.servers) for c in dom.classes]
            self._table_servers[table.table_id] = per_server
            self._table_classes[table.table_id] = per_class
        return per_server, self._table_classes[table.table_id]

    # --- load bookkeeping --------------------------------------------------------------

    def apply_add(self, ts_uuid: str, table_id: str) -> None:
        """Account for a replica of ``table_id`` added to ``ts_uuid``."""
        self._adjust(self.index[ts_uuid], self.table(table_id), 1)

    def apply_remove(self, ts_uuid: str, table_id: str) -> None:
        """Account for a replica of ``table_id`` removed from ``ts_uuid``."""
        self._adjust(self.index[ts_uuid], self.table(table_id), -1)

    def _adjust(self, i: int, table: Table, delta: int) -> None:
        per_server, per_class = self._table_counts(table)
        self.total[i] += delta
        per_server[i] += delta
        for dom in self._domains.values():
            c = dom.class_of.get(i)
            if c is not None:
                dom.class_total[c.idx] += delta
        c = self.domain(table).class_of.get(i)
        if c is not None:
            per_class[c.idx] += delta

    # --- placement ---------------------------------------------------------------------

    def place_new(self, table: Table) -> tuple[str, ...]:
        """Servers for the replicas of one new tablet of ``table``.

        Returns fewer than ``replication_factor`` servers only under forced awareness
        (``PlacementConfig.forced`` or ``forced_values``).

        Raises:
            NotFoundError: fewer live eligible servers than the replication factor.
        """
        rf = table.replication_factor
        dom = self.domain(table)
        if sum(c.n for c in dom.classes) < rf:
            raise NotFoundError(NOT_ENOUGH_TSERVERS)
        chosen: list[int] = []
        for _ in range(rf):
            i = self._pick(dom, table, rf, chosen)
            if i is None:
                break
            chosen.append(i)
            self._adjust(i, table, 1)
        return tuple(self.snapshot.tservers[i].uuid for i in chosen)

    def place_extra(self, table: Table, existing: Iterable[str]) -> str | None:
        """A server for one more replica of a tablet of ``table`` whose other replicas are
        on ``existing`` (re-replication); ``None`` if no server may take it."""
        dom = self.domain(table)
        present = [self.index[u] for u in existing if u in self.index]
        i = self._pick(dom, table, table.replication_factor, present)
        if i is None:
            return None
        self._adjust(i, table, 1)
        return self.snapshot.tservers[i].uuid

    def _pick(self, dom: _Domain, table: Table, rf: int, present: list[int]) -> int | None:
        per_server, per_class = self._table_counts(table)
        classes = dom.classes
        if not classes:
            return None
        rand = self.rng.random
        counts: Counter[int] = Counter()
        for i in present:
            counts.update(dom.all_vals[i])
        # Fast path: with many classes, the ideal ones (sharing no value with the existing
        # replicas, hence no server either) are found by sampling; uniform sampling
        # conditioned on being ideal is uniform over the ideal tier, as the exact scan.
        nc = len(classes)
        if nc >= _SAMPLING_MIN_CLASSES:
            keys = counts.keys()
            first: _Class | None = None
            for _ in range(_SAMPLING_TRIES):
                c = classes[int(rand() * nc)]
                if keys.isdisjoint(c.vals) and c is not first:
                    if first is None:
                        first = c
                    else:
                        best = self._better_class(dom, per_class, first, c)
                        return self._pick_server(best.servers, per_server, ())
        tier = self._best_tier(dom, rf, counts, present)
        if not tier:
            return None
        if len(tier) == 1:
            best = tier[0]
        else:
            a = int(rand() * len(tier))
            b = int(rand() * (len(tier) - 1))
            best = self._better_class(dom, per_class, tier[a], tier[b + (b >= a)])
        return self._pick_server(best.servers, per_server, set(present))

    def _best_tier(
        self, dom: _Domain, rf: int, counts: Counter[int], present: list[int]
    ) -> list[_Class]:
        limits, caps = dom.limits(rf)
        in_class = Counter(dom.class_of[i].idx for i in present if i in dom.class_of)
        best: tuple[int, ...] | None = None
        tier: list[_Class] = []
        for c in dom.classes:
            if c.n <= in_class.get(c.idx, 0):
                continue
            score: list[int] = []
            for lim, v in zip(limits, c.pol, strict=True):
                excess = counts.get(v, 0) + 1 - lim
                if excess > 0 and dom.forced_all:
                    break
                score.append(max(excess, 0))
            else:
                if any(counts.get(v, 0) >= cap for cap, v in zip(caps, c.forced, strict=True)):
                    continue
                score.extend(counts.get(v, 0) for v in c.spread)
                key = tuple(score)
                if best is None or key < best:
                    best, tier = key, [c]
                elif key == best:
                    tier.append(c)
        return tier

    def _better_class(self, dom: _Domain, per_class: list[int], a: _Class, b: _Class) -> _Class:
        # Location load is replicas per server (seed, "Definitions"); the table's own load
        # breaks ties so that one table does not pile onto a location.
        la = (dom.class_total[a.idx] / a.n, per_class[a.idx] / a.n)
        lb = (dom.class_total[b.idx] / b.n, per_class[b.idx] / b.n)
        if la == lb:
            return a if self.rng.random() < 0.5 else b
        return a if la < lb else b

    def _pick_server(
        self, servers: list[int], per_server: list[int], excluded: set[int] | tuple[()]
    ) -> int:
        free = [i for i in servers if i not in excluded] if excluded else servers
        n = len(free)
        if n == 1:
            return free[0]
        rand = self.rng.random
        a = int(rand() * n)
        b = int(rand() * (n - 1))
        ia, ib = free[a], free[b + (b >= a)]
        la = (self.total[ia], per_server[ia])
        lb = (self.total[ib], per_server[ib])
        if la == lb:
            return ia if rand() < 0.5 else ib
        return ia if la < lb else ib

    # --- policy check ------------------------------------------------------------------

    def violations(self, tablet: Tablet) -> list[Violation]:
        """How ``tablet``'s current replicas break the policy (REPLACE-marked included)."""
        table = self.table(tablet.table_id)
        dom = self.domain(table)
        rf = table.replication_factor
        out: list[Violation] = []
        present = [self.index[r.ts_uuid] for r in tablet.replicas if r.ts_uuid in self.index]
        for i in present:
            if not dom.allowed[i]:
                ts = self.snapshot.tservers[i]
                out.append(
                    Violation(
                        tablet.tablet_id, table.table_id, "constraint",
                        ts.location or "", ts_uuid=ts.uuid,
                        avoidable=dom.feasible(rf)
                        if dom.forced_all
                        else sum(c.n for c in dom.classes) >= rf,
                    )
                )
        for d, v, cnt, lim in self._over_limits(dom, rf, present):
            out.append(
                Violation(
                    tablet.tablet_id, table.table_id, "placement",
                    self.value_names[v], level=d + 1, count=cnt, limit=lim,
                    avoidable=dom.feasible(rf),
                )
            )
        return out

    def excess(self, table: Table, present: Sequence[int]) -> tuple[int, int]:
        """(replicas outside the constraint, replicas above group limits) for the replica
        set on server indexes ``present``."""
        dom = self.domain(table)
        outside = sum(1 for i in present if not dom.allowed[i])
        over = sum(cnt - lim for _, _, cnt, lim in self._over_limits(
            dom, table.replication_factor, present))
        return outside, over

    @staticmethod
    def _over_limits(
        dom: _Domain, rf: int, present: Sequence[int]
    ) -> list[tuple[int, int, int, int]]:
        """``(level, group value, count, limit)`` for every group above its limit."""
        limits, _ = dom.limits(rf)
        out = []
        for d, lim in enumerate(limits):
            vals = [dom.pol[i][d] for i in present]
            if lim >= len(vals) or len(set(vals)) == len(vals):
                continue  # every limit is at least 1: distinct groups never exceed it
            for v, cnt in Counter(vals).items():
                if cnt > lim:
                    out.append((d, v, cnt, lim))
        return out


def place_tablets(
    snapshot: ClusterSnapshot, table: Table | str, num_tablets: int, rng: random.Random
) -> list[tuple[str, ...]]:
    """Servers for the replicas of ``num_tablets`` new tablets of ``table``.

    Each tablet's placement accounts for the earlier ones (Kudu's recent creations).

    Raises:
        NotFoundError: ``not enough tablet servers to satisfy replica placement policy``.
    """
    placer = Placer(snapshot, rng)
    tbl = placer.table(table) if isinstance(table, str) else table
    return [placer.place_new(tbl) for _ in range(num_tablets)]


def place_extra_replica(
    snapshot: ClusterSnapshot,
    tablet: Tablet,
    rng: random.Random,
    *,
    replacing: Iterable[str] = (),
) -> str | None:
    """A server for one extra replica of ``tablet`` (re-replication).

    The replicas in ``replacing`` and those marked REPLACE do not count as existing.
    Returns ``None`` when no server may take the replica (forced awareness, constraint,
    or every eligible server already hosts one).
    """
    gone = set(replacing)
    existing = [r.ts_uuid for r in tablet.replicas if not r.replace and r.ts_uuid not in gone]
    placer = Placer(snapshot, rng)
    return placer.place_extra(placer.table(tablet.table_id), existing)


def find_violations(snapshot: ClusterSnapshot) -> list[Violation]:
    """Every policy and constraint violation in the snapshot, tablet by tablet."""
    placer = Placer(snapshot, random.Random(0))
    out: list[Violation] = []
    for tablet in snapshot.tablets:
        out.extend(placer.violations(tablet))
    return out
