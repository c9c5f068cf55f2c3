"""The rebalancer: a plan of replica moves that restores the policy, then balances.

Seed: kudu-location-awareness, "Rebalancing" (stage 1 and stage 2). Shared by the master
and ``cluster rebalance`` in the tools.

* Stage 1 fixes violations, one replica at a time: a replica outside its table's
  constraint, or, in a location group above its limit, the non-leader replica on the most
  loaded server of that group (Kudu's ``FindBestReplicaToReplace``). The limit is
  :func:`.placement.max_replicas_per_group`: beyond two groups no group may hold a
  majority, and for an even replication factor not even half (losing that group would
  lose the majority). The replacement is chosen by re-replication placement
  (:meth:`.placement.Placer.place_extra`: the least-loaded eligible location), and a move
  is kept only if it reduces the tablet's violations, so an unfixable one (RF 4 over three
  locations) is left alone.
* Stage 2 balances, in order: each table across locations; the cluster across locations;
  then, within each location, each table and the cluster across servers (Kudu's original
  greedy). A move goes from the most loaded bin to the least loaded one while it strictly
  lowers ``sum(replicas**2 / servers)``; when the most loaded location has no legal move
  left it is dropped from consideration (seed, step f). Cluster moves only take a
  replica of a table that is at least as loaded on the source as on the target, so
  per-table balance is never traded for cluster balance. Locations are the full (leaf)
  paths; in a regular hierarchy balanced racks make balanced datacenters. Like the
  seed's algorithm this is greedy: it does not promise an optimum in odd topologies.
* A stage-2 move never breaks the policy or a constraint: the target must be live, allowed
  by the table's constraint, free of the tablet, and, for every location level and
  awareness key, hold a value shared by no more of the tablet's other replicas than the
  source's value. So a move can never worsen a tablet's spread.
* Only healthy tablets move (all replicas voters on live servers, as many as the
  replication factor, no REPLACE mark); re-replication handles the rest.
* Each move is executed add-then-remove (seed: kudu-raft-config-change, 3-4-3): add the
  target as a NON_VOTER, promote it once caught up, then remove the source.

Thread-safety: everything here is a pure function of its arguments (the ``random.Random``
is consumed); no shared state.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.master.placement import Placer, Violation
from pyspark_kudu.master.topology import (
    NO_LOCATION,
    ClusterSnapshot,
    Replica,
    ReplicaRole,
    Table,
    Tablet,
)

__all__ = [
    "LocationLoad",
    "RebalancePlan",
    "RebalanceReport",
    "ReplicaMove",
    "apply_moves",
    "location_loads",
    "plan_rebalance",
    "skews",
    "violation_summary",
]


@dataclass(frozen=True)
class ReplicaMove:
    """Move one replica: add ``to_uuid`` (non-voter, then promoted), remove ``from_uuid``.

    A stage-1 move may equally be carried out as the seed describes, by marking the
    source REPLACE and letting the master re-replicate: the master's choice uses the same
    placement algorithm that chose ``to_uuid``.
    """

    tablet_id: str
    table_id: str
    from_uuid: str
    to_uuid: str
    stage: int
    reason: str


@dataclass(frozen=True)
class LocationLoad:
    location: str
    servers: int
    replicas: int

    @property
    def load(self) -> float:
        return self.replicas / self.servers if self.servers else 0.0


@dataclass(frozen=True)
class RebalanceReport:
    """What the plan does: loads, violations and skews before and after it."""

    loads_before: tuple[LocationLoad, ...]
    loads_after: tuple[LocationLoad, ...]
    violations_before: tuple[Violation, ...]
    violations_after: tuple[Violation, ...]
    skew_before: Mapping[str, float]
    skew_after: Mapping[str, float]
    moves_by_reason: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RebalancePlan:
    moves: tuple[ReplicaMove, ...]
    report: RebalanceReport


def _leaf(location: str | None) -> str:
    return location or NO_LOCATION


def location_loads(snapshot: ClusterSnapshot) -> tuple[LocationLoad, ...]:
    """Replicas and live servers per location (replicas on live servers only)."""
    servers: Counter[str] = Counter()
    replicas: Counter[str] = Counter()
    counts = snapshot.replica_counts
    for ts in snapshot.live_tservers:
        servers[_leaf(ts.location)] += 1
        replicas[_leaf(ts.location)] += counts.get(ts.uuid, 0)
    return tuple(LocationLoad(loc, servers[loc], replicas[loc]) for loc in sorted(servers))


def skews(snapshot: ClusterSnapshot) -> dict[str, float]:
    """``cluster``: max-min replicas over live servers; ``table``: the worst table's max-min
    over the live servers it may use; ``location``: max-min replicas per server between
    locations (seed, "Definitions")."""
    placer = Placer(snapshot, random.Random(0))
    live = [i for i, ts in enumerate(snapshot.tservers) if ts.live]
    counts = snapshot.replica_counts
    totals = [counts.get(snapshot.tservers[i].uuid, 0) for i in live]
    worst_table = 0
    for table in snapshot.tables:
        dom = placer.domain(table)
        per: Counter[str] = Counter()
        for tablet in snapshot.tablets_by_table.get(table.table_id, ()):
            per.update(tablet.ts_uuids)
        vals = [per.get(snapshot.tservers[i].uuid, 0) for c in dom.classes for i in c.servers]
        if vals:
            worst_table = max(worst_table, max(vals) - min(vals))
    loads = [ll.load for ll in location_loads(snapshot)]
    return {
        "cluster": float(max(totals) - min(totals)) if totals else 0.0,
        "table": float(worst_table),
        "location": (max(loads) - min(loads)) if loads else 0.0,
    }


def violation_summary(violations: Iterable[Violation]) -> list[tuple[str, int, int]]:
    """Rows ``(location, tables, tablets)`` as in Kudu's placement policy violations table."""
    tables: dict[str, set[str]] = {}
    tablets: dict[str, set[str]] = {}
    for v in violations:
        tables.setdefault(v.location, set()).add(v.table_id)
        tablets.setdefault(v.location, set()).add(v.tablet_id)
    return [(loc, len(tables[loc]), len(tablets[loc])) for loc in sorted(tables)]


