"""Replica placement for tablet creation and re-replication, and the policy check.

Seed: kudu-location-awareness ("Placement policies", "Tablet Creation", "Re-replication"),
as Kudu's ``PlacementPolicy`` now does it (least-loaded location with an overflow group,
newer than the seed's power of two choices between locations), generalised with
hierarchical locations and KIP-708 / Elasticsearch awareness keys.

The policy, for every tablet of replication factor *r*:

* A tablet server never hosts two replicas of one tablet, and a table's replicas only go
  to live servers its :class:`~.topology.TableConstraint` allows (seed use cases 3, 4).
* Location groups (:func:`max_replicas_per_group`): with more than 2 groups losing any one
  group must leave a majority, so one holds at most ``(r - 1) // 2`` -- ``r // 2`` for an
  odd *r*, ``r / 2 - 1`` for an even one, where half is already a violation (Kudu) -- and
  never fewer than 1; with 2 groups at most ``r // 2 + 1``; with 1 group no limit.
  Hierarchical locations (``/dc/rack``) apply this at every level, top level first.
  Groups are counted among all known servers the table may use, live or not, so a lost
  rack does not relax the policy.
* Location choice, one replica at a time (Kudu's ``SelectLocation``): the *least-loaded*
  eligible location, load being replicas per live server the table may use (reported or
  derived live replicas + recent creations + this placer's own placements, so the
  tablet's replicas placed so far count). A location is in Kudu's overflow group when one
  more replica would give one of its groups a majority (half, for an even *r*) among more
  than 2 groups, or more than half among 2 (:func:`overflow_threshold`); it is eligible
  only when nothing else fits, and then the choice that breaks the policy least, top
  level first, wins (Kudu, without levels, takes any overflow location). Ties are
  broken at random: of two tied locations drawn, the one where the table itself has fewer
  replicas per server wins, so that one table's tablets spread too.
* Best effort: the policy is violated only to keep full replication, and then by as little
  as possible. With ``PlacementConfig.forced`` (or a tag in ``forced_values``) a replica
  is left missing instead (Elasticsearch forced awareness).
* Tags: awareness keys that are not location levels are spread before load: replicas
  differ in every such key where the topology allows (KIP-708 "absolute preferred"), else
  in as many keys as possible in precedence order ("partially preferred"); load decides
  the rest ("least preferred"). Tag dimensions are independent: ``zone=a`` under two
  clusters is the same zone. Location levels are left to the rules above.
* Server choice: power of two choices (seed, "Tablet Creation") between the chosen
  location's free servers, by Kudu's server load (live replicas + recent creations); the
  table's own replicas break ties.

Re-replication is the same algorithm for one replica given the existing ones. The limits
themselves, the replication-factor checks and :class:`Violation` are in
:mod:`.placement_rules` (re-exported here).

Thread-safety: :class:`Placer` is not thread-safe (it tracks the load of its own
placements); use one per call or thread. The module functions are pure apart from
consuming the injected ``random.Random``.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence

from pyspark_kudu.errors import NotFoundError
from pyspark_kudu.master.placement_rules import (
    NOT_ENOUGH_TSERVERS,
    Violation,
    max_replicas_per_group,
    overflow_threshold,
    validate_replication_factor,
)
from pyspark_kudu.master.topology import NO_LOCATION, ClusterSnapshot, Table, Tablet

__all__ = [
    "NOT_ENOUGH_TSERVERS",
    "Placer",
    "Violation",
    "find_violations",
    "max_replicas_per_group",
    "overflow_threshold",
    "place_extra_replica",
    "place_tablets",
    "validate_replication_factor",
]

class _Class:
    """Live eligible servers of one location that share every policy and awareness value."""

    __slots__ = ("forced", "idx", "loc", "n", "pol", "servers", "spread", "vals")

    def __init__(
        self,
        idx: int,
        loc: int,
        pol: tuple[int, ...],
        spread: tuple[int, ...],
        forced: tuple[int, ...],
    ) -> None:
        self.idx = idx
        self.loc = loc
        self.servers: list[int] = []
        self.n = 0
        self.pol = pol
        self.spread = spread
        self.forced = forced
        self.vals = frozenset(pol + spread + forced)


class _Domain:
    """Index of the servers one table may use (shared by tables with equal settings).

    Locations are the leaf locations holding live servers the table may use, numbered in
    ``loc_servers``; their loads (``loc_total`` / servers, also kept sorted in
    ``by_load``) are updated through :meth:`add_load` as replicas are placed.
    """

    def __init__(self, placer: Placer, table: Table) -> None:
        snap = placer.snapshot
        cfg = snap.config
        level_keys = snap.level_keys()
        # Location levels are the policy's business (limits, overflow, load); only other
        # awareness keys (tags) are spread ahead of load.
        spread_keys = tuple(k for k in snap.awareness_for(table) if k not in level_keys)
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
        self.loc_servers: list[list[int]] = []
        self.loc_classes: list[list[_Class]] = []
        self.val_classes: dict[int, list[_Class]] = {}
        self._index_live(placer, [i for i in known if snap.tservers[i].live], spread, forced)
        self.loc_total = [sum(placer.total[i] for i in srv) for srv in self.loc_servers]
        self.loc_load = [t / len(srv) for t, srv in zip(self.loc_total, self.loc_servers,
                                                        strict=True)]
        # (load, location) in ascending order: the least-loaded location is found without
        # scanning every location per replica.
        self.by_load = sorted((load, k) for k, load in enumerate(self.loc_load))
        self._limits: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._overflow: dict[int, tuple[int, ...]] = {}
        self._feasible: dict[int, bool] = {}

    def _index_live(
        self,
        placer: Placer,
        live: list[int],
        spread: list[tuple[int, ...]],
        forced: list[tuple[int, ...]],
    ) -> None:
        """Group the live eligible servers into locations and classes."""
        loc_ids: dict[str, int] = {}
        by_key: dict[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]], _Class] = {}
        for i in live:
            name = placer.snapshot.tservers[i].location or NO_LOCATION
            loc = loc_ids.get(name)
            if loc is None:
                loc = loc_ids[name] = len(self.loc_servers)
                self.loc_servers.append([])
                self.loc_classes.append([])
            key = (loc, self.pol[i], spread[i], forced[i])
            cls = by_key.get(key)
            if cls is None:
                cls = by_key[key] = _Class(len(self.classes), loc, *key[1:])
                self.classes.append(cls)
                self.loc_classes[loc].append(cls)
                for v in cls.vals:
                    self.val_classes.setdefault(v, []).append(cls)
            cls.servers.append(i)
            cls.n += 1
            self.class_of[i] = cls
            self.loc_servers[loc].append(i)

    def add_load(self, k: int, delta: float) -> None:
        """Account for ``delta`` more replicas in location ``k``."""
        by_load = self.by_load
        del by_load[bisect.bisect_left(by_load, (self.loc_load[k], k))]
        self.loc_total[k] += delta
        self.loc_load[k] = self.loc_total[k] / len(self.loc_servers[k])
        bisect.insort(by_load, (self.loc_load[k], k))

    def limits(self, rf: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per-level group limits and per-forced-key value caps for ``rf``."""
        got = self._limits.get(rf)
        if got is None:
            got = self._limits[rf] = (
                tuple(max_replicas_per_group(rf, g) for g in self.n_groups),
                tuple(math.ceil(rf / s) if s else rf for s in self.forced_sizes),
            )
        return got

    def overflow(self, rf: int) -> tuple[int, ...]:
        """Per-level overflow thresholds for ``rf``."""
        got = self._overflow.get(rf)
        if got is None:
            got = self._overflow[rf] = tuple(overflow_threshold(rf, g) for g in self.n_groups)
        return got

    def touched(
        self, counts: dict[int, int], present: Sequence[int]
    ) -> tuple[dict[int, _Class], dict[int, int]]:
        """Classes sharing a value with the present replicas or holding one of them, and
        how many present replicas each class holds.

        Every other class is an ideal choice: it adds to no group of the tablet's.
        """
        out: dict[int, _Class] = {}
        taken: dict[int, int] = {}
        for v in counts:
            for c in self.val_classes.get(v, ()):
                out[c.idx] = c
        for i in present:
            own = self.class_of.get(i)
            if own is not None:
                out[own.idx] = own
                taken[own.idx] = taken.get(own.idx, 0) + 1
        return out, taken

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
    replicas + recent creations), per-table load comes from the snapshot's tablets; a
    location's load is the sum over its servers divided by their number.
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
        self._table_locs: dict[str, list[int]] = {}

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
        """The table's replicas per server, and per location of its domain."""
        per_server = self._table_servers.get(table.table_id)
        if per_server is None:
            per_server = [0] * len(self.total)
            for tablet in self.snapshot.tablets_by_table.get(table.table_id, ()):
                for r in tablet.replicas:
                    i = self.index.get(r.ts_uuid)
                    if i is not None:
                        per_server[i] += 1
            dom = self.domain(table)
            per_loc = [sum(per_server[i] for i in srv) for srv in dom.loc_servers]
            self._table_servers[table.table_id] = per_server
            self._table_locs[table.table_id] = per_loc
        return per_server, self._table_locs[table.table_id]

    # --- load bookkeeping --------------------------------------------------------------

    def apply_add(self, ts_uuid: str, table_id: str) -> None:
        """Account for a replica of ``table_id`` added to ``ts_uuid``."""
        self._adjust(self.index[ts_uuid], self.table(table_id), 1)

    def apply_remove(self, ts_uuid: str, table_id: str) -> None:
        """Account for a replica of ``table_id`` removed from ``ts_uuid``."""
        self._adjust(self.index[ts_uuid], self.table(table_id), -1)

    def _adjust(self, i: int, table: Table, delta: int) -> None:
        per_server, per_loc = self._table_counts(table)
        self.total[i] += delta
        per_server[i] += delta
        for dom in self._domains.values():
            c = dom.class_of.get(i)
            if c is not None:
                dom.add_load(c.loc, delta)
        c = self.domain(table).class_of.get(i)
        if c is not None:
            per_loc[c.loc] += delta

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
        if len(dom.class_of) < rf:
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
        """One server for the next replica of a tablet whose replicas are on ``present``."""
        if not dom.classes:
            return None
        per_server, per_loc = self._table_counts(table)
        by_loc: dict[int, list[_Class]] = {}  # no replica yet: every location is ideal
        if present:
            counts: dict[int, int] = {}  # replicas per policy/awareness value
            for i in present:
                for v in dom.all_vals[i]:
                    counts[v] = counts.get(v, 0) + 1
            got = self._best_tier(dom, rf, counts, present)
            if got is None:
                return None
            by_loc = got
        loc = self._least_loaded(dom, per_loc, by_loc)
        tier = by_loc.get(loc)
        if tier is None:
            # A location holding none of the tablet's values or replicas: all of it is free.
            servers = dom.loc_servers[loc]
        else:
            servers = [i for c in tier for i in c.servers if i not in present]
        return self._pick_server(servers, per_server)

    def _best_tier(
        self, dom: _Domain, rf: int, counts: dict[int, int], present: list[int]
    ) -> dict[int, list[_Class]] | None:
        """The best choices for the next replica, or ``None`` if no server may take it.

        Only classes the tablet touches are scored; the others score zero (ideal). The
        result maps every touched location to its classes in the best tier; a location
        missing from it lies wholly in the tier (there are such locations only when the
        best tier is the ideal one).
        """
        touched, taken = dom.touched(counts, present)
        by_loc: dict[int, list[_Class]] = {}
        loc_classes = dom.loc_classes
        for c in touched.values():
            if c.loc not in by_loc:
                here = loc_classes[c.loc]
                by_loc[c.loc] = [x for x in here if x.idx not in touched] if len(here) > 1 else []
        free = [c for c in touched.values() if c.n > taken.get(c.idx, 0)]
        if len(touched) < len(dom.classes):
            # Some class is ideal, so the tier is the ideal one: no need for full scores.
            thresholds = dom.overflow(rf)
            for c in free:
                if self._is_ideal(dom, rf, thresholds, counts, c):
                    by_loc[c.loc].append(c)
            return by_loc
        scored = [(sc, c) for c in free if (sc := self._score(dom, rf, counts, c)) is not None]
        if not scored:
            return None
        best = min(sc for sc, _ in scored)
        for sc, c in scored:
            if sc == best:
                by_loc[c.loc].append(c)
        return by_loc

    @staticmethod
    def _is_ideal(
        dom: _Domain, rf: int, thresholds: tuple[int, ...], counts: dict[int, int], c: _Class
    ) -> bool:
        """Whether :meth:`_score` of ``c`` is all zero (cheaper than computing it)."""
        get = counts.get
        for thr, v in zip(thresholds, c.pol, strict=True):
            if get(v, 0) >= thr:
                return False
        for v in c.spread:
            if get(v, 0):
                return False
        if c.forced:
            _, caps = dom.limits(rf)
            return all(get(v, 0) < cap for cap, v in zip(caps, c.forced, strict=True))
        return True

    @staticmethod
    def _score(
        dom: _Domain, rf: int, counts: dict[int, int], c: _Class
    ) -> tuple[int, ...] | None:
        """How badly one more replica in ``c`` fits (lower is better; all zero is ideal).

        Replicas over the policy limit per level, top first; then replicas over the
        overflow threshold per level (Kudu's overflow group); then, per tag awareness key,
        replicas already sharing the value. ``None``: forbidden (forced awareness).
        """
        limits, caps = dom.limits(rf)
        over_limit: list[int] = []
        over_threshold: list[int] = []
        for lim, thr, v in zip(limits, dom.overflow(rf), c.pol, strict=True):
            after = counts.get(v, 0) + 1
            if after > lim and dom.forced_all:
                return None
            over_limit.append(max(after - lim, 0))
            over_threshold.append(max(after - thr, 0))
        if any(counts.get(v, 0) >= cap for cap, v in zip(caps, c.forced, strict=True)):
            return None
        return (*over_limit, *over_threshold, *(counts.get(v, 0) for v in c.spread))

    def _least_loaded(
        self, dom: _Domain, per_loc: list[int], by_loc: dict[int, list[_Class]]
    ) -> int:
        """The least-loaded location of the tier (Kudu's ``SelectLocation``).

        Ties are broken at random; of two tied locations drawn, the one where the table
        itself has fewer replicas per server (``per_loc``) wins, so one table's tablets
        spread too.
        """
        by_load = dom.by_load
        shut = {k for k, tier in by_loc.items() if not tier} if by_loc else None
        j = 0
        while shut and by_load[j][1] in shut:
            j += 1
        least = by_load[j][0]
        end = bisect.bisect_left(by_load, (least, len(by_load)), j)
        ties = by_load[j:end]
        if shut and any(dom.loc_load[k] == least for k in shut):
            ties = [t for t in ties if t[1] not in shut]
        n = len(ties)
        if n == 1:
            return ties[0][1]
        rand = self.rng.random
        a = int(rand() * n)
        b = int(rand() * (n - 1))
        ka, kb = ties[a][1], ties[b + (b >= a)][1]
        own_a = per_loc[ka] * len(dom.loc_servers[kb])
        own_b = per_loc[kb] * len(dom.loc_servers[ka])
        if own_a == own_b:
            return ka if rand() < 0.5 else kb
        return ka if own_a < own_b else kb

    def _pick_server(self, servers: list[int], per_server: list[int]) -> int:
        """Power of two choices between ``servers`` by Kudu's load; the table's own
        replicas, then chance, break ties."""
        n = len(servers)
        if n == 1:
            return servers[0]
        rand = self.rng.random
        a = int(rand() * n)
        b = int(rand() * (n - 1))
        ia, ib = servers[a], servers[b + (b >= a)]
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
