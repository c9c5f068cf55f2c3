"""A cluster simulator for placement, re-replication and rebalancing at any scale.

It drives the same pure functions the master uses (:mod:`.placement`,
:mod:`.rebalancer`) over an evolving :class:`~.topology.ClusterSnapshot`:

* :func:`build_servers` makes a topology such as 3 DCs x 10 racks x 30 servers;
* :class:`Simulation` creates tables, fails and restores a server / rack / DC,
  re-replicates (add a replica elsewhere, then evict the dead one: 3-4-3), rebalances, and
  records policy compliance, under-replication and skew after every step;
* :func:`render_png` draws replicas per location before/after and the timeline;
* :func:`rack_loss_story` is the issue's key story: a rack is lost, its replicas are
  re-created in the surviving racks (best effort: the policy is knowingly violated to keep
  full replication), the rack returns, and the rebalancer restores full compliance.

Thread-safety: :class:`Simulation` is not thread-safe; the functions are pure apart from
writing the PNG.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark_kudu.errors import NotFoundError
from pyspark_kudu.master.placement import Placer
from pyspark_kudu.master.rebalancer import RebalancePlan, apply_moves, plan_rebalance, skews
from pyspark_kudu.master.topology import (
    ClusterSnapshot,
    PlacementConfig,
    Replica,
    ReplicaRole,
    Table,
    TableConstraint,
    Tablet,
    TabletServer,
    is_under,
)

__all__ = ["Simulation", "Step", "StoryResult", "build_servers", "rack_loss_story", "render_png"]


def build_servers(
    shape: Sequence[int], servers_per_location: int, names: Sequence[str] = ("dc", "rack")
) -> list[TabletServer]:
    """Servers for a regular hierarchy: ``shape=(3, 10)`` with 30 per location gives
    ``/dc0/rack0`` ... ``/dc2/rack9``, 900 servers; ``shape=(50,)`` gives ``/dc0``...``/dc49``."""
    paths = [""]
    for depth, count in enumerate(shape):
        name = names[depth] if depth < len(names) else f"l{depth}"
        paths = [f"{p}/{name}{k}" for p in paths for k in range(count)]
    return [
        TabletServer(f"ts{p.replace('/', '-')}-{k}", f"host{p.replace('/', '-')}-{k}", location=p)
        for p in paths
        for k in range(servers_per_location)
    ]


@dataclass(frozen=True)
class Step:
    """The cluster's state after one simulation step."""

    step: int
    event: str
    live_servers: int
    tablets: int
    under_replicated: int
    unavailable: int
    violating: int
    unfixable: int
    cluster_skew: float
    table_skew: float
    moves: int = 0


class Simulation:
    """An evolving cluster. Not thread-safe."""

    def __init__(self, snapshot: ClusterSnapshot, rng: random.Random) -> None:
        self.rng = rng
        self._servers = {ts.uuid: ts for ts in snapshot.tservers}
        self._tables = {t.table_id: t for t in snapshot.tables}
        self._tablets = {t.tablet_id: t for t in snapshot.tablets}
        self._config = snapshot.config
        self.timeline: list[Step] = []
        self._record("start")

    @property
    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            tuple(self._servers.values()),
            tuple(self._tables.values()),
            tuple(self._tablets.values()),
            self._config,
        )

    # --- events --------------------------------------------------------------------------

    def create_table(
        self,
        name: str,
        num_tablets: int,
        rf: int = 3,
        constraint: TableConstraint | None = None,
    ) -> Table:
        table = Table(name, name, rf, constraint)
        self._tables[name] = table
        placer = Placer(self.snapshot, self.rng)
        for k in range(num_tablets):
            uuids = placer.place_new(table)
            tid = f"{name}-{k}"
            self._tablets[tid] = Tablet(
                tid, name, tuple(Replica(u, is_leader=j == 0) for j, u in enumerate(uuids))
            )
        self._record(f"create table {name} ({num_tablets} tablets, RF {rf})")
        return table

    def fail(self, target: str) -> int:
        """Mark a server (uuid) or every server under a location prefix dead."""
        return self._set_live(target, False, "fail")

    def restore(self, target: str) -> int:
        """Bring a server or location back (empty: its evicted replicas are gone)."""
        return self._set_live(target, True, "restore")

    def _set_live(self, target: str, live: bool, verb: str) -> int:
        hit = [
            ts for ts in self._servers.values()
            if ts.uuid == target or (target.startswith("/") and is_under(ts.location, target))
        ]
        if not hit:
            raise NotFoundError(f"no tablet server or location {target!r} in the simulation")
        for ts in hit:
            self._servers[ts.uuid] = replace(ts, live=live)
        self._record(f"{verb} {target} ({len(hit)} servers)")
        return len(hit)

    def re_replicate(self) -> int:
        """Replace every replica on a dead server, and top up short tablets.

        The new replica is placed first (re-replication placement), then the dead one is
        evicted; if no server may take it (forced awareness, constraint) the dead replica
        stays in the config and the tablet stays under-replicated.
        """
        snap = self.snapshot
        placer = Placer(snap, self.rng)
        live = {u for u, ts in self._servers.items() if ts.live}
        added = 0
        for tid, tablet in list(self._tablets.items()):
            table = self._tables[tablet.table_id]
            reps = list(tablet.replicas)
            dead = [r for r in reps if r.ts_uuid not in live]
            missing = table.replication_factor - len(reps)
            for gone in [*dead, *([None] * max(0, missing))]:
                healthy = [r.ts_uuid for r in reps if r.ts_uuid in live]
                target = placer.place_extra(table, healthy)
                if target is None:
                    break
                added += 1
                reps.append(Replica(target))
                if gone is not None:
                    reps.remove(gone)
                    placer.apply_remove(gone.ts_uuid, table.table_id)
            if reps != list(tablet.replicas):
                if not any(r.is_leader for r in reps):
                    voter = next(i for i, r in enumerate(reps) if r.role is ReplicaRole.VOTER)
                    reps[voter] = replace(reps[voter], is_leader=True)
                self._tablets[tid] = replace(tablet, replicas=tuple(reps))
        self._record(f"re-replicate ({added} replicas added)")
        return added

    def rebalance(self, max_moves: int | None = None) -> RebalancePlan:
        """Plan with the rebalancer and apply every move."""
        plan = plan_rebalance(self.snapshot, self.rng, max_moves=max_moves)
        after = apply_moves(self.snapshot, plan.moves)
        self._tablets = {t.tablet_id: t for t in after.tablets}
        self._record(f"rebalance ({len(plan.moves)} moves)", len(plan.moves))
        return plan

    # --- observation ---------------------------------------------------------------------

    def replicas_per_location(self) -> dict[str, int]:
        """Replicas on live servers, per location (every known location listed)."""
        counts: Counter[str] = Counter()
        for tablet in self._tablets.values():
            for u in tablet.ts_uuids:
                ts = self._servers.get(u)
                if ts is not None and ts.live:
                    counts[ts.location or ""] += 1
        return {loc: counts.get(loc, 0) for loc in sorted({ts.location or "" for ts in
                                                             self._servers.values()})}

    def _record(self, event: str, moves: int = 0) -> None:
        snap = self.snapshot
        placer = Placer(snap, random.Random(0))
        live = {u for u, ts in self._servers.items() if ts.live}
        under = unavailable = violating = unfixable = 0
        for tablet in snap.tablets:
            rf = self._tables[tablet.table_id].replication_factor
            alive = sum(1 for r in tablet.voters if r.ts_uuid in live)
            under += alive < rf
            unavailable += alive < rf // 2 + 1
            found = placer.violations(tablet)
            violating += bool(found)
            unfixable += bool(found) and not all(v.avoidable for v in found)
        sk = skews(snap)
        self.timeline.append(
            Step(len(self.timeline), event, len(live), len(snap.tablets), under, unavailable,
                 violating, unfixable, sk["cluster"], sk["table"], moves)
        )