class _Planner:
    """Mutable working copy of the replica layout while a plan is built."""

    def __init__(self, snapshot: ClusterSnapshot, rng: random.Random) -> None:
        self.snap = snapshot
        self.placer = Placer(snapshot, rng)
        self.rng = rng
        n = len(snapshot.tservers)
        self.live = [ts.live for ts in snapshot.tservers]
        self.loc_names = sorted({_leaf(ts.location) for ts in snapshot.tservers})
        loc_id = {name: k for k, name in enumerate(self.loc_names)}
        self.loc = [loc_id[_leaf(ts.location)] for ts in snapshot.tservers]
        self.loc_servers: list[list[int]] = [[] for _ in self.loc_names]
        for i in range(n):
            if self.live[i]:
                self.loc_servers[self.loc[i]].append(i)
        self.tables = list(snapshot.tables)
        t_id = {t.table_id: k for k, t in enumerate(self.tables)}
        self.tablets = list(snapshot.tablets)
        self.table_of: list[int] = []
        self.reps: list[list[int]] = []
        self.leader: list[int] = []
        self.healthy: list[bool] = []
        self.total = [0] * n
        self.cnt = [[0] * n for _ in self.tables]
        # Movable (healthy) tablets per table and server; sparse, so that many tables on
        # many servers stay cheap.
        self.mov: list[dict[int, set[int]]] = [{} for _ in self.tables]
        idx = self.placer.index
        for x, tablet in enumerate(self.tablets):
            t = t_id.get(tablet.table_id, -1)
            reps = [idx[r.ts_uuid] for r in tablet.replicas if r.ts_uuid in idx]
            self.table_of.append(t)
            self.reps.append(reps)
            lead = tablet.leader
            self.leader.append(idx.get(lead.ts_uuid, -1) if lead else -1)
            for i in reps:
                self.total[i] += 1
                if t >= 0:
                    self.cnt[t][i] += 1
            healthy = t >= 0 and self._healthy(tablet, self.tables[t], reps)
            self.healthy.append(healthy)
            if healthy:
                for i in reps:
                    self.mov[t].setdefault(i, set()).add(x)
        self.moves: list[ReplicaMove] = []
        self.max_moves: int | None = None

    def _healthy(self, tablet: Tablet, table: Table, reps: list[int]) -> bool:
        return (
            len(reps) == len(tablet.replicas) == table.replication_factor
            and all(self.live[i] for i in reps)
            and all(r.role is ReplicaRole.VOTER and not r.replace for r in tablet.replicas)
        )

    def budget_left(self) -> bool:
        return self.max_moves is None or len(self.moves) < self.max_moves

    # --- moves ---------------------------------------------------------------------------

    def legal(self, x: int, src: int, dst: int) -> bool:
        """A stage-2 move keeps the policy, the constraint and the tablet's spread."""
        reps = self.reps[x]
        if dst in reps or not self.live[dst]:
            return False
        dom = self.placer.domain(self.tables[self.table_of[x]])
        if not dom.allowed[dst]:
            return False
        kv = dom.keyvals
        ks, kd = kv[src], kv[dst]
        for j, (vs, vd) in enumerate(zip(ks, kd, strict=True)):
            if vs == vd:
                continue
            cs = cd = 0
            for o in reps:
                if o != src:
                    vo = kv[o][j]
                    cs += vo == vs
                    cd += vo == vd
            if cd > cs:
                return False
        return True

    def move(self, x: int, src: int, dst: int, stage: int, reason: str) -> None:
        t = self.table_of[x]
        reps = self.reps[x]
        reps[reps.index(src)] = dst
        if self.leader[x] == src:
            self.leader[x] = -1
        self.total[src] -= 1
        self.total[dst] += 1
        self.cnt[t][src] -= 1
        self.cnt[t][dst] += 1
        self.mov[t][src].discard(x)
        self.mov[t].setdefault(dst, set()).add(x)
        servers = self.snap.tservers
        self.moves.append(
            ReplicaMove(
                self.tablets[x].tablet_id, self.tables[t].table_id,
                servers[src].uuid, servers[dst].uuid, stage, reason,
            )
        )

    # --- stage 1 -------------------------------------------------------------------------

    def fix_violations(self) -> None:
        placer = self.placer
        for x in range(len(self.tablets)):
            if not self.healthy[x]:
                continue
            t = self.table_of[x]
            table = self.tables[t]
            uuids = self.snap.tservers
            for _ in range(table.replication_factor):
                if not self.budget_left():
                    return
                before = placer.excess(table, self.reps[x])
                if before == (0, 0):
                    break
                src, reason = self._replica_to_replace(x, table)
                others = [i for i in self.reps[x] if i != src]
                target = placer.place_extra(table, [uuids[i].uuid for i in others])
                if target is None:
                    break
                dst = placer.index[target]
                if placer.excess(table, [*others, dst]) >= before:
                    placer.apply_remove(target, table.table_id)
                    break
                placer.apply_remove(uuids[src].uuid, table.table_id)
                self.move(x, src, dst, 1, reason)

    def _replica_to_replace(self, x: int, table: Table) -> tuple[int, str]:
        dom = self.placer.domain(table)
        reps = self.reps[x]
        outside = [i for i in reps if not dom.allowed[i]]
        if outside:
            return outside[0], "constraint"
        limits, _ = dom.limits(table.replication_factor)
        for d, lim in enumerate(limits):
            counts = Counter(dom.pol[i][d] for i in reps)
            over = [v for v, c in counts.items() if c > lim]
            if over:
                group = [i for i in reps if dom.pol[i][d] == over[0]]
                # Most loaded first; a non-leader if there is one (Kudu: removing the
                # leader would make clients reconnect).
                group.sort(key=lambda i: (i == self.leader[x], -self.total[i]))
                return group[0], "placement policy"
        raise AssertionError("no violation to fix")

    # --- stage 2 -------------------------------------------------------------------------

    @staticmethod
    def _better(cs: int, ns: int, cd: int, nd: int) -> bool:
        """Moving one replica from (cs, ns) to (cd, nd) lowers sum(c**2 / n)."""
        return 2 * (cs * nd - cd * ns) > ns + nd

    def _try_move(self, t: int, srcs: list[int], dsts: list[int], reason: str) -> bool:
        cnt = self.cnt[t]
        total = self.total
        srcs = sorted(srcs, key=lambda i: (-cnt[i], -total[i]))
        dsts = sorted(dsts, key=lambda i: (cnt[i], total[i]))
        for s in srcs:
            cands = self.mov[t].get(s)
            if not cands:
                continue
            for x in sorted(cands, key=lambda x: self.leader[x] == s):
                for d in dsts:
                    if self.legal(x, s, d):
                        self.move(x, s, d, 2, reason)
                        return True
        return False

    def balance_table_across_locations(self, t: int) -> None:
        dom = self.placer.domain(self.tables[t])
        bins: dict[int, list[int]] = {}
        for c in dom.classes:
            for i in c.servers:
                bins.setdefault(self.loc[i], []).append(i)
        cnt = self.cnt[t]
        active = set(bins)
        while len(active) >= 2 and self.budget_left():
            load = {k: sum(cnt[i] for i in bins[k]) for k in active}
            order = sorted(active, key=lambda k: load[k] / len(bins[k]))
            src = order[-1]
            moved = False
            for dst in order[:-1]:
                if not self._better(load[src], len(bins[src]), load[dst], len(bins[dst])):
                    break
                if self._try_move(t, bins[src], bins[dst], "table balance across locations"):
                    moved = True
                    break
            if not moved:
                active.discard(src)

    def balance_cluster_across_locations(self) -> None:
        bins = {k: srv for k, srv in enumerate(self.loc_servers) if srv}
        tbins: list[dict[int, list[int]]] = []
        for table in self.tables:
            dom = self.placer.domain(table)
            per: dict[int, list[int]] = {}
            for c in dom.classes:
                for i in c.servers:
                    per.setdefault(self.loc[i], []).append(i)
            tbins.append(per)
        active = set(bins)
        while len(active) >= 2 and self.budget_left():
            load = {k: sum(self.total[i] for i in bins[k]) for k in active}
            order = sorted(active, key=lambda k: load[k] / len(bins[k]))
            src = order[-1]
            moved = False
            for dst in order[:-1]:
                if not self._better(load[src], len(bins[src]), load[dst], len(bins[dst])):
                    break
                if self._cluster_move(tbins, src, dst):
                    moved = True
                    break
            if not moved:
                active.discard(src)

    def _cluster_move(self, tbins: list[dict[int, list[int]]], src: int, dst: int) -> bool:
        cands = []
        for t, per in enumerate(tbins):
            s_srv, d_srv = per.get(src), per.get(dst)
            if not s_srv or not d_srv:
                continue
            cs = sum(self.cnt[t][i] for i in s_srv)
            cd = sum(self.cnt[t][i] for i in d_srv)
            ns, nd = len(s_srv), len(d_srv)
            # Keep the table's own balance: its sum(c**2 / n) must not grow.
            if cs and 2 * (cs * nd - cd * ns) >= ns + nd:
                cands.append((cd / nd - cs / ns, t))
        for _, t in sorted(cands):
            if self._try_move(t, tbins[t][src], tbins[t][dst], "cluster balance across locations"):
                return True
        return False

    def balance_within_location(self, k: int) -> None:
        servers = self.loc_servers[k]
        for t, table in enumerate(self.tables):
            allowed = self.placer.domain(table).allowed
            srv = [i for i in servers if allowed[i]]
            self._greedy(srv, self.cnt[t], functools.partial(self._table_move_servers, t))
        self._greedy(servers, self.total, self._cluster_move_servers)

    def _greedy(
        self, servers: list[int], cnt: list[int], mover: Callable[[int, int], bool]
    ) -> None:
        active = set(servers)
        while len(active) >= 2 and self.budget_left():
            src = max(active, key=lambda i: (cnt[i], self.total[i]))
            dsts = sorted(active, key=lambda i: (cnt[i], self.total[i]))
            moved = False
            for d in dsts:
                if cnt[src] - cnt[d] < 2:
                    break
                if mover(src, d):
                    moved = True
                    break
            if not moved:
                active.discard(src)

    def _table_move_servers(self, t: int, s: int, d: int) -> bool:
        return self._try_move(t, [s], [d], "table balance within location")

    def _cluster_move_servers(self, s: int, d: int) -> bool:
        order = sorted(
            range(len(self.tables)), key=lambda t: self.cnt[t][d] - self.cnt[t][s]
        )
        for t in order:
            if self.cnt[t][s] <= self.cnt[t][d]:
                break
            if self._try_move(t, [s], [d], "cluster balance within location"):
                return True
        return False