def render_png(
    path: str | Path,
    before: Mapping[str, int],
    after: Mapping[str, int],
    timeline: Sequence[Step] = (),
    title: str = "Replicas per location",
    during: Mapping[str, int] | None = None,
) -> Path:
    """Bar chart of replicas per location before/after (and ``during`` a failure, if
    given), plus the timeline of violations and under-replication if given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = 2 if timeline else 1
    fig, axes = plt.subplots(rows, 1, figsize=(max(8.0, 0.25 * len(before)), 4.5 * rows),
                             squeeze=False)
    ax = axes[0][0]
    locs = sorted(set(before) | set(after))
    xs = range(len(locs))
    series = [("before", before), *([("during failure", during)] if during else []),
              ("after", after)]
    width = 0.8 / len(series)
    for n, (label, data) in enumerate(series):
        offset = (n - (len(series) - 1) / 2) * width
        ax.bar([x + offset for x in xs], [data.get(k, 0) for k in locs], width, label=label)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(locs, rotation=90, fontsize=6)
    ax.set_ylabel("replicas on live servers")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    if timeline:
        ax2 = axes[1][0]
        steps = [s.step for s in timeline]
        ax2.plot(steps, [s.violating for s in timeline], marker="o", label="violating tablets")
        ax2.plot(steps, [s.under_replicated for s in timeline], marker="s",
                 label="under-replicated tablets")
        ax2.set_xticks(steps)
        ax2.set_xticklabels([s.event.split(" (")[0] for s in timeline], rotation=30,
                            fontsize=7, ha="right")
        ax2.set_ylabel("tablets")
        ax2.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


@dataclass(frozen=True)
class StoryResult:
    timeline: tuple[Step, ...]
    before: Mapping[str, int]
    during: Mapping[str, int]
    after: Mapping[str, int]


def rack_loss_story(
    shape: Sequence[int] = (3,),
    servers_per_rack: int = 10,
    tablets: int = 600,
    *,
    lost: str | None = None,
    config: PlacementConfig | None = None,
    seed: int = 0,
    png: str | Path | None = None,
) -> StoryResult:
    """Lose a rack (default: the first), re-replicate, bring it back, rebalance.

    The default 3 racks make the loss force a knowing violation (two of three replicas
    in one surviving rack); with ``shape=(3, 10)`` and ``lost="/dc0"`` a whole datacenter
    goes. Optionally draws the PNG.
    """
    names = ("rack",) if len(shape) == 1 else ("dc", "rack")
    servers = build_servers(shape, servers_per_rack, names)
    sim = Simulation(ClusterSnapshot(tuple(servers), config=config or PlacementConfig()),
                     random.Random(seed))
    sim.create_table("t", tablets)
    before = sim.replicas_per_location()
    target = lost or (servers[0].location or "")
    sim.fail(target)
    sim.re_replicate()
    during = sim.replicas_per_location()
    sim.restore(target)
    sim.rebalance()
    after = sim.replicas_per_location()
    if png is not None:
        render_png(png, before, after, sim.timeline,
                   f"Loss and return of {target}: replicas per location", during)
    return StoryResult(tuple(sim.timeline), before, during, after)