def plan_rebalance(
    snapshot: ClusterSnapshot,
    rng: random.Random,
    *,
    max_moves: int | None = None,
    fix_policy: bool = True,
    balance: bool = True,
) -> RebalancePlan:
    """Plan moves that fix violations (stage 1) and then balance (stage 2)."""
    planner = _Planner(snapshot, rng)
    planner.max_moves = max_moves
    if fix_policy:
        planner.fix_violations()
    if balance:
        for t in range(len(planner.tables)):
            planner.balance_table_across_locations(t)
        planner.balance_cluster_across_locations()
        for k in range(len(planner.loc_names)):
            planner.balance_within_location(k)
    moves = tuple(planner.moves)
    after = apply_moves(snapshot, moves)
    report = RebalanceReport(
        loads_before=location_loads(snapshot),
        loads_after=location_loads(after),
        violations_before=tuple(_violations(snapshot)),
        violations_after=tuple(_violations(after)),
        skew_before=skews(snapshot),
        skew_after=skews(after),
        moves_by_reason=dict(Counter(m.reason for m in moves)),
    )
    return RebalancePlan(moves, report)


def _violations(snapshot: ClusterSnapshot) -> list[Violation]:
    placer = Placer(snapshot, random.Random(0))
    return [v for tablet in snapshot.tablets for v in placer.violations(tablet)]


def apply_moves(snapshot: ClusterSnapshot, moves: Iterable[ReplicaMove]) -> ClusterSnapshot:
    """The snapshot after every move completed (the source's role goes to the target; a
    moved leader's tablet elects the first remaining voter)."""
    by_tablet: dict[str, list[ReplicaMove]] = {}
    for m in moves:
        by_tablet.setdefault(m.tablet_id, []).append(m)
    if not by_tablet:
        return snapshot
    tablets = []
    for tablet in snapshot.tablets:
        todo = by_tablet.get(tablet.tablet_id)
        if todo:
            reps = list(tablet.replicas)
            for m in todo:
                k = next((j for j, r in enumerate(reps) if r.ts_uuid == m.from_uuid), -1)
                if k < 0 or any(r.ts_uuid == m.to_uuid for r in reps):
                    raise IllegalStateError(
                        f"cannot move tablet {m.tablet_id} from {m.from_uuid} to {m.to_uuid}: "
                        "its replicas changed since the plan was made; plan again"
                    )
                old = reps[k]
                reps[k] = Replica(m.to_uuid, old.role)
                if old.is_leader:
                    voters = [j for j, r in enumerate(reps) if r.role is ReplicaRole.VOTER]
                    voter = next((j for j in voters if j != k), k)
                    reps[voter] = replace(reps[voter], is_leader=True)
            tablet = replace(tablet, replicas=tuple(reps))
        tablets.append(tablet)
    return snapshot.with_tablets(tablets)
